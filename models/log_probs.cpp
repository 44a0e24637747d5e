// Log-probs and entropy through the LM head in chunks of tokens; see log_probs.h.
// With p = softmax(z), for each position: d log p_y / dz = onehot(y) - p and
// d H / dz = -p (log p + H), applied chunk by chunk to recomputed logits.
#include "models/log_probs.h"

#include <ATen/ops/special_entr.h>
#include <torch/autograd.h>

#include <algorithm>
#include <limits>
#include <utility>
#include <vector>

namespace rlhf::models {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

void check_head_inputs(const char* what, const torch::Tensor& hidden, const torch::Tensor& weight,
                       const torch::Tensor& labels) {
  TORCH_CHECK(hidden.dim() == 3, what, ": hidden must be [B, T, H], got ", hidden.sizes());
  TORCH_CHECK(weight.dim() == 2 && weight.size(1) == hidden.size(2), what, ": weight must be [V, ",
              hidden.size(2), "], got ", weight.sizes());
  TORCH_CHECK(weight.scalar_type() == hidden.scalar_type(), what,
              ": weight and hidden must share a dtype, got ", weight.scalar_type(), " and ",
              hidden.scalar_type());
  TORCH_CHECK((labels.dim() == 2 || labels.dim() == 3) && labels.size(0) == hidden.size(0) &&
                  labels.size(1) == hidden.size(1),
              what,
              ": labels must be [B, T] or [B, T, K] with [B, T] = ", hidden.sizes().slice(0, 2),
              ", got ", labels.sizes());
  TORCH_CHECK(labels.scalar_type() == torch::kInt64, what, ": labels must be int64");
  if (labels.numel() > 0) {
    TORCH_CHECK(labels.min().item<int64_t>() >= 0 && labels.max().item<int64_t>() < weight.size(0),
                what, ": labels outside [0, ", weight.size(0), ")");
  }
}

// ---- Token chunks of [B, T, ...] tensors, in row-major token order ----

// Tokens [t0, t0 + n) of x [B, T, ...]: one view per row the range touches.
std::vector<torch::Tensor> token_pieces(const torch::Tensor& x, int64_t t0, int64_t n) {
  const int64_t T = x.size(1);
  std::vector<torch::Tensor> pieces;
  for (int64_t t = t0; t < t0 + n;) {
    const int64_t s = t % T, len = std::min(T - s, t0 + n - t);
    pieces.push_back(x.select(0, t / T).narrow(0, s, len));
    t += len;
  }
  return pieces;
}

// [t0, n) ranges covering N tokens, at most `chunk` each and of near-equal sizes: no small
// remainder chunk (BLAS's few-row kernels are slower, and less accurate over V: 2e-6 of
// scale for 1-3 rows at V = 1000 in FP32 against 3e-7 for more).
std::vector<std::pair<int64_t, int64_t>> chunk_ranges(int64_t N, int64_t chunk) {
  const int64_t count = (N + chunk - 1) / chunk;
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t i = 0, t0 = 0; i < count; ++i) {
    const int64_t n = N / count + (i < N % count ? 1 : 0);
    out.emplace_back(t0, n);
    t0 += n;
  }
  return out;
}

// The same tokens as one [n, ...] tensor (a view when they lie in one row).
torch::Tensor token_range(const torch::Tensor& x, int64_t t0, int64_t n) {
  auto pieces = token_pieces(x, t0, n);
  return pieces.size() == 1 ? pieces.front() : torch::cat(pieces, 0);
}

// Writes src [n, ...] into tokens [t0, t0 + n) of x [B, T, ...].
void set_token_range(const torch::Tensor& x, int64_t t0, const torch::Tensor& src) {
  int64_t k = 0;
  for (const auto& piece : token_pieces(x, t0, src.size(0))) {
    piece.copy_(src.narrow(0, k, piece.size(0)));
    k += piece.size(0);
  }
}

// ---- One chunk ----

// h [n, H] @ weight [V, H]^T in the compute dtype, as FP32 [n, V]: a BF16 product is freed
// once converted, so one FP32 [n, V] buffer outlives the call.
torch::Tensor logits_fp32(const torch::Tensor& h, const torch::Tensor& weight) {
  torch::Tensor z = torch::mm(h, weight.t());
  return z.scalar_type() == torch::kFloat32 ? z : z.to(torch::kFloat32);
}

// log p = (z - shift) - log_sum, as log_softmax rounds it (z - logsumexp(z) would round the
// sum of two large terms first: ~1 ulp of the largest logit more error in every log p).
struct ChunkForward {
  torch::Tensor log_probs;  // [n, K] log p(y)
  torch::Tensor shift;      // [n] max_v z
  torch::Tensor log_sum;    // [n] log sum_v exp(z - shift)
  torch::Tensor entropy;    // [n] (undefined unless asked)
};

