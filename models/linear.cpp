// Linear and Embedding without built-in initialisation; see linear.h.
#include "models/linear.h"

#include <ATen/ops/dropout.h>
#include <ATen/ops/embedding.h>
#include <ATen/ops/linear.h>
#include <c10/util/Exception.h>
#include <torch/autograd.h>

namespace rlhf::models {

namespace {
thread_local bool force_lora_dropout = false;
}  // namespace

bool lora_dropout_active() {
  return force_lora_dropout || torch::GradMode::is_enabled();
}

LoraDropoutScope::LoraDropoutScope() : previous_(force_lora_dropout) {
  force_lora_dropout = true;
}
LoraDropoutScope::~LoraDropoutScope() {
  force_lora_dropout = previous_;
}

torch::Tensor new_parameter(const std::vector<int64_t>& shape, Materialize how) {
  if (how == Materialize::kDeferred) return torch::empty({0}, torch::kFloat32);
  return torch::empty(shape, torch::kFloat32);
}

LinearImpl::LinearImpl(int64_t in_features, int64_t out_features, bool with_bias, Materialize how) {
  weight = register_parameter("weight", new_parameter({out_features, in_features}, how));
  if (with_bias) bias = register_parameter("bias", new_parameter({out_features}, how));
}

torch::Tensor LinearImpl::forward(const torch::Tensor& x) {
  return add_lora(at::linear(x, weight, bias), x);
}

torch::Tensor LinearImpl::add_lora(const torch::Tensor& y, const torch::Tensor& x) {
  if (!lora) return y;
  TORCH_CHECK(lora->enabled || !lora->merged,
              "LoRA: adapters merged into the base weights cannot be disabled; unmerge first");
  if (!lora->enabled || lora->merged) return y;
  return y + lora_delta(x);
}

torch::Tensor LinearImpl::lora_delta(const torch::Tensor& x) {
  TORCH_CHECK(lora, "LinearImpl::lora_delta: no adapter");
  auto in = x.to(lora->A.scalar_type());
  if (lora->dropout > 0 && lora_dropout_active()) in = at::dropout(in, lora->dropout, true);
  return (at::linear(at::linear(in, lora->A), lora->B) * lora->scale).to(x.scalar_type());
}

EmbeddingImpl::EmbeddingImpl(int64_t num_embeddings, int64_t dim, int64_t padding_idx,
                             Materialize how)
    : padding_idx_(padding_idx) {
  weight = register_parameter("weight", new_parameter({num_embeddings, dim}, how));
}

torch::Tensor EmbeddingImpl::forward(const torch::Tensor& ids) {
  return at::embedding(weight, ids, padding_idx_);
}

}  // namespace rlhf::models
