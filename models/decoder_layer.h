// The Llama decoder layer and its parts (RMSNorm, rotary embeddings, grouped-query
// attention, SwiGLU MLP), as modules whose parameter names match HF checkpoints. Does not
// own checkpointing or hooks: causal_lm.cpp wraps layers in those.
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <memory>
#include <optional>
#include <vector>

#include "models/config.h"
#include "models/layer_spec.h"
#include "models/linear.h"
#include "models/tensor_parallel.h"

namespace rlhf::models {

class KvStore;
class SparseMoeImpl;
struct ExpertParallel;

// The real tokens of a padded or packed [B, T] batch as variable-length sequences (one per
// packed segment, or per row), for a fused attention kernel that takes them without a mask
// (flash attention's varlen form): their flat positions in B * T, in order, and the segments'
// boundaries in that order.
struct VarlenSegments {
  torch::Tensor token_index;  // [N] int64: flat positions (b * T + t) of the real tokens
  torch::Tensor cu_seqlens;   // [segments + 1] int32: segment s is tokens [cu[s], cu[s + 1])
  int64_t max_len = 0;        // the longest segment
};

// Splits attention_mask [B, T] (0 = padding; k >= 1 = token of segment k, as
// attention_mask_tensor reads it) into its segments: the positions of one nonzero value within
// a row, in order, segments in the order they start. Tensors on `device`. One copy of the mask
// to the host.
VarlenSegments varlen_segments(const torch::Tensor& attention_mask, const torch::Device& device);

// What every layer of one forward shares: rotary tables and the attention mask.
struct AttentionInputs {
  torch::Tensor cos;  // [B, T, head_dim] compute dtype
  torch::Tensor sin;  // [B, T, head_dim] compute dtype
  // [B, 1, T, S] bool (true = attend), S = cached + T; nullopt when no key needs hiding
  // beyond causality (see set_attention_mask). An optional, not an undefined tensor: SDPA
  // and autograd::Function both take "no mask" only as nullopt.
  std::optional<torch::Tensor> mask;
  bool causal = false;  // without a mask: SDPA's is_causal (T == S)
  // Set instead of a mask on a GPU for a forward without a cache in 16 bits (training and
  // scoring of padded or packed batches): causal attention within each segment by flash
  // attention's variable-length kernel, no [B, 1, T, T] mask and no work on padding.
  std::optional<VarlenSegments> varlen;
};

// RoPE's inverse frequencies [head_dim / 2] FP32 on the CPU, following HF's default, linear
// and llama3 parameterisations; `local`: the local layers' (base rope_local_theta, default
// RoPE; LayerSpec::local_attention).
torch::Tensor inverse_frequencies(const ModelConfig& config, bool local = false);

// Builds cos/sin for position_ids [B, T] (FP32 math, then cast to `dtype`) from
// inv_freq (inverse_frequencies, on position_ids' device: a forward then copies nothing
// from the host, which a CUDA graph capture needs).
void rotary_tables(const torch::Tensor& inv_freq, const torch::Tensor& position_ids,
                   torch::Dtype dtype, torch::Tensor& cos, torch::Tensor& sin);

// The mask for queries at positions [past, past + T) over keys [0, past + T), from
// attention_mask [B, past + T] (0 = padding; 1 = token; k >= 1 = token of packed segment
// k): causal, padding keys hidden, a token sees only keys of its own segment, optional
// sliding window; each query always sees itself so no row is empty (rows of padding
// queries are garbage but finite, as in HF).
torch::Tensor attention_mask_tensor(const torch::Tensor& attention_mask, int64_t past, int64_t T,
                                    int64_t sliding_window);

// Fills in.mask / in.causal for one forward: no dense mask when every key is a plain token
// (no padding, no packed segments), no sliding window cuts in, and either there is no cache
// (is_causal) or one new token is decoded (every key visible), so SDPA's fused kernels run;
// else the bool mask of attention_mask_tensor. attention_mask may be undefined (all ones).
// `known_plain`: the caller knows every key is a plain token, which skips the one host sync
// that checks it (a decode loop on a GPU must not wait for the device every token).
void set_attention_mask(AttentionInputs& in, const torch::Tensor& attention_mask, int64_t past,
                        int64_t T, int64_t sliding_window, bool known_plain = false);

// The attention inputs of one forward for each pattern its layers attend by: the config's
// (`global`) and, for a model with local layers (LayerSpec::local_attention), `local`: its
// window's mask and its own RoPE tables.
struct LayerInputs {
  AttentionInputs global;
  std::optional<AttentionInputs> local;
  const AttentionInputs& of(const LayerSpec& spec) const {
    return spec.local_attention && local ? *local : global;
  }
};

class RMSNormImpl : public torch::nn::Module {
 public:
  // unit_offset: Gemma's norm, x_hat * (1 + weight) in FP32, then rounded; weights start at
  // 0. Otherwise Llama's: round(x_hat) * weight, weights start at 1.
  RMSNormImpl(int64_t hidden, double eps, Materialize how = Materialize::kAllocate,
              bool unit_offset = false);
  torch::Tensor forward(const torch::Tensor& x);  // [..., H] -> [..., H], statistics in FP32
  torch::Tensor weight;                           // [H]

