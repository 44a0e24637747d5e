// What one decoder layer is made of. Its model family decides it from the config
// (models/family.h), layer by layer; the decoder layer, the parameter layout and through it
// the loader and the planner read this, never a family's config flags.
#pragma once

#include <cstdint>

namespace rlhf::models {

struct ModelConfig;

struct LayerSpec {
  bool qkv_bias = false;     // biases on the q, k and v projections
  bool o_proj_bias = false;  // a bias on the output projection
  bool mlp_bias = false;     // biases on gate, up and down
  bool qk_norm = false;      // an RMSNorm [head_dim] on every q and k head before RoPE
};

// Layer `layer` (0-based) of a model of this config, as its family builds it.
LayerSpec layer_spec(const ModelConfig& config, int64_t layer);

}  // namespace rlhf::models
