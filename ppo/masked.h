// Masked reductions over action tokens, shared by the PPO-family math.
#pragma once

#include <torch/types.h>

namespace rlhf::ppo {

// sum(x * mask) / sum(mask) over every element (OpenRLHF masked_mean with dim=None).
// The denominator is clamped to 1 so an all-zero mask gives 0, not NaN.
torch::Tensor masked_mean(const torch::Tensor& x, const torch::Tensor& mask);
// The same per row: [B, A] -> [B].
torch::Tensor masked_mean_rows(const torch::Tensor& x, const torch::Tensor& mask);

}  // namespace rlhf::ppo
