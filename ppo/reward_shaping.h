// From sequence scores to per-token rewards: per-prompt group baselines (RLOO, REINFORCE++
// baseline, GRPO, Dr. GRPO), clipping, placing the score at the last action token, and the
// per-token KL penalty. Matches OpenRLHF's compute_advantages_and_returns + compute_reward.
#pragma once

#include <torch/types.h>

#include <string>

namespace rlhf::ppo {

enum class AdvantageEstimator { kGae, kReinforce, kRloo, kReinforceBaseline, kGroupNorm, kDrGrpo };

// "gae", "reinforce", "rloo", "reinforce_baseline", "group_norm" (alias "grpo"), "dr_grpo".
AdvantageEstimator parse_advantage_estimator(const std::string& name);
const char* advantage_estimator_name(AdvantageEstimator e);
bool uses_critic(AdvantageEstimator e);          // gae
bool uses_group_baseline(AdvantageEstimator e);  // rloo, reinforce_baseline, group_norm, dr_grpo
bool whitens_advantages(AdvantageEstimator e);   // gae, reinforce, reinforce_baseline

// Per-prompt baseline over scores [P * n] (the n samples of a prompt are consecutive):
//   rloo:               r_i - (sum_j r_j - r_i) / (n - 1)
//   reinforce_baseline,
//   dr_grpo:            r_i - mean_j r_j
//   group_norm (GRPO):  (r_i - mean_j r_j) / (std_j r_j + 1e-9)   (std unbiased, as torch)
// Other estimators return the scores unchanged.
torch::Tensor apply_group_baseline(const torch::Tensor& scores, int64_t n_samples_per_prompt,
                                   AdvantageEstimator estimator);

// Index of each row's last action token: [B, A] mask -> [B] (int64).
torch::Tensor last_action_index(const torch::Tensor& action_mask);

// Per-token rewards [B, A]: the clipped score at each response's last action token, plus
// -kl_coef * kl at every token (OpenRLHF compute_reward). kl [B, A] may be undefined (no KL).
torch::Tensor shape_rewards(const torch::Tensor& scores, const torch::Tensor& kl,
                            const torch::Tensor& action_mask, double kl_coef, double clip_low,
                            double clip_high);

}  // namespace rlhf::ppo
