// Preference and supervised losses: the DPO family (sigmoid/cDPO, IPO, hinge, SimPO, ORPO;
// KTO on unpaired rows) on per-sequence log-probabilities, the pairwise reward-model losses,
// and the SFT loss. Definitions as OpenRLHF (DPOLoss, KTOLoss, PairWiseLoss, LogExpLoss) and
// TRL (hinge, SimPO, ORPO).
#pragma once

#include <torch/types.h>

#include <string>

namespace rlhf::dpo {

enum class DpoLossType { kSigmoid, kIpo, kHinge, kSimpo, kOrpo, kKto };
// "sigmoid" | "ipo" | "hinge" | "simpo" | "orpo" | "kto"; throws InputError otherwise.
DpoLossType parse_dpo_loss(const std::string& name);
const char* dpo_loss_name(DpoLossType type);  // the inverse
bool needs_reference(DpoLossType type);       // false for simpo and orpo
// True for the losses that compare length-normalised mean token log-probs (simpo, orpo).
bool uses_mean_log_probs(DpoLossType type);

struct DpoLossConfig {
  DpoLossType type = DpoLossType::kSigmoid;
  double beta = 0.1;
  double label_smoothing = 0.0;  // cDPO (sigmoid only)
  double simpo_gamma = 0.5;      // SimPO target margin
  double orpo_lambda = 0.1;      // ORPO weight of the odds-ratio term (TRL's beta)
  double nll_loss_coef = 0.0;    // weight of -mean log-prob per token of chosen responses
};

// Per-pair sequence log-probabilities [P] (sums over response tokens; SimPO and ORPO use the
// length-normalised averages, so pass averages for them) and response lengths for the NLL term.
struct PairLogProbs {
  torch::Tensor chosen;         // [P] log pi(y_w|x)   (sum, or average for simpo)
  torch::Tensor rejected;       // [P] log pi(y_l|x)
  torch::Tensor ref_chosen;     // [P] log pi_ref(y_w|x); undefined for simpo and orpo
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
//   orpo:    -avg_chosen - lambda * logsigmoid(log_odds(avg_chosen) - log_odds(avg_rejected)),
//            log_odds(p) = p - log(1 - exp(p))    (ORPO eqs. 4-7; TRL odds_ratio_loss), the
//            first term being the SFT NLL per token of chosen; rewards are beta * avg
// plus nll_loss_coef * mean(-chosen / chosen_tokens) (per-token already for simpo and orpo).
// Throws InputError for kto (unpaired: use kto_loss).
DpoLossResult dpo_loss(const DpoLossConfig& config, const PairLogProbs& lp);

struct KtoLossConfig {
  double beta = 0.1;
  double desirable_weight = 1.0;    // lambda_D
  double undesirable_weight = 1.0;  // lambda_U
};

// Unpaired rows [N], each desirable or not, and either the KL reference point z0 or N
// mismatched rows (row i's prompt with another row's response) to estimate it from. All sums
// over response tokens.
struct KtoLogProbs {
  torch::Tensor policy;     // [N] log pi(y_i|x_i)
  torch::Tensor ref;        // [N] log pi_ref(y_i|x_i)
  torch::Tensor desirable;  // [N] bool: true for desirable rows
  torch::Tensor policy_kl;  // [N] log pi(y_j|x_i), j != i (read only without z0)
  torch::Tensor ref_kl;     // [N] log pi_ref(y_j|x_i)     (read only without z0)
  torch::Tensor z0;         // scalar: the reference point of a larger batch (undefined: estimate)
};

struct KtoLossResult {
  torch::Tensor loss;              // scalar, differentiable
  torch::Tensor chosen_rewards;    // [D] beta * (log pi - log pi_ref) of desirable rows, detached
  torch::Tensor rejected_rewards;  // [U] the same for undesirable rows
  torch::Tensor kl;                // scalar z0 (detached, >= 0)
};

// KTO as OpenRLHF's KTOLoss (KTO paper eq. 8), with r_i = log pi(y_i|x_i) - log pi_ref(y_i|x_i):
//   z0 = max(0, mean_i(policy_kl_i - ref_kl_i)), detached (no gradient through the reference point)
//   desirable:   desirable_weight   * (1 - sigmoid(beta * (r_i - z0)))
//   undesirable: undesirable_weight * (1 - sigmoid(beta * (z0 - r_i)))
//   loss = mean over all N rows.
// z0 is lp.z0 when given, else the mean over the mismatched rows passed in. A trainer passes
// the global batch's (kto_reference_point over every rank and micro batch), as OpenRLHF
// all-reduces it over data-parallel ranks, so the micro-batch size and the rank count do not
// change it.
KtoLossResult kto_loss(const KtoLossConfig& config, const KtoLogProbs& lp);

// z0 = max(0, mean_kl), detached, FP32: mean_kl is the mean of policy_kl - ref_kl over the
// mismatched rows of the batch z0 stands for.
torch::Tensor kto_reference_point(const torch::Tensor& mean_kl);

enum class RmLossType { kSigmoid, kLogExp };
RmLossType parse_rm_loss(const std::string& name);
const char* rm_loss_name(RmLossType type);  // the inverse

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
