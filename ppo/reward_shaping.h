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

// DAPO overlong reward shaping (Yu et al. 2025, eq. 13), as OpenRLHF's overlong_buffer_len /
// overlong_penalty_factor: with L_max = max_new_tokens, a buffer of L_c tokens and
// expected = L_max - L_c,
//   penalty = -min(len - expected, L_c) / L_c * factor   when len > expected, else 0,
// added to the score before any group baseline. response_length [B] -> penalties [B] FP32
// (<= 0); buffer_len 0 gives zeros.
torch::Tensor overlong_penalty(const torch::Tensor& response_length, int64_t max_new_tokens,
                               int64_t buffer_len, double factor);

// DAPO dynamic sampling (Yu et al. 2025, eq. 11: keep groups with 0 < |correct| < G): the
// groups of n consecutive scores [G * n] that are not all equal, i.e. that carry a
// group-relative signal. Returns the kept group indices [k] int64, ascending.
torch::Tensor groups_with_distinct_scores(const torch::Tensor& scores, int64_t n);

}  // namespace rlhf::ppo