// Everything in place on the chunk's one FP32 [n, V] buffer: z - max, exp, (entropy) / sum.
// y: [n, K] labels per token.
ChunkForward forward_chunk(const torch::Tensor& h, const torch::Tensor& weight,
                           const torch::Tensor& y, bool entropy) {
  torch::Tensor z = logits_fp32(h, weight);                 // [n, V]
  torch::Tensor picked = z.gather(1, y);                    // [n, K]
  torch::Tensor m = torch::amax(z, {1}, /*keepdim=*/true);  // [n, 1]
  z.sub_(m).exp_();
  torch::Tensor s = z.sum(1, /*keepdim=*/true);  // [n, 1]
  ChunkForward out;
  out.shift = m.squeeze(1);
  out.log_sum = s.log().squeeze(1);
  out.log_probs = (picked - m) - out.log_sum.unsqueeze(1);
  if (entropy) {
    z.div_(s);                   // p
    at::special_entr_out(z, z);  // -p log p (0 where p underflowed to 0)
    out.entropy = z.sum(1);
  }
  return out;
}

// d loss / d logits of one chunk in the compute dtype, [n, V]: sum_k g_lp[k] (onehot(y[k]) - p)
// - g_ent p (log p + H), from the logits recomputed. y, g_lp: [n, K]; g_lp or g_ent may be
// undefined (zero).
torch::Tensor logits_grad(const torch::Tensor& h, const torch::Tensor& weight,
                          const torch::Tensor& y, const torch::Tensor& shift,
                          const torch::Tensor& log_sum, const torch::Tensor& g_lp,
                          const torch::Tensor& entropy, const torch::Tensor& g_ent) {
  torch::Tensor z = logits_fp32(h, weight);
  z.sub_(shift.unsqueeze(1)).sub_(log_sum.unsqueeze(1));            // log p
  const torch::Tensor g_sum = g_lp.defined() ? g_lp.sum(1) : g_lp;  // [n]: p's weight
  if (g_ent.defined()) {
    torch::Tensor p = z.exp();  // the entropy's gradient needs p and log p at once
    z.add_(entropy.unsqueeze(1)).mul_(g_ent.unsqueeze(1));
    if (g_lp.defined()) z.add_(g_sum.unsqueeze(1));
    z.mul_(p).neg_();
  } else {
    z.exp_().mul_(-g_sum.unsqueeze(1));
  }
  if (g_lp.defined()) z.scatter_add_(1, y, g_lp);
  return z.scalar_type() == h.scalar_type() ? z : z.to(h.scalar_type());
}

// The head's gradient summed over chunks: a single chunk's product as it is (rounded once,
// as a plain matmul would be); with several, an FP32 [V, H] sum.
class WeightGrad {
 public:
  void add(const torch::Tensor& grad_logits, const torch::Tensor& h) {  // [n, V], [n, H]
    if (!sum_.defined()) {
      sum_ = torch::mm(grad_logits.t(), h);
      return;
    }
    if (sum_.scalar_type() != torch::kFloat32) sum_ = sum_.to(torch::kFloat32);
    if (grad_logits.scalar_type() == torch::kFloat32)
      sum_.addmm_(grad_logits.t(), h);
    else
      sum_.add_(torch::mm(grad_logits.t(), h));
  }
  torch::Tensor result(torch::Dtype dtype) const {
    return sum_.defined() && sum_.scalar_type() != dtype ? sum_.to(dtype) : sum_;
  }

 private:
  torch::Tensor sum_;  // [V, H]
};