 private:
  double eps_;
  bool unit_offset_;
};

// With a TensorParallel of size > 1 (the rollout's tensor parallelism), `config` is the
// rank's shard config (tensor_parallel_shard_config): q/k/v and gate/up hold this rank's
// heads and rows, o_proj and down_proj its columns, and their outputs are summed over the
// group; the per-head q/k norms (qwen3) act on head_dim, so each rank holds them whole.
// `tp` must outlive the module. `spec` is what this layer is made of (biases, q/k norms), as
// its family builds it (layer_spec()); `config` gives the sizes.
// Fused projections (issue 32.2): maps that read the same input run as one GEMM over their
// weights stacked along dim 0 ([q; k; v], [gate; up], with the biases likewise), registered
// as one parameter ("self_attn.qkv_proj.weight", "mlp.gate_up_proj.weight"). The part
// Linears stay, unregistered, as the HF-named homes of their LoRA adapters; their weight and
// bias are aliases of their rows of the fused tensors (kept so across to()), so a LoRA merge
// or a write through them lands in the fused tensor. On a tensor-parallel shard each rank
// stacks its own slices: [q_r; k_r; v_r].
struct FusedParts {
  Linear fused{nullptr};
  std::vector<Linear> parts;  // in stacking order
  // The fused map's output [..., sum of rows] split per part, each with its part's LoRA term.
  std::vector<torch::Tensor> forward(const torch::Tensor& x);
  // No part carries a LoRA adapter: the fused output alone is the parts' outputs side by side.
  bool plain() const;
  void bind();  // points each part's weight/bias at its rows of the fused tensors
};

class AttentionImpl : public torch::nn::Module {
 public:
  AttentionImpl(const ModelConfig& config, const LayerSpec& spec, Materialize how,
                const TensorParallel* tp = nullptr);
  // x: [B, T, H] -> [B, T, H]. With a cache, this step's keys/values are appended to layer
  // `layer_index` and attention runs over everything cached.
  torch::Tensor forward(const torch::Tensor& x, const AttentionInputs& in, KvStore* cache,
                        int64_t layer_index);
  // Replaces q/k/v_proj by one qkv_proj (see FusedParts); parameter order becomes qkv_proj,
  // o_proj, q_norm, k_norm. Needs set (not deferred) weights; idempotent.
  void fuse();
  bool fused() const { return !qkv_.fused.is_empty(); }
  void to(torch::Device device, torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Device device, bool non_blocking = false) override;

  Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  // spec.qk_norm (qwen3, gemma3): RMSNorm weight [head_dim] on every q / k head before RoPE;
  // null otherwise.
  std::shared_ptr<RMSNormImpl> q_norm, k_norm;

 private:
  int64_t heads_, kv_heads_, head_dim_;
  double scale_;  // q.k scale (LayerSpec::attention_scale)
  const TensorParallel* tp_;
  FusedParts qkv_;  // after fuse(): qkv_proj [(nh + 2 kv) D, H] and its parts q, k, v
};

// Without autograd (scoring, prefill) the MLP runs over at most this many tokens at a time,
// so its [tokens, intermediate] gate, up and product exist for one chunk only (a token's
// MLP output depends on that token alone: same values). The memory planner counts it.
inline constexpr int64_t kInferenceMlpChunkTokens = 8192;

class MlpImpl : public torch::nn::Module {
 public:
  MlpImpl(const ModelConfig& config, const LayerSpec& spec, Materialize how,
          const TensorParallel* tp = nullptr);
  // down(act(gate(x)) * up(x)), [B, T, H] (act: spec.activation); in chunks of
  // kInferenceMlpChunkTokens tokens when autograd is off.
  torch::Tensor forward(const torch::Tensor& x);
  // Replaces gate/up_proj by one gate_up_proj [2 I, H] (see FusedParts); parameter order
  // becomes gate_up_proj, down_proj. Needs set (not deferred) weights; idempotent.
  void fuse();
  bool fused() const { return !gate_up_.fused.is_empty(); }
  void to(torch::Device device, torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Device device, bool non_blocking = false) override;

  Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};

 private:
  torch::Tensor act(const torch::Tensor& gate) const;
  const TensorParallel* tp_;
  Activation activation_;
  FusedParts gate_up_;  // after fuse(): gate_up_proj and its parts gate, up
};

class DecoderLayerImpl : public torch::nn::Module {
 public:
  DecoderLayerImpl(const ModelConfig& config, const LayerSpec& spec,
                   Materialize how = Materialize::kAllocate, const TensorParallel* tp = nullptr,
                   const ExpertParallel* ep = nullptr);
  // [B, T, H] -> [B, T, H]: x + attn(norm(x)), then h + mlp(norm(h)); with sandwich norms
  // (Gemma) x + post_attention(attn(input(x))), then h + post_feedforward(mlp(
  // pre_feedforward(h))). mlp is the MoE block on a sparse layer.
  torch::Tensor forward(const torch::Tensor& x, const AttentionInputs& in, KvStore* cache,
                        int64_t layer_index);
  const LayerSpec& spec() const { return spec_; }
  std::shared_ptr<AttentionImpl> self_attn;
  // One of the two: the dense MLP ("mlp"), or with spec.moe.sparse() the mixture-of-experts
  // block (models/moe.h; "mlp", Mixtral's "block_sparse_moe").
  std::shared_ptr<MlpImpl> mlp;
  std::shared_ptr<SparseMoeImpl> moe;
  std::shared_ptr<RMSNormImpl> input_layernorm, post_attention_layernorm;
  // spec.sandwich_norms only; null otherwise.
  std::shared_ptr<RMSNormImpl> pre_feedforward_layernorm, post_feedforward_layernorm;

 private:
  torch::Tensor feed_forward(const torch::Tensor& x);  // the MLP or the MoE block
  LayerSpec spec_;
};

}  // namespace rlhf::models
