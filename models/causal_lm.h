// The Llama-family decoder with an LM head (actor, reference) or a scalar value head
// (critic, reward), parameters named as in HF checkpoints. Forward calls the trainer's
// LayerHooks around each unit and can checkpoint each decoder layer. Loading and saving
// live in pretrained.h; sampling lives in rollout/.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "models/config.h"
#include "models/decoder_layer.h"
#include "models/layer_hooks.h"
#include "models/linear.h"
#include "models/log_probs.h"
#include "models/moe.h"
#include "models/param_layout.h"
#include "models/tensor_parallel.h"

namespace rlhf::models {

class KvCache;
class KvStore;
class PagedKvCache;

enum class Checkpointing {
  kNone,      // keep every activation (inference, or when memory allows)
  kPerLayer,  // keep only each decoder layer's input; recompute the layer in backward
};

class CausalLM : public torch::nn::Module, public ShardableModel {
 public:
  // kAllocate: parameters are allocated (FP32, CPU) and initialised by init_weights(0);
  // callers convert with to(dtype/device). kDeferred: every parameter is an empty [0]
  // placeholder (no memory, no random draws) until a loader (load_pretrained) or a sharded
  // owner (engine/) sets it; parameter_shapes() gives the full shapes meanwhile.
  //
  // With `tp` of size > 1 (the rollout's tensor parallelism, tensor_parallel.h) the model is
  // one TP rank's shard: its parameters have the shard's shapes (kDeferred only: a loader
  // fills them, load_whole reads just the rank's slices), forwards run collectives over
  // tp.group in lockstep with the other ranks, and logits() returns the full vocabulary.
  // log_probs() and values() are not available on a shard.
  //
  // With `ep` of size > 1 (a trainer's expert parallelism, expert_parallel.h) each sparse
  // layer holds only this rank's range of experts (kDeferred only), named by their global
  // index in param_units() and state_tensors(); every forward runs all-to-alls over ep.group
  // in lockstep with the other EP ranks.
  explicit CausalLM(ModelConfig config, Materialize how = Materialize::kAllocate,
                    TensorParallel tp = {}, ExpertParallel ep = {});
  // Not copyable: the layers point at this model's TensorParallel.
  CausalLM(const CausalLM&) = delete;
  CausalLM& operator=(const CausalLM&) = delete;

  using ShapeList = models::ShapeList;
  // Every parameter's HF name and full shape, in named_parameters() order, from the config
  // (so also for a deferred or sharded model): models::parameter_shapes(config()).
  const ShapeList& parameter_shapes() const { return shapes_; }

  const ModelConfig& config() const { return config_; }
  // What this rank's decoder layers and KV cache hold: config() with heads, kv heads and
  // intermediate size divided by the TP size (config() itself without TP).
  const ModelConfig& shard_config() const { return shard_config_; }
  const TensorParallel& tensor_parallel() const { return tp_; }
  const ExpertParallel& expert_parallel() const { return ep_; }
  torch::Dtype dtype() const;
  torch::Device device() const;
  int64_t num_layers() const { return config_.num_hidden_layers; }

  // HF's _init_weights: normal(0, initializer_range) weights, zero biases, unit norms, zero
  // padding embedding; a value head gets value_head_init(config) (the same on every rank and
  // whichever way the model was built). Uses its own generator (the global RNG is untouched).
  void init_weights(uint64_t seed);

  // input_ids, attention_mask: [B, T] (with a cache, attention_mask covers cached + new
  // positions: [B, cache.length() + T]); attention_mask is 0 for padding and 1 for tokens,
  // or k >= 1 for the tokens of segment k of a packed row (each segment attends only to
  // itself and its positions restart at 0). position_ids: [B, T], or undefined to derive
  // from the mask (cumsum - 1 per segment, as OpenRLHF). An undefined attention_mask means
  // every position is a plain token (and costs no host sync). Returns the final-normed
  // hidden states [B, T, H].
  torch::Tensor forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                        const torch::Tensor& position_ids = {}, KvCache* cache = nullptr);

  // A forward over the step a PagedKvCache has planned (plan_prefill / plan_decode):
  // input_ids [B, T] are the planned sequences' new tokens in the plan's order; positions and
  // the attention mask come from the plan, and the cache's lengths advance after it.
  // Returns the final-normed hidden states [B, T, H].
  torch::Tensor forward(const torch::Tensor& input_ids, PagedKvCache& cache);

