// Learning-rate schedules with HF transformers' definitions (what OpenRLHF uses): the lr of
// optimizer step k (0-based) is lr x lambda(k). Does not own an optimizer.
#pragma once

#include <cstdint>

#include "engine/trainer_config.h"

namespace rlhf::engine {

class LrSchedule {
 public:
  explicit LrSchedule(const TrainerConfig& config);

  // The learning rate for optimizer step `step` (0 = the first step).
  double lr_at(int64_t step) const;
  int64_t warmup_steps() const { return warmup_steps_; }

 private:
  LrScheduler kind_;
  double lr_;
  double min_lr_ratio_;
  int64_t total_steps_;
  int64_t warmup_steps_;
};

}  // namespace rlhf::engine
