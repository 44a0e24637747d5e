// The train operations of a model worker: `train_actor` (the PPO policy loss with its KL,
// load-balancing and GKD terms) and `train_critic` (the value loss), one optimizer step each
// over this rank's rows (requests and replies: ppo/worker_ops.h).
#pragma once

#include <memory>

#include "actors/model_operations.h"
#include "actors/operation_registry.h"

namespace rlhf {

// Registers train_actor and train_critic on the shared ModelRole (`init` builds its trainer).
void add_train_operations(OperationRegistry& registry, const std::shared_ptr<ModelRole>& role);

}  // namespace rlhf