  // Tokens per chunk of the LM head in the log-prob calls below (the job's
  // train.logits_chunk_tokens): at most that many tokens' logits exist at once, in forward
  // and backward. 0: the path before issue 28 (log_probs.h). Throws on a negative count.
  void set_logits_chunk_tokens(int64_t tokens);
  int64_t logits_chunk_tokens() const { return logits_chunk_tokens_; }
  static constexpr int64_t kModelChunk = -1;  // a log-prob call's chunk: logits_chunk_tokens()

  // log p(labels[b,t] | hidden[b,t]) through the LM head, and with Entropy::kCompute each
  // position's entropy, `chunk` tokens at a time (head_log_probs in log_probs.h): hidden
  // [B, T, H], labels [B, T] -> [B, T] FP32 each. A tied head's gradient reaches the
  // embedding matrix.
  HeadLogProbs head_log_probs(const torch::Tensor& hidden, const torch::Tensor& labels,
                              Entropy entropy = Entropy::kSkip, int64_t chunk = kModelChunk);
  // head_log_probs' log-probs alone.
  torch::Tensor log_probs(const torch::Tensor& hidden, const torch::Tensor& labels,
                          int64_t chunk = kModelChunk);
  // Log-probs of each next token: hidden [B, T, H], input_ids [B, T] -> [B, T-1] FP32
  // (OpenRLHF's action log-probs before the action mask).
  torch::Tensor next_token_log_probs(const torch::Tensor& hidden, const torch::Tensor& input_ids,
                                     int64_t chunk = kModelChunk);
  // The k most likely tokens at each position and their log-probs (head_top_k in
  // log_probs.h, logits_chunk_tokens at a time): hidden [B, T, H] -> [B, T, k] each.
  HeadTopK head_top_k(const torch::Tensor& hidden, int64_t k);
  // Full logits in the compute dtype, [B, T, H] -> [B, T, V]: for sampling a few positions.
  torch::Tensor logits(const torch::Tensor& hidden);
  // Value head: [B, T, H] -> [B, T] FP32.
  torch::Tensor values(const torch::Tensor& hidden);

  void set_checkpointing(Checkpointing mode) { checkpointing_ = mode; }
  Checkpointing checkpointing() const { return checkpointing_; }
  // Padded or packed batches without a cache on a GPU in 16 bits attend by flash attention's
  // variable-length kernel (no dense mask, no work on padding; AttentionInputs::varlen). On by
  // default; off keeps the mask + SDPA path (the reference in tests).
  void set_varlen_attention(bool on) { varlen_attention_ = on; }

  // Every linear map of the decoder layers by HF module name ("model.layers.3.mlp.up_proj"),
  // layer by layer in the order q, k, v, o, gate, up, down: where LoRA adapters go.
  std::vector<std::pair<std::string, Linear>> decoder_linears();
  // LoRA (models/lora.h): whether any linear carries an adapter; switch every adapter's
  // term off (false: the base model's forward, PPO/DPO's reference) or back on.
  bool has_adapters();
  void set_adapters_enabled(bool enabled);

  // The tensors a checkpoint holds, by HF name (a tied lm_head is not listed), in HF order.
  // On a fused model (fuse_projections) q/k/v_proj and gate/up_proj are views of their rows
  // of the fused tensors: an in-place write through one (a weight sync, a copy_) lands there.
  std::vector<std::pair<std::string, torch::Tensor>> state_tensors();
  // The tensor HF parameter `name` lives in, as state_tensors() lists it (a view of its rows
  // of a fused tensor on a fused model): where a weight received by HF name goes, in place.
  // Throws InputError naming `name` when the model has no such parameter.
  torch::Tensor hf_tensor(const std::string& name);

  // Fuses every decoder layer's q/k/v maps into one qkv_proj GEMM and gate/up into one
  // gate_up_proj (issue 32.2; decoder_layer.h's FusedParts), each TP rank its own slices,
  // for the models that only run forwards (the rollout, unsharded reference and reward).
  // HF names stay everywhere outside the module tree: state_tensors(), hf_tensor(),
  // param_units(), decoder_linears() (so LoRA, save_pretrained and the weight sync see the
  // unfused model); named_parameters() shows the fused names. Call after loading: throws on
  // deferred weights. Not for a model a ZeRO trainer or ShardedInference owns (they set
  // parameters by name with set_data). Peak memory: the model plus one layer's q/k/v or
  // gate/up. Idempotent. On a GPU a sparse layer's experts become views of stacked weights
  // run as grouped GEMMs (SparseMoeImpl::use_grouped_gemm); their names do not change.
  void fuse_projections();
  bool fused_projections() const { return fused_; }

