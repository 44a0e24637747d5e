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
#include <memory>
#include <vector>

namespace rlhf::models {

// A LoRA adapter on one linear map (models/lora.h makes, loads and saves them):
// y = W x + b + scale * B (A (dropout(x))), PEFT's LoRA Linear with fan_in_fan_out = false.
struct LoraAdapter {
  torch::Tensor A;                        // [r, in]  PEFT's lora_A.weight
  torch::Tensor B;                        // [out, r] PEFT's lora_B.weight
  std::vector<int64_t> a_shape, b_shape;  // full shapes (a sharded trainer may empty A and B)
  double scale = 1.0;                     // alpha / r, or alpha / sqrt(r) with rsLoRA
  double dropout = 0.0;  // on the adapter's input only, while lora_dropout_active()
  bool enabled = true;   // false: the forward is the base map's alone (the reference)
  bool merged = false;   // scale * B A is in the base weight (then `enabled` may not be false)
};

// Whether LoRA dropout applies now: autograd records (training), or a checkpointed layer's
// forward runs without grad but will be recomputed with it (LoraDropoutScope).
bool lora_dropout_active();
class LoraDropoutScope {
 public:
  LoraDropoutScope();
  ~LoraDropoutScope();
  LoraDropoutScope(const LoraDropoutScope&) = delete;
  LoraDropoutScope& operator=(const LoraDropoutScope&) = delete;

 private:
  bool previous_;
};

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
  // [..., in] -> [..., out], with the adapter's term while it is enabled and not merged.
  torch::Tensor forward(const torch::Tensor& x);
  // The adapter's term alone: scale * B (A (dropout(x))) [..., out] in x's dtype (PEFT's
  // order: the product first, then the scale).
  torch::Tensor lora_delta(const torch::Tensor& x);
  // y (this map's base output for x, [..., out]) plus the adapter's term while it is enabled
  // and not merged: forward() is add_lora(W x + b, x). A fused projection (decoder_layer.h)
  // calls it on its slice of the fused GEMM's output.
  torch::Tensor add_lora(const torch::Tensor& y, const torch::Tensor& x);
  torch::Tensor weight;               // [out, in]
  torch::Tensor bias;                 // [out], undefined without bias
  std::shared_ptr<LoraAdapter> lora;  // null: no adapter. Its tensors are not registered
                                      // parameters: named_parameters() stays the HF model's
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
