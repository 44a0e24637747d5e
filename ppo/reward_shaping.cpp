#include "ppo/reward_shaping.h"

#include "core/errors.h"

namespace rlhf::ppo {

AdvantageEstimator parse_advantage_estimator(const std::string& name) {
  if (name == "gae") return AdvantageEstimator::kGae;
  if (name == "reinforce") return AdvantageEstimator::kReinforce;
  if (name == "rloo") return AdvantageEstimator::kRloo;
  if (name == "reinforce_baseline") return AdvantageEstimator::kReinforceBaseline;
  if (name == "group_norm" || name == "grpo") return AdvantageEstimator::kGroupNorm;
  if (name == "dr_grpo") return AdvantageEstimator::kDrGrpo;
  throw InputError("algo.advantage.estimator: unknown estimator \"" + name + "\"");
}

const char* advantage_estimator_name(AdvantageEstimator e) {
  switch (e) {
    case AdvantageEstimator::kGae:
      return "gae";
    case AdvantageEstimator::kReinforce:
      return "reinforce";
    case AdvantageEstimator::kRloo:
      return "rloo";
    case AdvantageEstimator::kReinforceBaseline:
      return "reinforce_baseline";
    case AdvantageEstimator::kGroupNorm:
      return "group_norm";
    case AdvantageEstimator::kDrGrpo:
      return "dr_grpo";
  }
  return "?";
}

bool uses_critic(AdvantageEstimator e) {
  return e == AdvantageEstimator::kGae;
}

bool uses_group_baseline(AdvantageEstimator e) {
  return e == AdvantageEstimator::kRloo || e == AdvantageEstimator::kReinforceBaseline ||
         e == AdvantageEstimator::kGroupNorm || e == AdvantageEstimator::kDrGrpo;
}

bool whitens_advantages(AdvantageEstimator e) {
  return e == AdvantageEstimator::kGae || e == AdvantageEstimator::kReinforce ||
         e == AdvantageEstimator::kReinforceBaseline;
}

torch::Tensor apply_group_baseline(const torch::Tensor& scores, int64_t n,
                                   AdvantageEstimator estimator) {
  if (!uses_group_baseline(estimator)) return scores;
  TORCH_CHECK(scores.dim() == 1 && n >= 2 && scores.size(0) % n == 0,
              "group baseline: expected [prompts * n] scores with n >= 2, got ", scores.sizes(),
              " and n = ", n);
  torch::Tensor r = scores.to(torch::kFloat32).reshape({-1, n});
  torch::Tensor out;
  switch (estimator) {
    case AdvantageEstimator::kRloo:
      out = r - (r.sum(-1, /*keepdim=*/true) - r) / static_cast<double>(n - 1);
      break;
    case AdvantageEstimator::kReinforceBaseline:
    case AdvantageEstimator::kDrGrpo:
      out = r - r.mean(-1, /*keepdim=*/true);
      break;
    default:  // group_norm
      out = (r - r.mean(-1, true)) / (r.std(-1, /*unbiased=*/true, /*keepdim=*/true) + 1e-9);
  }
  return out.reshape({-1});
}

torch::Tensor last_action_index(const torch::Tensor& action_mask) {
  // A - 1 - argmax(flip(mask)): the position of the last 1 in each row.
  const int64_t a = action_mask.size(1);
  return (a - 1) - action_mask.to(torch::kLong).flip({1}).argmax(1);
}

torch::Tensor shape_rewards(const torch::Tensor& scores, const torch::Tensor& kl,
                            const torch::Tensor& action_mask, double kl_coef, double clip_low,
                            double clip_high) {
  TORCH_CHECK(action_mask.dim() == 2 && scores.dim() == 1 && scores.size(0) == action_mask.size(0),
              "shape_rewards: expected scores [B] and action_mask [B, A], got ", scores.sizes(),
              " and ", action_mask.sizes());
  auto opts = torch::TensorOptions().dtype(torch::kFloat32).device(action_mask.device());
  torch::Tensor r = scores.to(torch::kFloat32).clamp(clip_low, clip_high);
  torch::Tensor rewards = torch::zeros(action_mask.sizes(), opts);
  rewards.scatter_(1, last_action_index(action_mask).unsqueeze(1), r.unsqueeze(1));
  if (kl.defined() && kl_coef > 0) rewards = rewards - kl_coef * kl.to(torch::kFloat32);
  return rewards;
}

torch::Tensor overlong_penalty(const torch::Tensor& response_length, int64_t max_new_tokens,
                               int64_t buffer_len, double factor) {
  TORCH_CHECK(response_length.dim() == 1, "overlong_penalty: expected lengths [B], got ",
              response_length.sizes());
  TORCH_CHECK(buffer_len >= 0 && buffer_len <= max_new_tokens,
              "overlong_penalty: buffer length must be in [0, max_new_tokens = ", max_new_tokens,
              "], got ", buffer_len);
  torch::Tensor len = response_length.to(torch::kFloat64);
  if (buffer_len == 0) return torch::zeros(len.sizes(), torch::kFloat32);
  const double expected = static_cast<double>(max_new_tokens - buffer_len);
  const double buffer = static_cast<double>(buffer_len);
  torch::Tensor exceed = (len - expected).clamp(0.0, buffer);
  return (-exceed / buffer * factor).to(torch::kFloat32);
}

torch::Tensor groups_with_distinct_scores(const torch::Tensor& scores, int64_t n) {
  TORCH_CHECK(scores.dim() == 1 && n >= 1 && scores.size(0) % n == 0,
              "groups_with_distinct_scores: expected [groups * n] scores, got ", scores.sizes(),
              " and n = ", n);
  torch::Tensor r = scores.to(torch::kFloat64).reshape({-1, n});
  torch::Tensor spread = std::get<0>(r.max(1)) - std::get<0>(r.min(1));
  return torch::nonzero(spread > 0).reshape({-1}).to(torch::kLong);
}

}  // namespace rlhf::ppo
