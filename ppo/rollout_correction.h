// Rollout/trainer mismatch: per-token importance weights that correct the policy loss for
// samples drawn by the rollout engine (another kernel, dtype or a lagging weight version)
// rather than by the trainer's own policy, and the figures that measure the mismatch. The
// weights multiply the per-token loss in ppo/losses.cpp; nothing here is differentiable.
#pragma once

#include <torch/types.h>

#include <string>

namespace rlhf::ppo {

enum class RolloutCorrection {
  kNone,       // the ratio's denominator is log_probs_old alone (today's behaviour)
  kTis,        // truncated importance sampling: w = min(pi_old / pi_rollout, cap)
  kDecoupled,  // AReaL's decoupled PPO: w = pi_prox / pi_behav, untruncated
};
// "none" | "tis" | "decoupled" (algo.rollout_correction); throws InputError otherwise.
RolloutCorrection parse_rollout_correction(const std::string& name);
const char* rollout_correction_name(RolloutCorrection mode);  // the inverse

struct RolloutCorrectionConfig {
  RolloutCorrection mode = RolloutCorrection::kNone;
  double cap = 2.0;  // tis's C (veRL's tis_imp_ratio_cap); decoupled ignores it
};

// Per-token weights [B, A], detached, FP32, 1 outside action_mask:
//   tis (Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL
//   training"; veRL's tis_imp_ratio_cap):  w_t = min(exp(old_t - behav_t), cap)
//   decoupled (AReaL, Fu et al. 2025, the behaviour weight of the decoupled objective):
//                                          w_t = exp(prox_t - behav_t)
// with old / prox = log_probs_old, the trainer's recomputed log-probs, and behav =
// log_probs_behaviour, the rollout's. The log-ratio is clamped to <= 20 before exp so a
// stray token cannot overflow to inf (e^20 is far beyond any cap). kNone: all ones.
// Tensors [B, A]; throws c10::Error on mismatched shapes.
torch::Tensor rollout_correction_weights(const RolloutCorrectionConfig& config,
                                         const torch::Tensor& log_probs_old,
                                         const torch::Tensor& log_probs_behaviour,
                                         const torch::Tensor& action_mask);

// The step's mismatch over its action tokens (token means, like veRL's rollout_corr metrics).
struct RolloutMismatch {
  // k3 estimate of KL(pi_rollout || pi_train) from the rollout's samples
  // (http://joschu.net/blog/kl-approx.html): r = exp(old - behav), k3 = r - 1 - log r, in
  // FP64 and unclamped (algo.kl's approx_kl is FP32 and clamps to 10).
  double kl = 0;
  double weight_mean = 1, weight_max = 1;  // of the weights the loss applies (1 for kNone)
  double truncated = 0;                    // tis: share of tokens whose ratio exceeded cap
};
RolloutMismatch measure_rollout_mismatch(const RolloutCorrectionConfig& config,
                                         const torch::Tensor& log_probs_old,
                                         const torch::Tensor& log_probs_behaviour,
                                         const torch::Tensor& action_mask);

}  // namespace rlhf::ppo
