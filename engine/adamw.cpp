// The AdamW update on a flat shard.
#include "engine/adamw.h"

#include <cmath>
#include <string>

namespace rlhf::engine {

void adamw_update(torch::Tensor& master, torch::Tensor& exp_avg, torch::Tensor& exp_avg_sq,
                  const torch::Tensor& grad, const DecayRanges& decay, const AdamWStep& hp) {
  TORCH_CHECK(master.scalar_type() == torch::kFloat && grad.scalar_type() == torch::kFloat &&
                  exp_avg.scalar_type() == torch::kFloat &&
                  exp_avg_sq.scalar_type() == torch::kFloat,
              "adamw_update: all tensors must be FP32");
  TORCH_CHECK(master.numel() == grad.numel() && master.numel() == exp_avg.numel() &&
                  master.numel() == exp_avg_sq.numel(),
              "adamw_update: shard sizes differ: ", master.numel(), " ", grad.numel());
  torch::NoGradGuard no_grad;
  if (hp.weight_decay != 0.0) {
    for (const auto& [begin, end] : decay)
      master.narrow(0, begin, end - begin).mul_(1.0 - hp.lr * hp.weight_decay);
  }
  exp_avg.mul_(hp.beta1).add_(grad, 1.0 - hp.beta1);
  exp_avg_sq.mul_(hp.beta2).addcmul_(grad, grad, 1.0 - hp.beta2);
  const double bias_correction1 = 1.0 - std::pow(hp.beta1, static_cast<double>(hp.step));
  const double bias_correction2 = 1.0 - std::pow(hp.beta2, static_cast<double>(hp.step));
  auto denom = (exp_avg_sq.sqrt() / std::sqrt(bias_correction2)).add_(hp.eps);
  master.addcdiv_(exp_avg, denom, -hp.lr / bias_correction1);
}

bool takes_weight_decay(const std::string& param_name) {
  static const char* kNoDecay[] = {"bias", "layer_norm.weight", "layernorm.weight", "norm.weight",
                                   "ln_f.weight"};
  for (const char* pattern : kNoDecay) {
    if (param_name.find(pattern) != std::string::npos) return false;
  }
  return true;
}

}  // namespace rlhf::engine
