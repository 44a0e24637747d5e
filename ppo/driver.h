// The PPO-family job driver (PPO, GRPO, RLOO, REINFORCE++, Dr. GRPO): per step, prompts go
// to the rollout group; the samples fan out concurrently to the actor (old log-probs), the
// reference (reference log-probs), the critic (values) and the reward source; advantages
// are computed here; the actor and critic train `train.max_epochs` passes in global batches;
// the actor's new weights go to the rollout group. Metrics go to <run_dir>/metrics.jsonl
// and a console line; checkpoints every ckpt.save_steps. Talks to workers only through the
// scheduler's role-group handles.
#pragma once

#include "core/spec.h"
#include "scheduler/smoke_driver.h"

namespace rlhf::ppo {

struct PpoDriverOptions {
  bool resume = false;  // continue from the newest complete checkpoint under ckpt.path
};

// The driver for `spec` (a validated ppo job). Throws InputError for a dataset, tokenizer
// or reward rule that cannot be used (before any worker work starts).
JobDriver ppo_driver(const JobSpec& spec, PpoDriverOptions options = {});

}  // namespace rlhf::ppo
