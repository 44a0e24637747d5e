// Preference and supervised losses: the DPO family (sigmoid/cDPO, IPO, hinge, SimPO) on
// per-sequence log-probabilities, the pairwise reward-model losses, and the SFT loss.
// Definitions as OpenRLHF (DPOLoss, PairWiseLoss, LogExpLoss) and TRL (hinge, SimPO).
#pragma once

#include <torch/types.h>

#include <string>

namespace rlhf::dpo {

enum class DpoLossType { kSigmoid, kIpo, kHinge, kSimpo };
// "sigmoid" | "ipo" | "hinge" | "simpo"; throws InputError otherwise.
DpoLossType parse_dpo_loss(const std::string& name);
bool needs_reference(DpoLossType type);  // false for simpo

struct DpoLossConfig {
  DpoLossType type = DpoLossType::kSigmoid;
  double beta = 0.1;
  double label_smoothing = 0.0;  // cDPO (sigmoid only)
  double simpo_gamma = 0.5;      // SimPO target margin
  double nll_loss_coef = 0.0;    // weight of -mean log-prob per token of chosen responses
};

// Per-pair sequence log-probabilities [P] (sums over response tokens; SimPO uses the
// length-normalised averages, so pass averages for it) and response lengths for the NLL term.
struct PairLogProbs {
  torch::Tensor chosen;         // [P] log pi(y_w|x)   (sum, or average for simpo)
  torch::Tensor rejected;       // [P] log pi(y_l|x)
  torch::Tensor ref_chosen;     // [P] log pi_ref(y_w|x); undefined for simpo
  torch::Tensor ref_rejected;   // [P]
  torch::Tensor chosen_tokens;  // [P] response lengths of chosen (for the NLL term); optional
};

struct DpoLossResult {
  torch::Tensor loss;              // scalar, differentiable
  torch::Tensor chosen_rewards;    // [P] beta * (log pi - log pi_ref) of chosen, detached
  torch::Tensor rejected_rewards;  // [P]
  torch::Tensor accuracy;          // scalar: share of pairs with chosen reward > rejected
  torch::Tensor margin;            // scalar: mean(chosen_rewards - rejected_rewards)
};

// With h = (chosen - rejected) - (ref_chosen - ref_rejected):
//   sigmoid: -(1 - ls) * logsigmoid(beta * h) - ls * logsigmoid(-beta * h)   (DPO eq. 7; cDPO)
//   ipo:     (h - 1 / (2 beta))^2                                            (IPO eq. 17)
//   hinge:   relu(1 - beta * h)                                              (SLiC, as TRL)
//   simpo:   -logsigmoid(beta * (avg_chosen - avg_rejected) - gamma)         (SimPO eq. 6)
// plus nll_loss_coef * mean(-chosen / chosen_tokens).
DpoLossResult dpo_loss(const DpoLossConfig& config, const PairLogProbs& lp);

enum class RmLossType { kSigmoid, kLogExp };
RmLossType parse_rm_loss(const std::string& name);

// Pairwise reward-model loss over scores [P]:
//   sigmoid: mean(-logsigmoid(r_chosen - r_rejected - margin))   (margin [P] or undefined)
//   logexp:  mean(log(1 + exp(r_rejected - r_chosen)))            (Askell et al. 2021),
//            computed as softplus so a large gap gives the gap, not inf
torch::Tensor rm_loss(RmLossType type, const torch::Tensor& chosen_scores,
                      const torch::Tensor& rejected_scores, const torch::Tensor& margin = {});

// SFT: mean negative log-likelihood of the response tokens: log_probs [B, T] of the target
// tokens, loss_mask [B, T] (1 on response tokens, 0 on prompt and padding).
torch::Tensor sft_loss(const torch::Tensor& log_probs, const torch::Tensor& loss_mask);

}  // namespace rlhf::dpo
