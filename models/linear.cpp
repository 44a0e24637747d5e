// Linear and Embedding without built-in initialisation; see linear.h.
#include "models/linear.h"

#include <ATen/ops/embedding.h>
#include <ATen/ops/linear.h>

namespace rlhf::models {

torch::Tensor new_parameter(const std::vector<int64_t>& shape, Materialize how) {
  if (how == Materialize::kDeferred) return torch::empty({0}, torch::kFloat32);
  return torch::empty(shape, torch::kFloat32);
}

LinearImpl::LinearImpl(int64_t in_features, int64_t out_features, bool with_bias, Materialize how) {
  weight = register_parameter("weight", new_parameter({out_features, in_features}, how));
  if (with_bias) bias = register_parameter("bias", new_parameter({out_features}, how));
}

torch::Tensor LinearImpl::forward(const torch::Tensor& x) {
  return at::linear(x, weight, bias);
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
