// Operations of a rollout worker: `load_model` (a checkpoint directory or a preset, plus the
// generation settings), `generate` (prompts in, GenerationOutput tensors out) and
// `sync_weights` (join the actor -> rollout collective group once, then receive one sync),
// `sleep` / `wake_up` (the weights to host memory while a colocated trainer has the GPU, and
// back). The weights and their version live here between requests; the driver decides when
// to sync and when to sleep.
#pragma once

#include "actors/operation_registry.h"

namespace rlhf {

// Registers the operations; they share one model per worker process.
// The exit code of a rollout worker whose environment's Python interpreter died mid-generate.
inline constexpr int kEnvironmentLostExit = 75;

void add_rollout_operations(OperationRegistry& registry);

}  // namespace rlhf
