// The offline job drivers: dpo (DPO family, with the reference model on its own group and
// its log-probs cached in the run directory), sft and rm. Each pass over the data is a
// sequence of global batches; the trained group (actor, or reward for rm) takes one
// optimizer step per batch. Held-out evaluation before and after training; metrics in
// <run_dir>/metrics.jsonl; checkpoints and --resume as the PPO driver. Talks to workers
// only through the scheduler's role-group handles.
#pragma once

#include "core/spec.h"
#include "scheduler/smoke_driver.h"

namespace rlhf::dpo {

struct OfflineDriverOptions {
  bool resume = false;  // continue from the newest complete checkpoint under ckpt.path
};

// The driver for `spec` (a validated dpo, sft or rm job). Reads and tokenizes the data
// here, so a bad dataset or tokenizer throws InputError before any worker starts.
JobDriver offline_driver(const JobSpec& spec, OfflineDriverOptions options = {});

}  // namespace rlhf::dpo
