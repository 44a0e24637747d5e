// Advantages and returns from per-token rewards: GAE, discounted returns (REINFORCE++ and the
// group estimators), and whitening over a batch's action tokens. OpenRLHF's definitions.
#pragma once

#include <torch/types.h>

#include "ppo/reward_shaping.h"

namespace rlhf::ppo {

struct AdvantagesAndReturns {
  torch::Tensor advantages;  // [B, A] FP32, zero outside the action mask
  torch::Tensor returns;     // [B, A] FP32 (critic targets for gae)
};

// Generalised advantage estimation (Schulman et al. 2016), rewards and values masked:
//   delta_t = r_t + gamma * V_{t+1} - V_t   (V_A = 0)
//   A_t = delta_t + gamma * lambda * A_{t+1};   returns = A + V.
// t + 1 is the next token in the action mask: tokens outside it inside a response (a
// multi-turn trajectory's environment turns) are skipped, as veRL's
// compute_gae_advantage_return; A and returns are 0 there.
AdvantagesAndReturns gae(const torch::Tensor& values, const torch::Tensor& rewards,
                         const torch::Tensor& action_mask, double gamma, double lambd);

// G_t = r_t + gamma * G_{t+1} over masked rewards [B, A], t + 1 the next masked token
// (environment tokens between turns neither add nor discount); 0 off the mask.
torch::Tensor cumulative_returns(const torch::Tensor& rewards, const torch::Tensor& action_mask,
                                 double gamma);

// (A - mean) / sqrt(max(var, 1e-8)) with mean and (biased) variance over masked tokens.
torch::Tensor whiten(const torch::Tensor& advantages, const torch::Tensor& action_mask);

struct AdvantageConfig {
  AdvantageEstimator estimator = AdvantageEstimator::kGae;
  double gamma = 1.0;
  double lambd = 0.95;
  int64_t n_samples_per_prompt = 1;
  double reward_clip_low = -10.0;
  double reward_clip_high = 10.0;
};

struct BatchAdvantages {
  torch::Tensor rewards;     // [B, A] shaped per-token rewards
  torch::Tensor advantages;  // [B, A] (whitened for gae/reinforce/reinforce_baseline)
  torch::Tensor returns;     // [B, A]
};

// The whole step: group baseline on scores [B] -> shaped rewards (clip, KL penalty with
// coefficient kl_coef on kl [B, A], undefined for none) -> gae (values [B, A]) or discounted
// returns (gamma forced to 1 for group estimators, as OpenRLHF) -> whitening.
BatchAdvantages compute_advantages(const AdvantageConfig& config, const torch::Tensor& scores,
                                   const torch::Tensor& kl, double kl_coef,
                                   const torch::Tensor& values, const torch::Tensor& action_mask);

}  // namespace rlhf::ppo
