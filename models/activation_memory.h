// Activation bytes of the model's forwards and backwards, for B sequences of T tokens with
// e-byte activations, counted from the tensors models/ keeps (decoder_layer.cpp,
// log_probs.cpp). The memory planner (engine/memory_plan.cpp) adds them to its phases.
#pragma once

#include <cstdint>

#include "core/placement.h"
#include "models/config.h"

namespace rlhf::models {

// What autograd keeps for backward in one decoder layer.
int64_t layer_saved_bytes(const ModelConfig& c, int64_t B, int64_t T, int64_t e);
// A forward without autograd; `cached`: over a KV cache (the rollout's prefill).
int64_t inference_bytes(const ModelConfig& c, int64_t B, int64_t T, int64_t e,
                        DeviceKind kind = DeviceKind::kCpu, bool cached = false);
// A training forward + backward of one micro batch, at its peak (in backward).
int64_t training_bytes(const ModelConfig& c, int64_t B, int64_t T, int64_t e, bool checkpointing,
                       DeviceKind kind = DeviceKind::kCpu);
// The LM head's log-probs of B x `positions` tokens (log_probs.cpp), with or without backward.
int64_t log_prob_bytes(const ModelConfig& c, int64_t B, int64_t positions, int64_t chunk_positions,
                       int64_t chunk_tokens, int64_t e, bool backward);

}  // namespace rlhf::models
