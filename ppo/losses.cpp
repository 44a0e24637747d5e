#include "ppo/losses.h"

#include <algorithm>

#include "core/errors.h"
#include "ppo/masked.h"

namespace rlhf::ppo {

LossAggregation parse_loss_aggregation(const std::string& name) {
  if (name == "token_mean") return LossAggregation::kTokenMean;
  if (name == "seq_mean") return LossAggregation::kSeqMean;
  if (name == "token_sum_norm") return LossAggregation::kTokenSumNorm;
  throw InputError(
      "actor.loss_agg: expected auto, token_mean, seq_mean or token_sum_norm, found \"" + name +
      "\"");
}

const char* loss_aggregation_name(LossAggregation aggregation) {
  switch (aggregation) {
    case LossAggregation::kTokenMean:
      return "token_mean";
    case LossAggregation::kSeqMean:
      return "seq_mean";
    case LossAggregation::kTokenSumNorm:
      return "token_sum_norm";
  }
  return "?";
}

const char* policy_ratio_name(PolicyRatio ratio) {
  return ratio == PolicyRatio::kSequence ? "gspo" : "ppo";
}

std::string resolve_loss_aggregation(const std::string& name, const std::string& estimator) {
  if (name != "auto") return name;
  return estimator == "dr_grpo" ? "token_sum_norm" : "token_mean";
}

PolicyRatio parse_policy_ratio(const std::string& name) {
  if (name == "ppo") return PolicyRatio::kToken;
  if (name == "gspo") return PolicyRatio::kSequence;
  throw InputError("actor.policy_loss: expected ppo or gspo, found \"" + name + "\"");
}

torch::Tensor aggregate_loss(const torch::Tensor& loss, const torch::Tensor& mask,
                             LossAggregation aggregation, int64_t norm_len) {
  switch (aggregation) {
    case LossAggregation::kTokenMean:
      return masked_mean(loss, mask);
    case LossAggregation::kSeqMean:
      return masked_mean_rows(loss, mask).mean();
    case LossAggregation::kTokenSumNorm:
      break;
  }
  TORCH_CHECK(norm_len >= 1, "aggregate_loss: token_sum_norm needs a length >= 1, got ", norm_len);
  return (loss * mask.to(loss.scalar_type())).sum() /
         static_cast<double>(std::max<int64_t>(1, loss.size(0)) * norm_len);
}

PolicyLossResult policy_loss(const PolicyLossConfig& config, const torch::Tensor& log_probs,
                             const torch::Tensor& log_probs_old, const torch::Tensor& advantages,
                             const torch::Tensor& action_mask,
                             const torch::Tensor& log_probs_behaviour) {
  TORCH_CHECK(log_probs.sizes() == log_probs_old.sizes() &&
                  log_probs.sizes() == advantages.sizes() &&
                  log_probs.sizes() == action_mask.sizes(),
              "policy_loss: expected [B, A] tensors of one shape, got ", log_probs.sizes(), ", ",
              log_probs_old.sizes(), ", ", advantages.sizes(), ", ", action_mask.sizes());
  torch::Tensor log_ratio = log_probs.to(torch::kFloat32) - log_probs_old.to(torch::kFloat32);
  torch::Tensor ratio;
  if (config.ratio == PolicyRatio::kSequence) {
    // The sequence's mean log-ratio over its action tokens, the same at each of them; its
    // gradient reaches every token with weight s_i / |y_i|, as GSPO's eq. 10.
    ratio = masked_mean_rows(log_ratio, action_mask).exp().unsqueeze(1).expand_as(log_ratio);
  } else {
    ratio = log_ratio.exp();
  }
  torch::Tensor adv = advantages.to(torch::kFloat32);
  torch::Tensor surr1 = ratio * adv;
  torch::Tensor surr2 = ratio.clamp(1.0 - config.clip_low, 1.0 + config.clip_high) * adv;
  torch::Tensor clipped = torch::min(surr1, surr2);
  torch::Tensor loss;
  if (config.dual_clip > 1.0) {
    torch::Tensor lower = torch::max(clipped, config.dual_clip * adv);
    loss = -torch::where(adv < 0, lower, clipped);
  } else {
    loss = -clipped;
  }
  if (config.correction.mode != RolloutCorrection::kNone) {
    TORCH_CHECK(log_probs_behaviour.defined(),
                "policy_loss: a rollout correction needs the rollout's log-probs");
    loss = loss * rollout_correction_weights(config.correction, log_probs_old, log_probs_behaviour,
                                             action_mask);
  }
  PolicyLossResult out;
  out.loss = aggregate_loss(loss, action_mask, config.aggregation, config.norm_len);
  out.clip_frac = masked_mean(torch::lt(surr2, surr1).to(torch::kFloat32), action_mask).detach();
  out.approx_kl = masked_mean(-log_ratio.detach(), action_mask);
  return out;
}

torch::Tensor value_loss(const torch::Tensor& values, const torch::Tensor& values_old,
                         const torch::Tensor& returns, const torch::Tensor& action_mask,
                         double value_clip, LossAggregation aggregation, int64_t norm_len) {
  TORCH_CHECK(values.sizes() == values_old.sizes() && values.sizes() == returns.sizes(),
              "value_loss: expected [B, A] tensors of one shape, got ", values.sizes(), ", ",
              values_old.sizes(), ", ", returns.sizes());
  torch::Tensor v = values.to(torch::kFloat32);
  torch::Tensor r = returns.to(torch::kFloat32);
  torch::Tensor loss;
  if (value_clip > 0) {
    torch::Tensor v_old = values_old.to(torch::kFloat32);
    torch::Tensor v_clipped = v_old + (v - v_old).clamp(-value_clip, value_clip);
    loss = torch::max((v_clipped - r).pow(2), (v - r).pow(2));
  } else {
    loss = (v - r).pow(2);
  }
  return 0.5 * aggregate_loss(loss, action_mask, aggregation, norm_len);
}

torch::Tensor masked_entropy(const torch::Tensor& entropy, const torch::Tensor& action_mask) {
  return masked_mean(entropy.to(torch::kFloat32), action_mask);
}

}  // namespace rlhf::ppo
