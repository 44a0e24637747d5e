// Sampling: temperature, top-k and top-p warpers in FP32, inverse-CDF draws from per-row
// streams. See sampling.h.
#include "rollout/sampling.h"

#include <ATen/ATen.h>

#include <limits>
#include <string>

#include "core/errors.h"

namespace rlhf::rollout {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// A uniform draw in (0, 1] from 53 random bits (std::uniform_real_distribution is not the
// same across standard libraries; this is).
double uniform_open_closed(std::mt19937_64& stream) {
  return static_cast<double>((stream() >> 11) + 1) * (1.0 / 9007199254740992.0);
}

}  // namespace

void SamplingParams::validate() const {
  if (!(temperature >= 0.0))
    throw InputError("sampling: temperature must be >= 0, got " + std::to_string(temperature));
  if (top_k == 0 || top_k < -1)
    throw InputError("sampling: top_k must be -1 (off) or >= 1, got " + std::to_string(top_k));
  if (!(top_p > 0.0 && top_p <= 1.0))
    throw InputError("sampling: top_p must be in (0, 1], got " + std::to_string(top_p));
}

torch::Tensor sampling_log_probs(const torch::Tensor& logits, const SamplingParams& params) {
  TORCH_CHECK(logits.dim() == 2 && logits.is_floating_point(),
              "sampling: logits must be float [B, V], got ", logits.scalar_type(), logits.sizes());
  params.validate();
  torch::Tensor scores = logits.to(torch::kFloat32);
  if (params.greedy()) return torch::log_softmax(scores, -1);
  scores = scores / params.temperature;
  const int64_t V = scores.size(1);
  const float minus_inf = -std::numeric_limits<float>::infinity();
  if (params.top_k > 0 && params.top_k < V) {
    auto kth = std::get<0>(scores.topk(params.top_k, -1)).narrow(1, params.top_k - 1, 1);  // [B, 1]
    scores = scores.masked_fill(scores < kth, minus_inf);
  }
  if (params.top_p < 1.0) {
    // Keep sorted token j while the mass strictly before it is < top_p: the smallest
    // prefix reaching top_p (HF's TopPLogitsWarper; the most likely token always stays).
    auto sorted = scores.sort(-1, /*descending=*/true);
    auto probs = torch::softmax(std::get<0>(sorted), -1);
    auto before = probs.cumsum(-1) - probs;  // [B, V]
    auto remove_sorted = before >= params.top_p;
    remove_sorted.select(1, 0).fill_(false);
    auto remove = torch::zeros_like(remove_sorted).scatter_(1, std::get<1>(sorted), remove_sorted);
    scores = scores.masked_fill(remove, minus_inf);
  }
  return torch::log_softmax(scores, -1);
}

Sampler::Sampler(SamplingParams params, int64_t rows, int64_t first_row)
    : params_(params), first_row_(first_row) {
  params_.validate();
  TORCH_CHECK(rows > 0 && first_row >= 0, "Sampler: rows must be positive and first_row >= 0, got ",
              rows, ", ", first_row);
  streams_.reserve(static_cast<size_t>(rows));
  for (int64_t r = first_row; r < first_row + rows; ++r)
    streams_.emplace_back(splitmix64(params_.seed ^ splitmix64(static_cast<uint64_t>(r))));
}

Sampled Sampler::sample(const torch::Tensor& logits, const std::vector<int64_t>& rows) {
  TORCH_CHECK(logits.dim() == 2 && static_cast<size_t>(logits.size(0)) == rows.size(),
              "Sampler::sample: logits must be [A, V] with A = rows given (", rows.size(),
              "), got ", logits.sizes());
  torch::Tensor u;
  if (!params_.greedy()) {
    std::vector<double> draws(rows.size());
    for (size_t i = 0; i < rows.size(); ++i) {
      const int64_t k = rows[i] - first_row_;
      TORCH_CHECK(k >= 0 && k < static_cast<int64_t>(streams_.size()), "Sampler::sample: row ",
                  rows[i], " outside [", first_row_, ", ",
                  first_row_ + static_cast<int64_t>(streams_.size()), ")");
      draws[i] = uniform_open_closed(streams_[static_cast<size_t>(k)]);
    }
    u = torch::tensor(draws, torch::kFloat64).to(logits.device());
  }
  return sample_uniform(logits, u);
}

torch::Tensor Sampler::draws(int64_t first, int64_t rows, int64_t steps) {
  if (params_.greedy()) return {};
  TORCH_CHECK(rows > 0 && steps > 0 && first >= first_row_ &&
                  first + rows <= first_row_ + static_cast<int64_t>(streams_.size()),
              "Sampler::draws: rows [", first, ", ", first + rows, ") outside [", first_row_, ", ",
              first_row_ + static_cast<int64_t>(streams_.size()), ")");
  auto out = torch::empty({rows, steps}, torch::kFloat64);
  auto* u = out.data_ptr<double>();
  for (int64_t r = 0; r < rows; ++r) {
    auto& stream = streams_[static_cast<size_t>(first - first_row_ + r)];
    for (int64_t t = 0; t < steps; ++t) u[r * steps + t] = uniform_open_closed(stream);
  }
  return out;
}

Sampled Sampler::sample_uniform(const torch::Tensor& logits, const torch::Tensor& u) const {
  auto log_probs = sampling_log_probs(logits, params_);  // [A, V] FP32
  torch::Tensor tokens;
  if (params_.greedy()) {
    tokens = log_probs.argmax(-1);
  } else {
    TORCH_CHECK(u.defined() && u.dim() == 1 && u.size(0) == logits.size(0),
                "Sampler::sample_uniform: u must be [A] for logits [A, V], got ",
                u.defined() ? u.sizes() : at::IntArrayRef{});
    // The first token whose cumulative probability reaches u * total: removed tokens have
    // zero width in the CDF and u > 0, so they are never chosen.
    auto cdf = log_probs.exp().to(torch::kFloat64).cumsum(-1);  // [A, V]
    auto target =
        u.to(cdf.device(), torch::kFloat64).unsqueeze(1) * cdf.narrow(1, cdf.size(1) - 1, 1);
    tokens = torch::searchsorted(cdf, target).squeeze(1).clamp_max(cdf.size(1) - 1);
  }
  auto chosen = log_probs.gather(1, tokens.unsqueeze(1)).squeeze(1);
  return {tokens, chosen};
}

}  // namespace rlhf::rollout
