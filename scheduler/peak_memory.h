// The `memory` record every driver writes to metrics.jsonl: per role, per rank, the peak
// memory the worker measured (peak RSS from `info`; the trainer's accounted peak tensor
// bytes from `memory` on model roles). `rlhf plan --check` reads it beside plan.json.
#pragma once

#include <nlohmann/json.hpp>

namespace rlhf {

class Scheduler;

// {"actor": [{"rank": 0, "device": "cpu:0", "peak_rss_bytes": N, "peak_tensor_bytes": M,
//              "planned_total_bytes": P, "planned_tensor_bytes": Q}, ...], ...}.
// Model ranks also carry "tensor_phases": {op: {"peak_tensor_bytes": N}}, the tracked peak
// of each operation (GPU ranks "cuda_phases" as well). Rollout ranks have no tensor figures. The
// planned figures come from `planned_roles` (engine::planned_roles of the run: what `rlhf plan`
// predicted) and are left out when it is null or lacks the role.
nlohmann::json peak_memory_by_role(Scheduler& scheduler,
                                   const nlohmann::json& planned_roles = nullptr);

}  // namespace rlhf
