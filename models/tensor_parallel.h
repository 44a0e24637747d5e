// Megatron-style tensor parallelism for inference (the rollout engine; vLLM's
// tensor_parallel_size): which slice of each HF parameter a TP rank holds, and the group its
// all-reduces and all-gathers run over.
//
//   column-parallel (dim 0): q/k/v_proj and gate/up_proj weights and biases: each rank
//     holds heads / tp query heads, kv_heads / tp key/value heads, intermediate / tp rows;
//   row-parallel (dim 1): o_proj and down_proj weights; the partial outputs are summed by an
//     all-reduce (a row-parallel bias is added once, after it);
//   vocab-parallel (dim 0): embed_tokens and lm_head: rank r holds vocabulary rows
//     [r * V / tp, (r + 1) * V / tp); the embedding all-reduces, the head all-gathers its
//     logits so every rank samples from the same full distribution;
//   replicated: the norms.
//   a mixture of experts: each expert as a dense MLP (gate/up_proj, Mixtral's w1/w3, by
//     rows; down_proj, w2, by columns), its routed sum all-reduced once per layer; the router
//     and Qwen2-MoE's shared_expert_gate replicated, its shared expert a dense MLP. Every rank
//     routes the same tokens alike and runs every expert that has tokens on its slice, so the
//     work stays even however the router skews, with no all-to-all (vLLM's MoE TP without
//     enable_expert_parallel does the same; splitting the experts across ranks would need
//     both the all-to-all and a balanced router).
// Every size split must divide evenly (check_tensor_parallel says which does not).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "models/config.h"

namespace rlhf::transport {
class CollectiveGroup;
}

namespace rlhf::models {

struct TensorParallel {
  int rank = 0;
  int size = 1;
  // The TP group (size > 1): every rank of it runs the same forwards in lockstep.
  std::shared_ptr<transport::CollectiveGroup> group;
  bool enabled() const { return size > 1; }
};

// Throws InputError naming the first size of `config` that `tp_size` does not divide
// (num_attention_heads, num_key_value_heads, intermediate_size, vocab_size), or a value head
// (the rollout's TP has only an LM head). `what` prefixes the message (a file or key).
void check_tensor_parallel(const ModelConfig& config, int tp_size, const std::string& what);

// The config one TP rank's decoder layers see: heads, kv heads and intermediate size divided
// by tp_size (hidden size, head_dim and vocabulary unchanged). What its KV cache holds.
ModelConfig tensor_parallel_shard_config(const ModelConfig& config, int tp_size);

// The dim HF parameter `name` is split along: 0, 1, or -1 (replicated).
int tensor_parallel_dim(const std::string& name);

// `full_shape` with its split dim divided by tp_size.
std::vector<int64_t> tensor_parallel_shape(const std::string& name,
                                           const std::vector<int64_t>& full_shape, int tp_size);

// Rank `rank`'s slice of the full tensor `full` (a view; contiguous for dim 0).
torch::Tensor tensor_parallel_slice(const std::string& name, const torch::Tensor& full, int rank,
                                    int tp_size);

// Sums a row-parallel layer's partial outputs over the TP group, in place (no-op at TP 1).
void tensor_parallel_all_reduce(const TensorParallel& tp, torch::Tensor& partial);

// The vocab-parallel head's local logits [..., V / tp] -> every rank's full [..., V].
torch::Tensor tensor_parallel_gather_vocab(const TensorParallel& tp, const torch::Tensor& local);

// The vocab-parallel embedding: this rank's rows `weight` [V / tp, H] looked up for the ids
// it holds, zeros for the others, summed over the group -> [..., H].
torch::Tensor tensor_parallel_embedding(const TensorParallel& tp, const torch::Tensor& weight,
                                        const torch::Tensor& ids);

}  // namespace rlhf::models
