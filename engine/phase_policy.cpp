#include "engine/phase_policy.h"

namespace rlhf::engine {

PhaseSettings PhaseSettings::from_spec(const JobSpec& spec) {
  PhaseSettings s;
  s.rollout_colocated_with_actor = spec.get_string("rollout.colocate_with") == "actor";
  s.async = spec.get_int("algo.max_staleness") > 0;
  s.rollout_offload_while_training = spec.get_bool("rollout.offload_while_training");
  s.actor_offload_optimizer_while_generating =
      spec.get_bool("actor.offload_optimizer_while_generating");
  s.actor_adam_offload = spec.get_bool("actor.adam_offload");
  return s;
}

PhasePolicy phase_policy(const PhaseSettings& s, bool rollout_on_gpu) {
  PhasePolicy p;
  p.takes_turns = s.rollout_colocated_with_actor && rollout_on_gpu && !s.async;
  p.rollout_sleeps = p.takes_turns && s.rollout_offload_while_training;
  p.actor_offloads_optimizer =
      p.takes_turns && s.actor_offload_optimizer_while_generating && !s.actor_adam_offload;
  return p;
}

}  // namespace rlhf::engine