class ChunkedHeadLogProbs : public torch::autograd::Function<ChunkedHeadLogProbs> {
 public:
  // {log_probs [B, T, K], entropy [B, T] (or [0] when not asked)}, both FP32; labels
  // [B, T, K].
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& hidden,
                               const torch::Tensor& weight, const torch::Tensor& labels,
                               int64_t chunk, bool entropy) {
    const int64_t B = hidden.size(0), T = hidden.size(1), N = B * T;
    const auto f32 = hidden.options().dtype(torch::kFloat32);
    auto log_probs = torch::empty({B, T, labels.size(2)}, f32), shift = torch::empty({B, T}, f32),
         log_sum = torch::empty({B, T}, f32);
    auto ent = torch::empty({entropy ? B : 0, entropy ? T : 0}, f32);
    for (const auto& [t0, n] : chunk_ranges(N, chunk)) {
      auto c =
          forward_chunk(token_range(hidden, t0, n), weight, token_range(labels, t0, n), entropy);
      set_token_range(log_probs, t0, c.log_probs);
      set_token_range(shift, t0, c.shift);
      set_token_range(log_sum, t0, c.log_sum);
      if (entropy) set_token_range(ent, t0, c.entropy);
    }
    ctx->save_for_backward({hidden, weight, labels, shift, log_sum, ent});
    ctx->saved_data["chunk"] = chunk;
    if (!entropy) ctx->mark_non_differentiable({ent});
    ctx->set_materialize_grads(false);  // an unused output's gradient stays undefined
    return {log_probs, ent};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &hidden = saved[0], &weight = saved[1], &labels = saved[2], &shift = saved[3],
               &log_sum = saved[4], &ent = saved[5];
    const int64_t chunk = ctx->saved_data["chunk"].toInt();
    const bool want_hidden = ctx->needs_input_grad(0), want_weight = ctx->needs_input_grad(1);
    const torch::Tensor g_lp = grads[0].defined() ? grads[0].to(torch::kFloat32) : grads[0];
    const torch::Tensor g_ent =
        ent.numel() > 0 && grads[1].defined() ? grads[1].to(torch::kFloat32) : torch::Tensor();
    const variable_list none = {torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(),
                                torch::Tensor()};
    if (!g_lp.defined() && !g_ent.defined()) return none;
    torch::Tensor grad_hidden = want_hidden ? torch::empty_like(hidden) : torch::Tensor();
    WeightGrad grad_weight;
    const int64_t N = hidden.size(0) * hidden.size(1);
    for (const auto& [t0, n] : chunk_ranges(N, chunk)) {
      const auto part = [&, t0 = t0, n = n](const torch::Tensor& x) {
        return x.defined() ? token_range(x, t0, n) : x;
      };
      const torch::Tensor h = part(hidden);
      const torch::Tensor gz =
          logits_grad(h, weight, part(labels), part(shift), part(log_sum), part(g_lp),
                      g_ent.defined() ? part(ent) : ent, part(g_ent));
      if (want_hidden) set_token_range(grad_hidden, t0, torch::mm(gz, weight));
      if (want_weight) grad_weight.add(gz, h);
    }
    auto out = none;
    out[0] = grad_hidden;
    out[1] = want_weight ? grad_weight.result(weight.scalar_type()) : torch::Tensor();
    return out;
  }
};

// Entropy of every position, 16 positions of all rows at a time, without a graph: how the
// PPO scoring computed it before issue 28.
torch::Tensor entropy_by_positions(const torch::Tensor& hidden, const torch::Tensor& weight) {
  torch::NoGradGuard no_grad;
  const int64_t T = hidden.size(1);
  std::vector<torch::Tensor> parts;
  for (int64_t s = 0; s < T; s += 16) {
    torch::Tensor logp = torch::log_softmax(
        torch::matmul(hidden.narrow(1, s, std::min<int64_t>(16, T - s)), weight.t())
            .to(torch::kFloat32),
        -1);
    parts.push_back(-(logp.exp() * logp).sum(-1));
  }
  return parts.empty() ? torch::empty({hidden.size(0), 0}, hidden.options().dtype(torch::kFloat32))
                       : torch::cat(parts, 1);
}

