#include "ppo/advantages.h"

namespace rlhf::ppo {

AdvantagesAndReturns gae(const torch::Tensor& values, const torch::Tensor& rewards,
                         const torch::Tensor& action_mask, double gamma, double lambd) {
  TORCH_CHECK(values.sizes() == rewards.sizes() && rewards.sizes() == action_mask.sizes(),
              "gae: values, rewards and action_mask must have one shape [B, A], got ",
              values.sizes(), ", ", rewards.sizes(), ", ", action_mask.sizes());
  // veRL's compute_gae_advantage_return (verl/trainer/ppo/core_algos.py), which steps over
  // tokens outside the mask (a multi-turn trajectory's environment tokens): at model tokens
  //   delta_t = r_t + gamma V_next - V_t,  A_t = delta_t + gamma lambda A_next,
  // where V_next and A_next are those of the next model token (0 after the last one); at
  // other tokens V_next and A_next carry over unchanged. With the mask a prefix (one turn)
  // this is OpenRLHF's get_advantages_and_returns. A and returns are 0 off the mask.
  torch::Tensor m = action_mask.to(torch::kFloat32);
  torch::Tensor v = values.to(torch::kFloat32) * m;
  torch::Tensor r = rewards.to(torch::kFloat32) * m;
  const int64_t a = r.size(1);
  torch::Tensor adv = torch::zeros_like(r);
  torch::Tensor last = torch::zeros({r.size(0)}, r.options());
  torch::Tensor next_v = torch::zeros_like(last);
  for (int64_t t = a - 1; t >= 0; --t) {
    const torch::Tensor mt = m.select(1, t), vt = v.select(1, t);
    const torch::Tensor delta = r.select(1, t) + gamma * next_v - vt;
    last = mt * (delta + gamma * lambd * last) + (1 - mt) * last;
    next_v = mt * vt + (1 - mt) * next_v;
    adv.select(1, t).copy_(last * mt);
  }
  return {adv, adv + v};
}

torch::Tensor cumulative_returns(const torch::Tensor& rewards, const torch::Tensor& action_mask,
                                 double gamma) {
  // G_t = r_t + gamma G_next over model tokens; environment tokens (off the mask) between
  // turns neither add nor discount.
  const torch::Tensor m = action_mask.to(torch::kFloat32);
  torch::Tensor r = rewards.to(torch::kFloat32) * m;
  torch::Tensor returns = torch::zeros_like(r);
  torch::Tensor g = torch::zeros({r.size(0)}, r.options());
  for (int64_t t = r.size(1) - 1; t >= 0; --t) {
    const torch::Tensor mt = m.select(1, t);
    g = mt * (r.select(1, t) + gamma * g) + (1 - mt) * g;
    returns.select(1, t).copy_(g * mt);
  }
  return returns;
}

torch::Tensor whiten(const torch::Tensor& advantages, const torch::Tensor& action_mask) {
  torch::Tensor m = action_mask.to(torch::kFloat32);
  torch::Tensor n = m.sum().clamp_min(1);
  torch::Tensor mean = (advantages * m).sum() / n;
  torch::Tensor var = ((advantages - mean).pow(2) * m).sum() / n;
  return (advantages - mean) * var.clamp_min(1e-8).rsqrt();
}

BatchAdvantages compute_advantages(const AdvantageConfig& config, const torch::Tensor& scores,
                                   const torch::Tensor& kl, double kl_coef,
                                   const torch::Tensor& values, const torch::Tensor& action_mask) {
  BatchAdvantages out;
  torch::Tensor baselined =
      apply_group_baseline(scores, config.n_samples_per_prompt, config.estimator);
  out.rewards = shape_rewards(baselined, kl, action_mask, kl_coef, config.reward_clip_low,
                              config.reward_clip_high);
  if (config.estimator == AdvantageEstimator::kGae) {
    TORCH_CHECK(values.defined(), "compute_advantages: gae needs the critic's values");
    auto ar = gae(values, out.rewards, action_mask, config.gamma, config.lambd);
    out.advantages = ar.advantages;
    out.returns = ar.returns;
  } else {
    double gamma = uses_group_baseline(config.estimator) ? 1.0 : config.gamma;
    out.returns = cumulative_returns(out.rewards, action_mask, gamma);
    out.advantages = out.returns.clone();
  }
  if (whitens_advantages(config.estimator)) out.advantages = whiten(out.advantages, action_mask);
  return out;
}

}  // namespace rlhf::ppo
