// What one decoder layer is made of. Its model family decides it from the config
// (models/family.h), layer by layer; the decoder layer, the parameter layout and through it
// the loader and the planner read this, never a family's config flags.
#pragma once

#include <cstdint>

namespace rlhf::models {

struct ModelConfig;

// The gated MLP's activation: down(act(gate(x)) * up(x)).
enum class Activation {
  kSilu,      // Llama, Mistral, Qwen: silu
  kGeluTanh,  // Gemma: gelu with the tanh approximation (transformers' gelu_pytorch_tanh)
};

struct LayerSpec {
  bool qkv_bias = false;     // biases on the q, k and v projections
  bool o_proj_bias = false;  // a bias on the output projection
  bool mlp_bias = false;     // biases on gate, up and down
  bool qk_norm = false;      // an RMSNorm [head_dim] on every q and k head before RoPE
  Activation activation = Activation::kSilu;
  // Every RMSNorm of the layer scales by (1 + weight), in FP32, before rounding (Gemma's
  // Gemma3RMSNorm; its weights start at 0). Llama's scales by weight after rounding.
  bool norm_unit_offset = false;
  // Gemma: four norms, x + post_attention(attn(input(x))), then h + post_feedforward(mlp(
  // pre_feedforward(h))). Otherwise Llama's two: post_attention_layernorm is the pre-MLP norm.
  bool sandwich_norms = false;
  // The layer attends through the model's local pattern (Gemma 3's sliding layers): keys
  // within ModelConfig::local_window positions, RoPE with base rope_local_theta and no
  // scaling. Otherwise the config's own: sliding_window (0: every key), rope_theta and
  // rope_scaling.
  bool local_attention = false;
  // The q.k scale; 0: 1 / sqrt(head_dim). Gemma 3: query_pre_attn_scalar^-0.5.
  double attention_scale = 0;
};

// Layer `layer` (0-based) of a model of this config, as its family builds it.
LayerSpec layer_spec(const ModelConfig& config, int64_t layer);

// The window (in keys) layer `layer` attends within; 0 for every key.
int64_t layer_window(const ModelConfig& config, int64_t layer);

// Whether some layer attends through the local pattern (needs its own mask and RoPE tables).
bool has_local_layers(const ModelConfig& config);

// The shortest window any layer attends within; 0 when every layer sees every key.
int64_t shortest_window(const ModelConfig& config);

}  // namespace rlhf::models
