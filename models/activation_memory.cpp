// What the model's forwards and backwards hold, counted from the tensors the code keeps
// (decoder_layer.cpp, log_probs.cpp): the memory planner's activation terms, beside the layers
// they cost (bench_memory_plan measures them against the allocator).
#include "models/activation_memory.h"

#include <algorithm>

#include "models/decoder_layer.h"
#include "models/layer_spec.h"

namespace rlhf::models {

namespace {

// A mixture-of-experts block per token (models/moe.cpp): the router's logits (e) and FP32
// probabilities over E experts, the top-k weights (FP32, 8 k with their renormalised copy);
// for each of its k experts the gathered input row (H), the expert's 4 I_e as a dense MLP's,
// its output and the weighted output (2 H); the shared expert's 4 I_s, its output and its
// gate's sigmoid.
int64_t moe_saved_per_token(const models::ModelConfig& c, const MoeSpec& moe, int64_t e) {
  const int64_t H = c.hidden_size;
  int64_t bytes =
      (e + 4) * moe.experts + 8 * moe.top_k + moe.top_k * e * (3 * H + 4 * moe.intermediate);
  if (moe.shared_intermediate > 0) bytes += e * (4 * moe.shared_intermediate + H + 2);
  return bytes;
}

// The widest MLP of any layer, in rows a token's forward holds at once: the dense
// intermediate_size, an expert's (at worst every token routes to one expert) or the shared
// expert's.
int64_t widest_mlp(const models::ModelConfig& c) {
  int64_t widest = 0;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const MoeSpec moe = layer_spec(c, i).moe;
    widest = std::max(widest, moe.sparse() ? std::max(moe.intermediate, moe.shared_intermediate)
                                           : c.intermediate_size);
  }
  return widest;
}

}  // namespace

// Bytes autograd keeps for backward in one decoder layer (models/decoder_layer.cpp), for
// B sequences of T tokens with e-byte activations:
//   two RMSNorms (four with Gemma's sandwich norms): the FP32 copy of x and the e-dtype
//     normalized output (4H + eH each);
//   attention: q, rotate_half(q), rotated q, k, rotate_half(k), the K^T copy matmul makes,
//     V (repeated to the query heads), the attention output before o_proj: 6 q + 2 kv;
//   softmax: its FP32 output and the e-dtype probs PV reads: (4 + e) x heads x T x T;
//   MLP: gate, silu(gate), up, and their product: 4 I; a mixture-of-experts block
//     (moe_saved_per_token) instead on a sparse layer; the largest layer counts.
int64_t layer_saved_bytes(const models::ModelConfig& c, int64_t B, int64_t T, int64_t e) {
  const int64_t H = c.hidden_size, q = c.num_attention_heads * c.head_dim,
                kv = c.num_key_value_heads * c.head_dim;
  const int64_t norms = layer_spec(c, 0).sandwich_norms ? 4 : 2;
  int64_t mlp = 0;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const MoeSpec moe = layer_spec(c, i).moe;
    mlp =
        std::max(mlp, moe.sparse() ? moe_saved_per_token(c, moe, e) : e * 4 * c.intermediate_size);
  }
  const int64_t per_token = norms * (4 * H + e * H) + e * (6 * q + 2 * kv) + mlp;
  return B * T * per_token + B * c.num_attention_heads * T * T * (4 + e);
}

