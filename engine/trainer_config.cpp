// TrainerConfig::validate.
#include "engine/trainer_config.h"

#include "core/errors.h"

namespace rlhf::engine {
namespace {

void require(bool ok, const std::string& field, const std::string& expected) {
  if (!ok) throw InputError("trainer config: " + field + ": expected " + expected);
}

}  // namespace

void TrainerConfig::validate() const {
  const int stage = static_cast<int>(zero_stage);
  require(stage >= 1 && stage <= 3, "zero_stage", "1, 2 or 3, got " + std::to_string(stage));
  require(compute_dtype == torch::kBFloat16 || compute_dtype == torch::kFloat32 ||
              compute_dtype == torch::kFloat16,
          "compute_dtype", "bf16, fp16 or fp32");
  require(lr >= 0.0, "lr", ">= 0");
  require(beta1 >= 0.0 && beta1 < 1.0, "beta1", "in [0, 1)");
  require(beta2 >= 0.0 && beta2 < 1.0, "beta2", "in [0, 1)");
  require(eps > 0.0, "eps", "> 0");
  require(weight_decay >= 0.0, "weight_decay", ">= 0");
  require(warmup_ratio >= 0.0 && warmup_ratio <= 1.0, "warmup_ratio", "in [0, 1]");
  require(min_lr_ratio >= 0.0 && min_lr_ratio <= 1.0, "min_lr_ratio", "in [0, 1]");
  require(total_steps >= 1, "total_steps", ">= 1");
  require(grad_accum_steps >= 1, "grad_accum_steps", ">= 1");
  if (compute_dtype == torch::kFloat16) loss_scale.validate();
}

}  // namespace rlhf::engine