  // ShardableModel. Units: 0 = embeddings, 1..L = decoder layers, L+1 = final norm and head.
  // With tie_word_embeddings the head reads unit 0's embedding matrix (listed in unit 0 only).
  // Hook order: forward() calls before/after_forward(u) around the embedding (0), each layer
  // (1..L) and the final norm (L+1); log_probs()/logits()/values() call them around the head
  // again (L+1). A layer's LoRA adapters (A then B per linear, named
  // "<module>.lora_A.weight" / "<module>.lora_B.weight") follow its own parameters in its
  // unit; apply_lora freezes the base parameters (requires_grad false). In backward, each
  // checkpointed layer u calls before_forward(u), recomputes and back-propagates the layer, then
  // after_forward(u), then after_backward(u) (its .grad is complete). Units 0 and L+1 (and layers
  // without checkpointing) are referenced by autograd's saved tensors until backward passes them:
  // ZeRO-3 must keep them gathered.
  std::vector<ParamUnit> param_units() override;
  void set_layer_hooks(LayerHooks* hooks) override { hooks_ = hooks; }
  LayerHooks* layer_hooks() const { return hooks_; }

  torch::Tensor head_weight();  // [V, H] LM head (the embedding matrix when tied) or [1, H]

  // Modules (public so tests and the trainer can reach parameters by name).
  Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};  // DecoderLayerImpl x L
  std::shared_ptr<RMSNormImpl> norm;
  Linear lm_head{nullptr};     // absent when tied or for a value head
  Linear value_head{nullptr};  // "<value_head_prefix>.weight", [1, H]

 private:
  torch::Tensor run_layer(int64_t i, const torch::Tensor& hidden, const AttentionInputs& in,
                          KvStore* cache);
  // Whether a forward of T positions without a cache takes the varlen path.
  bool uses_varlen_attention(int64_t T) const;
  // Embedding, rotary tables for `pos`, the layers and the final norm (the masks are in `in`;
  // in.local is set exactly when the model has local layers).
  torch::Tensor run_stack(const torch::Tensor& input_ids, const torch::Tensor& pos, LayerInputs& in,
                          KvStore* cache);
  void before(int unit) {
    if (hooks_) hooks_->before_forward(unit);
  }
  void after(int unit) {
    if (hooks_) hooks_->after_forward(unit);
  }

  ModelConfig config_;
  TensorParallel tp_;
  ExpertParallel ep_;
  ModelConfig shard_config_;
  ShapeList shapes_;
  Checkpointing checkpointing_ = Checkpointing::kNone;
  bool varlen_attention_ = true;
  int64_t logits_chunk_tokens_ = kDefaultLogitsChunkTokens;
  LayerHooks* hooks_ = nullptr;
  torch::Tensor inv_freq_;        // RoPE's inverse frequencies on the device of the last forward
  torch::Tensor inv_freq_local_;  // the local layers' (has_local_)
  bool has_local_ = false;        // some layer attends through the local pattern
  int64_t shortest_window_ = 0;   // models::shortest_window of the config
  double embed_scale_ = 0;        // the embedding's output times this (0: not scaled)
  bool fused_ = false;            // fuse_projections() ran
};

// A fresh value head, [1, H] FP32: normal(0, 1 / (H + 1)) as OpenRLHF's critic init, from
// a generator of its own (seed 0), so every rank and every loader draws the same values.
torch::Tensor value_head_init(const ModelConfig& config);

// OpenRLHF's position ids: cumsum(mask != 0) - 1, restarting at 0 where a packed segment
// (a new nonzero mask value) begins, with padding positions set to 1. [B, T] -> [B, T].
torch::Tensor position_ids_from_mask(const torch::Tensor& attention_mask);

// A reward per sequence: values [B, T] at each row's last non-padding position of
// attention_mask [B, T] -> [B] (OpenRLHF's eos_indices gather).
torch::Tensor last_token_values(const torch::Tensor& values, const torch::Tensor& attention_mask);

}  // namespace rlhf::models
