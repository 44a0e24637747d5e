// Operations of a rollout worker: `load_model` (a checkpoint directory or a preset, plus the
// generation settings), `generate` (prompts in, GenerationOutput tensors out) and
// `sync_weights` (join the actor -> rollout collective group once, then receive one sync).
// The weights and their version live here between requests; the driver decides when to sync.
#pragma once

#include "actors/operation_registry.h"

namespace rlhf {

// Registers the three operations; they share one model per worker process.
void add_rollout_operations(OperationRegistry& registry);

}  // namespace rlhf
