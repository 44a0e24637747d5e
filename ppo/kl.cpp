#include "ppo/kl.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/errors.h"
#include "ppo/masked.h"

namespace rlhf::ppo {

KlEstimator parse_kl_estimator(const std::string& name) {
  if (name == "k1") return KlEstimator::kK1;
  if (name == "k2") return KlEstimator::kK2;
  if (name == "k3") return KlEstimator::kK3;
  throw InputError("algo.kl.estimator: expected k1, k2 or k3, found \"" + name + "\"");
}

const char* kl_estimator_name(KlEstimator estimator) {
  switch (estimator) {
    case KlEstimator::kK1:
      return "k1";
    case KlEstimator::kK2:
      return "k2";
    case KlEstimator::kK3:
      return "k3";
  }
  return "?";
}

torch::Tensor approx_kl(const torch::Tensor& log_probs, const torch::Tensor& log_probs_ref,
                        KlEstimator estimator) {
  TORCH_CHECK(log_probs.sizes() == log_probs_ref.sizes(), "approx_kl: shapes differ, got ",
              log_probs.sizes(), " and ", log_probs_ref.sizes());
  torch::Tensor r = log_probs.to(torch::kFloat32) - log_probs_ref.to(torch::kFloat32);
  torch::Tensor kl;
  switch (estimator) {
    case KlEstimator::kK1:
      kl = r;
      break;
    case KlEstimator::kK2:
      kl = r.pow(2) / 2.0;
      break;
    case KlEstimator::kK3:
      kl = (-r).exp() - 1 + r;
      break;
  }
  return kl.clamp(-10.0, 10.0);
}

double sequence_mean_kl(const torch::Tensor& kl, const torch::Tensor& action_mask) {
  TORCH_CHECK(kl.dim() == 2 && kl.sizes() == action_mask.sizes(),
              "sequence_mean_kl: expected kl and action_mask [B, A], got ", kl.sizes(), " and ",
              action_mask.sizes());
  if (kl.size(0) == 0) return 0.0;
  return masked_mean_rows(kl.to(torch::kFloat32), action_mask).mean().item<double>();
}

torch::Tensor distill_reverse_kl(const torch::Tensor& log_probs,
                                 const torch::Tensor& log_probs_teacher,
                                 const torch::Tensor& action_mask) {
  TORCH_CHECK(
      log_probs.sizes() == log_probs_teacher.sizes() && log_probs.sizes() == action_mask.sizes(),
      "distill_reverse_kl: expected [B, A] log-probs and mask alike, got ", log_probs.sizes(), ", ",
      log_probs_teacher.sizes(), " and ", action_mask.sizes());
  return (log_probs.to(torch::kFloat32) - log_probs_teacher.to(torch::kFloat32)) *
         action_mask.to(torch::kFloat32);
}

torch::Tensor distill_advantage(const torch::Tensor& reverse_kl, double coef) {
  return -coef * reverse_kl;
}

namespace {

// FP64 log-probs [.., k] of k outcomes with the rest's appended, [.., k + 1]: `rest` [..] when
// given, else 1 - their sum (at least 0). The rest's log is floored at FP64's smallest normal
// so that a zero-mass rest contributes 0 x finite to a KL.
torch::Tensor lumped(const torch::Tensor& top, const torch::Tensor& rest, bool whole) {
  const torch::Tensor t = top.to(torch::kFloat64);
  if (whole) return t;
  const double floor = std::log(std::numeric_limits<double>::min());
  const torch::Tensor r = rest.defined()
                              ? rest.to(torch::kFloat64).clamp_min(floor)
                              : (1.0 - t.exp().sum(-1)).clamp_min(0.0).log().clamp_min(floor);
  return torch::cat({t, r.unsqueeze(-1)}, -1);
}

// KL(A || B) over the last dimension from log-probs.
torch::Tensor kl_of_logs(const torch::Tensor& log_a, const torch::Tensor& log_b) {
  return (log_a.exp() * (log_a - log_b)).sum(-1);
}

}  // namespace

torch::Tensor gkd_divergence(const torch::Tensor& student_top, const torch::Tensor& teacher_top,
                             const torch::Tensor& teacher_rest, double beta, int64_t vocab_size) {
  TORCH_CHECK(student_top.sizes() == teacher_top.sizes() && student_top.dim() >= 1,
              "gkd_divergence: expected student and teacher log-probs [.., k] alike, got ",
              student_top.sizes(), " and ", teacher_top.sizes());
  TORCH_CHECK(beta >= 0.0 && beta <= 1.0, "gkd_divergence: beta must be in [0, 1], got ", beta);
  TORCH_CHECK(!teacher_rest.defined() ||
                  teacher_rest.sizes() == teacher_top.sizes().slice(0, teacher_top.dim() - 1),
              "gkd_divergence: expected the teacher's rest ",
              teacher_top.sizes().slice(0, teacher_top.dim() - 1), ", got ", teacher_rest.sizes());
  const bool whole = student_top.size(-1) >= vocab_size;
  const torch::Tensor q = lumped(student_top, torch::Tensor(), whole);
  const torch::Tensor p = lumped(teacher_top, teacher_rest, whole);
  torch::Tensor d;
  if (beta == 0.0) {
    d = kl_of_logs(p, q);
  } else if (beta == 1.0) {
    d = kl_of_logs(q, p);
  } else {
    const torch::Tensor m = torch::logaddexp(p + std::log(beta), q + std::log1p(-beta));
    d = beta * kl_of_logs(p, m) + (1.0 - beta) * kl_of_logs(q, m);
  }
  return d.to(torch::kFloat32);
}

void KlController::update(double current_kl, int64_t n_samples) {
  if (target_ <= 0) return;
  double error = std::clamp(current_kl / target_ - 1.0, -0.2, 0.2);
  value_ *= 1.0 + error * static_cast<double>(n_samples) / static_cast<double>(horizon_);
}

}  // namespace rlhf::ppo
