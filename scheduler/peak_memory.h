// The `memory` record every driver writes to metrics.jsonl: per role, per rank, the peak
// memory the worker measured (peak RSS from `info`; the trainer's accounted peak tensor
// bytes from `memory` on model roles). `rlhf plan --check` reads it beside plan.json.
#pragma once

#include <nlohmann/json.hpp>

namespace rlhf {

class Scheduler;

// {"actor": [{"rank": 0, "device": "cpu:0", "peak_rss_bytes": N, "peak_tensor_bytes": M}, ...],
//  ...}; rollout ranks have no peak_tensor_bytes.
nlohmann::json peak_memory_by_role(Scheduler& scheduler);

}  // namespace rlhf
