// HF's schedule lambdas (transformers/optimization.py), warmup as OpenRLHF computes it.
#include "engine/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace rlhf::engine {

LrSchedule::LrSchedule(const TrainerConfig& config)
    : kind_(config.lr_scheduler),
      lr_(config.lr),
      min_lr_ratio_(config.min_lr_ratio),
      total_steps_(config.total_steps),
      // OpenRLHF: num_warmup_steps = math.ceil(max_steps * lr_warmup_ratio)
      warmup_steps_(static_cast<int64_t>(std::ceil(config.total_steps * config.warmup_ratio))) {}

double LrSchedule::lr_at(int64_t step) const {
  const double warmup = static_cast<double>(step) / std::max<int64_t>(1, warmup_steps_);
  switch (kind_) {
    case LrScheduler::kConstant:
      return lr_;
    case LrScheduler::kConstantWithWarmup:
      return step < warmup_steps_ ? lr_ * warmup : lr_;
    case LrScheduler::kCosineWithMinLr: {
      if (step < warmup_steps_) return lr_ * warmup;
      // _get_cosine_with_min_lr_schedule_with_warmup_lr_lambda with num_cycles = 0.5:
      // factor = 0.5 (1 + cos(pi * 2 * 0.5 * progress)) * (1 - min_lr_rate) + min_lr_rate
      const double progress = static_cast<double>(step - warmup_steps_) /
                              std::max<int64_t>(1, total_steps_ - warmup_steps_);
      double factor = 0.5 * (1.0 + std::cos(M_PI * progress));
      factor = factor * (1.0 - min_lr_ratio_) + min_lr_ratio_;
      return lr_ * std::max(0.0, factor);
    }
  }
  return lr_;
}

}  // namespace rlhf::engine
