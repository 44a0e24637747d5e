#include "ppo/masked.h"

namespace rlhf::ppo {

torch::Tensor masked_mean(const torch::Tensor& x, const torch::Tensor& mask) {
  auto m = mask.to(x.scalar_type());
  return (x * m).sum() / m.sum().clamp_min(1);
}

torch::Tensor masked_mean_rows(const torch::Tensor& x, const torch::Tensor& mask) {
  auto m = mask.to(x.scalar_type());
  return (x * m).sum(-1) / m.sum(-1).clamp_min(1);
}

}  // namespace rlhf::ppo