// Tensors every layer shares in one forward: the FP32 additive mask [B, 1, T, T] and the
// rotary tables cos, sin [B, T, D]; twice over for a model with local layers (their own
// mask and tables: models::LayerInputs).
namespace {

int64_t div_up(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

int64_t attention_patterns(const models::ModelConfig& c) {
  return models::has_local_layers(c) ? 2 : 1;
}

int64_t shared_forward_bytes(const models::ModelConfig& c, int64_t B, int64_t T, int64_t e) {
  return attention_patterns(c) * (4 * B * T * T + 2 * B * T * c.head_dim * e);
}

// On a GPU the layers of a forward without a cache share what selects the attended keys: a
// bool mask [B, 1, T, T], or, where models::CausalLM takes flash attention's varlen path (a
// 16-bit compute dtype, head_dim a multiple of 8 up to 256, no sliding window shorter than T:
// CausalLM::uses_varlen_attention), the real tokens' int64 index [B * T] instead. A forward
// over a KV cache (the rollout's prefill) always has the mask. (From the code; not yet
// checked against the allocator on a GPU.)
int64_t gpu_mask_bytes(const models::ModelConfig& c, int64_t B, int64_t T, int64_t e, bool cached) {
  const int64_t window = models::shortest_window(c);
  const bool varlen =
      !cached && e == 2 && c.head_dim % 8 == 0 && c.head_dim <= 256 && (window <= 0 || window >= T);
  return varlen ? 8 * B * T : attention_patterns(c) * B * T * T;
}

}  // namespace

// A forward without autograd: the largest live set is one layer's attention (scores in e,
// their FP32 copy + mask, softmax FP32, probs in e) and its MLP intermediates. On a GPU,
// SDPA's fused kernels (flash / memory-efficient) never hold the [B, heads, T, T] scores:
// a bool mask [B, 1, T, T] (padded batches) and the rotary tables are what remains shared.
//
// The MLP's gate, up and product [tokens, I] exist for one chunk of at most
// kInferenceMlpChunkTokens tokens at a time (models/decoder_layer.cpp).
int64_t inference_bytes(const models::ModelConfig& c, int64_t B, int64_t T, int64_t e,
                        DeviceKind kind, bool cached) {
  const int64_t mlp_tokens = std::min(B * T, kInferenceMlpChunkTokens);
  const int64_t router = c.moe.num_experts * (e + 4);  // per token: logits and FP32 probs
  const int64_t hidden =
      (B * T * 4 * c.hidden_size + mlp_tokens * 3 * widest_mlp(c)) * e + B * T * router;
  if (kind == DeviceKind::kCuda)
    return gpu_mask_bytes(c, B, T, e, cached) + attention_patterns(c) * 2 * B * T * c.head_dim * e +
           hidden;
  const int64_t attention = B * c.num_attention_heads * T * T * (2 * e + 8);
  return shared_forward_bytes(c, B, T, e) + attention + hidden;
}

// Training forward + backward of one micro batch (what the autograd graph holds at its
// peak, in backward). Without checkpointing every layer's saved tensors are alive when
// backward starts; with checkpointing each layer keeps only its input [B, T, H] and backward
// recomputes one layer at a time (its saved tensors). Either way one layer's backward is in
// flight: gradients as large as its saved tensors, plus the softmax backward's FP32 buffers
// and e-dtype score gradients, (8 + 2e) x heads x T x T (bench_memory_plan measures the
// whole: within 10% at T = 128..512 on the 100m preset).
//
// On a GPU, SDPA runs the fused kernels (flash, or memory-efficient with a mask): no
// [heads, T, T] scores are saved or built in backward; each layer saves its FP32 log-sum-exp
// [B, heads, T] instead, and the layers share the mask (gpu_mask_bytes) and the rotary tables.
// (Planned from the kernels' definitions; not yet checked against the allocator on a GPU.)
int64_t training_bytes(const models::ModelConfig& c, int64_t B, int64_t T, int64_t e,
                       bool checkpointing, DeviceKind kind) {
  const int64_t scores = B * c.num_attention_heads * T * T;
  const bool fused = kind == DeviceKind::kCuda;
  const int64_t layer = layer_saved_bytes(c, B, T, e) -
                        (fused ? scores * (4 + e) - 4 * B * c.num_attention_heads * T : 0);
  const int64_t in_flight = layer + (fused ? 0 : scores * (8 + 2 * e));
  const int64_t head_norm = B * T * (4 + e) * c.hidden_size;
  const int64_t shared = (fused ? gpu_mask_bytes(c, B, T, e, false) +
                                      attention_patterns(c) * 2 * B * T * c.head_dim * e
                                : shared_forward_bytes(c, B, T, e)) +
                         head_norm;
  if (!checkpointing) return c.num_hidden_layers * layer + in_flight + shared;
  return c.num_hidden_layers * B * T * c.hidden_size * e + layer + in_flight + shared;
}

// models/log_probs.cpp: the LM head's log-probs of B x `positions` tokens.
// train.logits_chunk_tokens c > 0 (the default): the tokens flattened and split into k =
// ceil(N / c) balanced chunks of n = ceil(N / k); per chunk the logits [n, V] in e and their
// FP32 log-sum-exp / softmax: n V (4 + e') bytes, e' = 0 in FP32 (no copy) or 2 in BF16.
// Backward recomputes each chunk's logits and adds the head's [V, H] gradient into an FP32
// sum when there are several chunks (V H (4 + e')), else builds it once in e (V H e).
// c = 0: the older path, chunks of `chunk_positions` positions over all B rows at once: 8
// bytes per [B, n, V] element at the peak, the head's gradient in e and, with several
// chunks, an FP32 [V, H] buffer.
int64_t log_prob_bytes(const models::ModelConfig& c, int64_t B, int64_t positions,
                       int64_t chunk_positions, int64_t chunk_tokens, int64_t e, bool backward) {
  positions = std::max<int64_t>(1, positions);
  const int64_t V = c.vocab_size, H = c.hidden_size;
  if (chunk_tokens > 0) {
    const int64_t N = B * positions, k = div_up(N, chunk_tokens), n = div_up(N, k);
    const int64_t wide = 4 + (e == 4 ? 0 : 2);
    const int64_t forward = n * V * wide;
    if (!backward) return forward;
    return forward + (k > 1 ? V * H * wide : V * H * e);
  }
  const int64_t n = std::min(chunk_positions, positions);
  int64_t bytes = B * n * V * 8;
  if (!backward) return bytes;
  bytes += V * H * e;
  if (positions > chunk_positions) bytes += V * H * 4;
  return bytes;
}

}  // namespace rlhf::models
