// Chunked log-probs as a custom autograd function; see log_probs.h.
// d log p_y / d logits = onehot(y) - softmax(logits), applied chunk by chunk.
#include "models/log_probs.h"

#include <torch/autograd.h>

namespace rlhf::models {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// [B, c, H] @ [V, H]^T -> [B, c, V] FP32 logits of one chunk.
torch::Tensor chunk_logits(const torch::Tensor& h, const torch::Tensor& weight) {
  return torch::matmul(h, weight.t()).to(torch::kFloat32);
}

class ChunkedLogProbs : public torch::autograd::Function<ChunkedLogProbs> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& hidden,
                               const torch::Tensor& weight, const torch::Tensor& labels,
                               int64_t chunk) {
    const int64_t B = hidden.size(0), T = hidden.size(1);
    auto out = torch::empty({B, T}, hidden.options().dtype(torch::kFloat32));
    auto lse = torch::empty({B, T}, hidden.options().dtype(torch::kFloat32));
    for (int64_t t0 = 0; t0 < T; t0 += chunk) {
      const int64_t n = std::min(chunk, T - t0);
      auto logits = chunk_logits(hidden.narrow(1, t0, n), weight);  // [B, n, V]
      auto chunk_lse = torch::logsumexp(logits, -1);                // [B, n]
      auto picked = logits.gather(-1, labels.narrow(1, t0, n).unsqueeze(-1)).squeeze(-1);
      out.narrow(1, t0, n).copy_(picked - chunk_lse);
      lse.narrow(1, t0, n).copy_(chunk_lse);
    }
    ctx->save_for_backward({hidden, weight, labels, lse});
    ctx->saved_data["chunk"] = chunk;
    ctx->saved_data["hidden_grad"] = hidden.requires_grad();
    ctx->saved_data["weight_grad"] = weight.requires_grad();
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto &hidden = saved[0], &weight = saved[1], &labels = saved[2], &lse = saved[3];
    const int64_t chunk = ctx->saved_data["chunk"].toInt();
    const bool want_hidden = ctx->saved_data["hidden_grad"].toBool();
    const bool want_weight = ctx->saved_data["weight_grad"].toBool();
    const auto g = grads[0].to(torch::kFloat32);  // [B, T]
    const int64_t T = hidden.size(1), V = weight.size(0), H = weight.size(1);
    torch::Tensor grad_hidden = want_hidden ? torch::empty_like(hidden) : torch::Tensor();
    // Several chunks accumulate the head's gradient in FP32 (one transient [V, H] FP32
    // buffer); a single chunk writes it directly, rounded once as a plain matmul would be.
    const bool single_chunk = T <= chunk;
    torch::Tensor grad_weight;
    if (want_weight && !single_chunk)
      grad_weight = torch::zeros({V, H}, weight.options().dtype(torch::kFloat32));
    for (int64_t t0 = 0; t0 < T; t0 += chunk) {
      const int64_t n = std::min(chunk, T - t0);
      auto h = hidden.narrow(1, t0, n);            // [B, n, H]
      auto gc = g.narrow(1, t0, n).unsqueeze(-1);  // [B, n, 1]
      auto probs =
          (chunk_logits(h, weight) - lse.narrow(1, t0, n).unsqueeze(-1)).exp_();  // [B, n, V]
      auto grad_logits = probs.mul_(-gc);
      grad_logits.scatter_add_(-1, labels.narrow(1, t0, n).unsqueeze(-1), gc);
      auto gl = grad_logits.to(hidden.scalar_type());  // matmuls in the compute dtype
      if (want_hidden) grad_hidden.narrow(1, t0, n).copy_(torch::matmul(gl, weight));
      if (want_weight) {
        auto chunk_grad = torch::matmul(gl.reshape({-1, V}).t(), h.reshape({-1, H}));  // [V, H]
        if (single_chunk)
          grad_weight = chunk_grad;
        else
          grad_weight.add_(chunk_grad);
      }
    }
    if (want_weight) grad_weight = grad_weight.to(weight.scalar_type());
    return {grad_hidden, grad_weight, torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor chunked_log_probs(const torch::Tensor& hidden, const torch::Tensor& weight,
                                const torch::Tensor& labels, int64_t chunk) {
  TORCH_CHECK(hidden.dim() == 3, "chunked_log_probs: hidden must be [B, T, H], got ",
              hidden.sizes());
  TORCH_CHECK(weight.dim() == 2 && weight.size(1) == hidden.size(2),
              "chunked_log_probs: weight must be [V, ", hidden.size(2), "], got ", weight.sizes());
  TORCH_CHECK(
      labels.dim() == 2 && labels.size(0) == hidden.size(0) && labels.size(1) == hidden.size(1),
      "chunked_log_probs: labels must be [B, T] = ", hidden.sizes().slice(0, 2), ", got ",
      labels.sizes());
  TORCH_CHECK(labels.scalar_type() == torch::kInt64, "chunked_log_probs: labels must be int64");
  TORCH_CHECK(chunk > 0, "chunked_log_probs: chunk must be positive");
  if (labels.numel() > 0) {
    TORCH_CHECK(labels.min().item<int64_t>() >= 0 && labels.max().item<int64_t>() < weight.size(0),
                "chunked_log_probs: labels outside [0, ", weight.size(0), ")");
  }
  return ChunkedLogProbs::apply(hidden, weight, labels, chunk);
}

}  // namespace rlhf::models
