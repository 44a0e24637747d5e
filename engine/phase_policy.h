// Who gives way to whom when the rollout shares the actor's GPU (rollout.colocate_with actor):
// decided once, here, from the job's settings and where the roles run, and read by both the
// ppo driver (what it asks the workers to do between phases) and the memory planner (which
// terms each phase holds).
#pragma once

#include "core/spec.h"

namespace rlhf::engine {

// The settings the decision reads (rollout.colocate_with, algo.async_steps,
// rollout.offload_while_training, actor.offload_optimizer_while_generating,
// actor.adam_offload).
struct PhaseSettings {
  bool rollout_colocated_with_actor = false;
  bool async = false;  // algo.max_staleness > 0: generation overlaps training
  bool rollout_offload_while_training = true;
  bool actor_offload_optimizer_while_generating = false;
  bool actor_adam_offload = false;

  static PhaseSettings from_spec(const JobSpec& spec);
};

struct PhasePolicy {
  // The rollout shares the actor's GPU and the two alternate (generate, then train).
  bool takes_turns = false;
  // vLLM's sleep mode (level 1): the rollout's weights go to host memory outside generate.
  bool rollout_sleeps = false;
  // The actor's master weights, AdamW state and gradient shards go to host memory while the
  // rollout generates (unless actor.adam_offload keeps them there for good).
  bool actor_offloads_optimizer = false;
};

// `rollout_on_gpu`: the rollout's workers run on cuda devices. Only there do the two take
// turns: on cpu nodes host memory is the same memory, and with async steps they run at once.
PhasePolicy phase_policy(const PhaseSettings& settings, bool rollout_on_gpu);

}  // namespace rlhf::engine
