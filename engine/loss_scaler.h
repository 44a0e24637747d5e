// Dynamic loss scaling for FP16 compute (Micikevicius et al. 2018, "Mixed Precision
// Training", section 3.2; the scheme and defaults of torch.amp.GradScaler): the loss is
// multiplied by S before backward so that small FP16 gradients do not flush to zero, and the
// FP32 gradients are divided by S before the norm, the clip and the update. A step whose
// gradients hold an inf or a NaN (scaled FP16 values overflowed) is skipped and S is
// multiplied by `backoff`; after `growth_interval` finite steps in a row S is multiplied by
// `growth`. BF16 and FP32 need no scaling (BF16 has FP32's exponent range): S stays 1.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>

namespace rlhf::engine {

struct LossScaleConfig {
  bool enabled = false;      // FP16 compute
  double initial = 65536.0;  // 2^16, GradScaler's init_scale
  double growth = 2.0;       // growth_factor
  double backoff = 0.5;      // backoff_factor
  int64_t growth_interval = 2000;
  double min_scale = 1.0;  // never below (a model whose unscaled gradients overflow FP16)

  void validate() const;  // InputError naming the field
};

class LossScaler {
 public:
  explicit LossScaler(const LossScaleConfig& config);
  bool enabled() const { return config_.enabled; }
  double scale() const { return scale_; }
  // After a step whose gradients were `finite` (or not: that step was skipped).
  void update(bool finite);
  int64_t skipped_steps() const { return skipped_; }  // overflowed steps so far

  // For checkpoints: {"scale", "good_steps", "skipped_steps"}; load takes what state wrote.
  nlohmann::json state() const;
  void load(const nlohmann::json& state);

 private:
  LossScaleConfig config_;
  double scale_ = 1.0;
  int64_t good_steps_ = 0;  // finite steps since the last change of scale
  int64_t skipped_ = 0;
};

}  // namespace rlhf::engine
