#include "ppo/kl.h"

#include <algorithm>

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

void KlController::update(double current_kl, int64_t n_samples) {
  if (target_ <= 0) return;
  double error = std::clamp(current_kl / target_ - 1.0, -0.2, 0.2);
  value_ *= 1.0 + error * static_cast<double>(n_samples) / static_cast<double>(horizon_);
}

}  // namespace rlhf::ppo
