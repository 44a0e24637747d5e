#include "engine/loss_scaler.h"

#include <algorithm>
#include <string>

#include "core/errors.h"

namespace rlhf::engine {

void LossScaleConfig::validate() const {
  auto require = [](bool ok, const std::string& what) {
    if (!ok) throw InputError("trainer config: loss scale: " + what);
  };
  require(initial >= 1.0, "initial must be >= 1, got " + std::to_string(initial));
  require(growth > 1.0, "growth must be > 1, got " + std::to_string(growth));
  require(backoff > 0.0 && backoff < 1.0,
          "backoff must be in (0, 1), got " + std::to_string(backoff));
  require(growth_interval >= 1, "growth_interval must be >= 1");
  require(min_scale > 0.0 && min_scale <= initial, "min_scale must be in (0, initial]");
}

LossScaler::LossScaler(const LossScaleConfig& config)
    : config_(config), scale_(config.enabled ? config.initial : 1.0) {}

void LossScaler::update(bool finite) {
  if (!config_.enabled) return;
  if (!finite) {
    ++skipped_;
    good_steps_ = 0;
    scale_ = std::max(config_.min_scale, scale_ * config_.backoff);
    return;
  }
  if (++good_steps_ >= config_.growth_interval) {
    scale_ *= config_.growth;
    good_steps_ = 0;
  }
}

nlohmann::json LossScaler::state() const {
  return {{"scale", scale_}, {"good_steps", good_steps_}, {"skipped_steps", skipped_}};
}

void LossScaler::load(const nlohmann::json& state) {
  if (!config_.enabled || !state.is_object()) return;
  scale_ = state.value("scale", scale_);
  good_steps_ = state.value("good_steps", int64_t{0});
  skipped_ = state.value("skipped_steps", int64_t{0});
}

}  // namespace rlhf::engine
