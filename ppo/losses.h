// PPO-family training losses: the clipped policy loss (with separate low/high clips and
// dual clip), the clipped value loss, and the KL loss term. OpenRLHF's PolicyLoss/ValueLoss.
#pragma once

#include <torch/types.h>

#include <string>

#include "ppo/rollout_correction.h"

namespace rlhf::ppo {

enum class LossAggregation {
  kTokenMean,     // mean over every action token of the batch
  kSeqMean,       // mean over each sequence's tokens, then over sequences
  kTokenSumNorm,  // sum over every action token / (sequences x a constant length): Dr. GRPO
};
// "token_mean" | "seq_mean" | "token_sum_norm"; throws InputError otherwise.
LossAggregation parse_loss_aggregation(const std::string& name);
const char* loss_aggregation_name(LossAggregation aggregation);  // the inverse
// actor.loss_agg's "auto": token_sum_norm for dr_grpo (the estimator's normalisation), else
// token_mean; any other name is returned unchanged.
std::string resolve_loss_aggregation(const std::string& name, const std::string& estimator);

// Per-token losses [B, A] under action_mask [B, A] to a scalar:
//   token_mean:     sum(l * m) / sum(m)                  (OpenRLHF masked_mean, dim=None)
//   seq_mean:       mean_b(sum_t l m / sum_t m)          (OpenRLHF masked_mean, dim=-1, .mean())
//   token_sum_norm: sum(l * m) / (B * norm_len)          (Dr. GRPO, Liu et al. 2025, as TRL's
//                   loss_type="dr_grpo": (loss * mask).sum() / (B * max_completion_length))
// norm_len (the generation budget, rollout.max_new_tokens) is used only by token_sum_norm and
// must then be >= 1.
torch::Tensor aggregate_loss(const torch::Tensor& loss, const torch::Tensor& mask,
                             LossAggregation aggregation, int64_t norm_len = 0);

enum class PolicyRatio {
  kToken,     // PPO: one ratio per token
  kSequence,  // GSPO: one length-normalised ratio per sequence
};
// "ppo" | "gspo" (actor.policy_loss); throws InputError otherwise.
PolicyRatio parse_policy_ratio(const std::string& name);
const char* policy_ratio_name(PolicyRatio ratio);  // the inverse

struct PolicyLossConfig {
  PolicyRatio ratio = PolicyRatio::kToken;
  double clip_low = 0.2;  // ratio clipped to [1 - clip_low, 1 + clip_high]
  double clip_high = 0.2;
  double dual_clip = 0.0;  // c > 1 bounds the loss of negative advantages (0: off)
  LossAggregation aggregation = LossAggregation::kTokenMean;
  int64_t norm_len = 0;                // token_sum_norm's constant length (rollout.max_new_tokens)
  RolloutCorrectionConfig correction;  // algo.rollout_correction and its cap
};

struct PolicyLossResult {
  torch::Tensor loss;       // scalar, differentiable
  torch::Tensor clip_frac;  // scalar: share of action tokens where the clipped term won
  torch::Tensor approx_kl;  // scalar: mean of log pi_old - log pi over action tokens
};

// ratio = exp(log_probs - log_probs_old) per token (PPO), or with PolicyRatio::kSequence the
// GSPO ratio (Zheng et al. 2025, eq. 7), one per sequence and used at each of its tokens:
//   s_i = exp(sum_t m_t (log_probs - log_probs_old)_t / sum_t m_t)
// (OpenRLHF policy_loss_type="gspo"), so clipping acts on whole sequences;
// loss_t = -min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A);
// dual clip (Ye et al. 2020), for A < 0: loss_t = -max(min(...), c * A).
// A rollout correction (config.correction, not kNone) multiplies loss_t by a detached weight
// w_t from rollout_correction_weights(log_probs_old, log_probs_behaviour): with tis,
// veRL's pg_losses * tis_weights; with decoupled, AReaL's objective
//   loss_t = -(pi_prox / pi_behav) * min(r A, clip(r, 1 - eps_low, 1 + eps_high) A),
//   r = pi_theta / pi_prox,
// pi_prox being log_probs_old (the trainer's recomputed log-probs) and pi_behav the rollout's.
// All tensors [B, A]; action_mask [B, A]; log_probs_behaviour is read only with a correction,
// which throws c10::Error without it.
PolicyLossResult policy_loss(const PolicyLossConfig& config, const torch::Tensor& log_probs,
                             const torch::Tensor& log_probs_old, const torch::Tensor& advantages,
                             const torch::Tensor& action_mask,
                             const torch::Tensor& log_probs_behaviour = {});

// 0.5 * agg(max((V_clip - R)^2, (V - R)^2)), V_clip = V_old + clip(V - V_old, -c, c);
// unclipped 0.5 * agg((V - R)^2) when value_clip == 0. Tensors [B, A]. agg is aggregate_loss
// with the policy loss's setting, as OpenRLHF's ValueLoss follows token_level_loss.
torch::Tensor value_loss(const torch::Tensor& values, const torch::Tensor& values_old,
                         const torch::Tensor& returns, const torch::Tensor& action_mask,
                         double value_clip, LossAggregation aggregation, int64_t norm_len = 0);

// Mean per-token entropy of the policy over action tokens, from entropies [B, A].
torch::Tensor masked_entropy(const torch::Tensor& entropy, const torch::Tensor& action_mask);

}  // namespace rlhf::ppo
