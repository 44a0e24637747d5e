// The keys of the PPO family: advantage estimators, the KL penalty, the policy loss
// (actor.eps_clip ...), off-policy steps and rollout correction, dynamic sampling, the
// critic's value clip and evaluation (eval.*); which roles a ppo job uses.
#pragma once

#include "core/spec_schema.h"

namespace rlhf::ppo {

SpecSection spec_section();

}  // namespace rlhf::ppo