// The path before issue 28, kept unchanged as train.logits_chunk_tokens = 0.
// d log p_y / d logits = onehot(y) - softmax(logits), applied chunk by chunk.
class PositionChunkedLogProbs : public torch::autograd::Function<PositionChunkedLogProbs> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& hidden,
                               const torch::Tensor& weight, const torch::Tensor& labels,
                               int64_t chunk) {
    const int64_t B = hidden.size(0), T = hidden.size(1);
    auto out = torch::empty({B, T}, hidden.options().dtype(torch::kFloat32));
    auto lse = torch::empty({B, T}, hidden.options().dtype(torch::kFloat32));
    for (int64_t t0 = 0; t0 < T; t0 += chunk) {
      const int64_t n = std::min(chunk, T - t0);
      auto logits = torch::matmul(hidden.narrow(1, t0, n), weight.t()).to(torch::kFloat32);
      auto chunk_lse = torch::logsumexp(logits, -1);  // [B, n]
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
    const bool single_chunk = T <= chunk;
    torch::Tensor grad_weight;
    if (want_weight && !single_chunk)
      grad_weight = torch::zeros({V, H}, weight.options().dtype(torch::kFloat32));
    for (int64_t t0 = 0; t0 < T; t0 += chunk) {
      const int64_t n = std::min(chunk, T - t0);
      auto h = hidden.narrow(1, t0, n);            // [B, n, H]
      auto gc = g.narrow(1, t0, n).unsqueeze(-1);  // [B, n, 1]
      auto probs =
          (torch::matmul(h, weight.t()).to(torch::kFloat32) - lse.narrow(1, t0, n).unsqueeze(-1))
              .exp_();  // [B, n, V]
      auto grad_logits = probs.mul_(-gc);
      grad_logits.scatter_add_(-1, labels.narrow(1, t0, n).unsqueeze(-1), gc);
      auto gl = grad_logits.to(hidden.scalar_type());
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

HeadLogProbs head_log_probs(const torch::Tensor& hidden, const torch::Tensor& weight,
                            const torch::Tensor& labels, int64_t chunk_tokens, Entropy entropy) {
  check_head_inputs("head_log_probs", hidden, weight, labels);
  TORCH_CHECK(chunk_tokens >= 0, "head_log_probs: chunk_tokens must be >= 0, got ", chunk_tokens);
  const bool with_entropy = entropy == Entropy::kCompute;
  const bool per_token = labels.dim() == 2;
  if (!per_token && chunk_tokens == 0) chunk_tokens = kLegacyLogProbChunk;  // no legacy K path
  HeadLogProbs out;
  if (chunk_tokens == 0) {
    out.log_probs = PositionChunkedLogProbs::apply(hidden, weight, labels, kLegacyLogProbChunk);
    if (with_entropy) out.entropy = entropy_by_positions(hidden, weight);
    return out;
  }
  auto r = ChunkedHeadLogProbs::apply(hidden, weight, per_token ? labels.unsqueeze(2) : labels,
                                      chunk_tokens, with_entropy);
  out.log_probs = per_token ? r[0].squeeze(2) : r[0];
  if (with_entropy) out.entropy = r[1];
  return out;
}

HeadLogProbs full_logits_log_probs(const torch::Tensor& hidden, const torch::Tensor& weight,
                                   const torch::Tensor& labels, Entropy entropy) {
  check_head_inputs("full_logits_log_probs", hidden, weight, labels);
  auto logp = torch::log_softmax(torch::matmul(hidden, weight.t()).to(torch::kFloat32), -1);
  HeadLogProbs out;
  out.log_probs = labels.dim() == 2 ? logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
                                    : logp.gather(-1, labels);
  if (entropy == Entropy::kCompute) out.entropy = -(logp.exp() * logp).sum(-1);
  return out;
}

torch::Tensor chunked_log_probs(const torch::Tensor& hidden, const torch::Tensor& weight,
                                const torch::Tensor& labels, int64_t chunk) {
  check_head_inputs("chunked_log_probs", hidden, weight, labels);
  TORCH_CHECK(labels.dim() == 2, "chunked_log_probs: labels must be [B, T]");
  TORCH_CHECK(chunk > 0, "chunked_log_probs: chunk must be positive");
  return PositionChunkedLogProbs::apply(hidden, weight, labels, chunk);
}

HeadTopK head_top_k(const torch::Tensor& hidden, const torch::Tensor& weight, int64_t k,
                    int64_t chunk_tokens) {
  TORCH_CHECK(hidden.dim() == 3 && weight.dim() == 2 && weight.size(1) == hidden.size(2) &&
                  weight.scalar_type() == hidden.scalar_type(),
              "head_top_k: expected hidden [B, T, H] and weight [V, H] of one dtype, got ",
              hidden.sizes(), " and ", weight.sizes());
  TORCH_CHECK(k >= 1, "head_top_k: k must be >= 1, got ", k);
  torch::NoGradGuard no_grad;
  k = std::min(k, weight.size(0));
  const int64_t B = hidden.size(0), T = hidden.size(1);
  HeadTopK out;
  out.log_probs = torch::empty({B, T, k}, hidden.options().dtype(torch::kFloat32));
  out.ids = torch::empty({B, T, k}, hidden.options().dtype(torch::kInt64));
  out.rest = torch::empty({B, T}, hidden.options().dtype(torch::kFloat32));
  const int64_t chunk = chunk_tokens > 0 ? chunk_tokens : kDefaultLogitsChunkTokens;
  for (const auto& [t0, n] : chunk_ranges(B * T, chunk)) {
    torch::Tensor logp = torch::log_softmax(logits_fp32(token_range(hidden, t0, n), weight), 1);
    auto [values, ids] = logp.topk(k, 1);  // sorted, largest first
    set_token_range(out.log_probs, t0, values);
    set_token_range(out.ids, t0, ids);
    // The rest's mass summed from its own terms, not as 1 - the top's (which loses it to
    // rounding when it is small).
    set_token_range(out.rest, t0,
                    logp.scatter_(1, ids, -std::numeric_limits<float>::infinity()).logsumexp(1));
  }
  return out;
}

}  // namespace rlhf::models
