// The two parameterised building blocks of the decoder (a linear map and a token embedding),
// written here rather than taken from torch::nn so that a model can be built without
// allocating or initialising its weights: a rank that loads only its shard (models/
// pretrained.h) must never hold the whole model, even for a moment. Values are set by the
// caller (CausalLM::init_weights or a loader); these modules never draw random numbers.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <cstdint>
#include <vector>

namespace rlhf::models {

// What a model's constructor does with its parameters.
enum class Materialize {
  kAllocate,  // full FP32 CPU tensors (then init_weights or a copy fills them)
  kDeferred,  // empty placeholders [0]: a loader or a sharded trainer sets them later
};

// A parameter of `shape`, FP32 on the CPU: allocated (uninitialised) or an empty placeholder.
torch::Tensor new_parameter(const std::vector<int64_t>& shape, Materialize how);

class LinearImpl : public torch::nn::Module {
 public:
  LinearImpl(int64_t in_features, int64_t out_features, bool bias, Materialize how);
  torch::Tensor forward(const torch::Tensor& x);  // [..., in] -> [..., out]
  torch::Tensor weight;                           // [out, in]
  torch::Tensor bias;                             // [out], undefined without bias
};
TORCH_MODULE(Linear);

class EmbeddingImpl : public torch::nn::Module {
 public:
  // padding_idx < 0: none. The padding row gets no gradient (as torch.nn.Embedding).
  EmbeddingImpl(int64_t num_embeddings, int64_t dim, int64_t padding_idx, Materialize how);
  torch::Tensor forward(const torch::Tensor& ids);  // [...] int64 -> [..., dim]
  torch::Tensor weight;                             // [num_embeddings, dim]

 private:
  int64_t padding_idx_;
};
TORCH_MODULE(Embedding);

}  // namespace rlhf::models
