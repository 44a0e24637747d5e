// AdamW (Loshchilov & Hutter, decoupled weight decay) on one flat FP32 shard, with
// PyTorch's torch.optim.AdamW update order. It does not clip, schedule or communicate.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace rlhf::engine {

struct AdamWStep {
  double lr = 0.0;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.0;
  int64_t step = 1;  // 1-based count, for bias correction
};

// Element ranges [begin, end) of a shard that get weight decay.
using DecayRanges = std::vector<std::pair<int64_t, int64_t>>;

// One update, in place:
//   p <- p (1 - lr wd)                  (only inside `decay`)
//   m <- b1 m + (1 - b1) g;   v <- b2 v + (1 - b2) g^2
//   p <- p - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// master, exp_avg, exp_avg_sq, grad: [n] FP32 contiguous on one device.
void adamw_update(torch::Tensor& master, torch::Tensor& exp_avg, torch::Tensor& exp_avg_sq,
                  const torch::Tensor& grad, const DecayRanges& decay, const AdamWStep& hp);

// OpenRLHF's no-decay rule (get_optimizer_grouped_parameters): biases and norm weights.
bool takes_weight_decay(const std::string& param_name);

}  // namespace rlhf::engine
