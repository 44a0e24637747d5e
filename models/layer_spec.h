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

// A sparse mixture-of-experts block in place of the dense MLP (models/moe.h): a router
// (a linear map [experts, H] with no bias) scores each token, its top_k experts (each a gated
// MLP of `intermediate` rows) run on it and their outputs are summed, weighted by the router.
// What differs between families is data here, so the next family is a few fields, not a new
// block: DeepSeek-V3's sigmoid scores with a bias-corrected, group-limited top-k would add a
// `scoring` and two group sizes (docs/models.md says what it would take).
struct MoeSpec {
  int64_t experts = 0;       // 0: this layer's MLP is dense
  int64_t top_k = 0;         // experts per token
  int64_t intermediate = 0;  // each expert's intermediate size
  // The top-k softmax probabilities renormalised to sum to 1 (Qwen's norm_topk_prob; Mixtral
  // always); otherwise the softmax over all experts as it is.
  bool norm_topk = false;
  // The routing weights stay FP32 when they scale an expert's output, which is rounded after
  // (Mixtral); otherwise they are rounded to the compute dtype first (Qwen).
  bool fp32_weights = false;
  // A shared expert (Qwen2-MoE): a gated MLP of this many rows on every token, its output
  // scaled by sigmoid(shared_expert_gate(x)) and added. 0: none.
  int64_t shared_intermediate = 0;
  // Parameter names: Qwen's "mlp.gate", "mlp.experts.N.{gate,up,down}_proj"; Mixtral's
  // "block_sparse_moe.gate", "block_sparse_moe.experts.N.{w1,w3,w2}".
  bool mixtral_names = false;
  bool sparse() const { return experts > 0; }
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
  // A mixture-of-experts block instead of the dense MLP when moe.sparse().
  MoeSpec moe;
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
