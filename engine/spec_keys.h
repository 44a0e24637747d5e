// The keys of the roles that hold models (actor, critic, reward, ref: model, devices, dtype,
// ZeRO stage, AdamW, LoRA), of the training loop (train.*) and of checkpoints (ckpt.*).
#pragma once

#include <nlohmann/json.hpp>

#include "core/spec_schema.h"

namespace rlhf::engine {

SpecSection spec_section();

// A LoRA actor on the reference's model is its own reference (adapters off): no ref group
// (issue 30.2; ppo and the dpo family alike).
bool actor_is_reference(const nlohmann::json& resolved);

}  // namespace rlhf::engine
