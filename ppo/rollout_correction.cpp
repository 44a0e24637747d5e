#include "ppo/rollout_correction.h"

#include "core/errors.h"
#include "ppo/masked.h"

namespace rlhf::ppo {

namespace {

// exp(old - behav) [B, A] in FP32, detached, the log-ratio clamped to <= 20.
torch::Tensor raw_ratio(const torch::Tensor& log_probs_old,
                        const torch::Tensor& log_probs_behaviour,
                        const torch::Tensor& action_mask) {
  TORCH_CHECK(log_probs_old.sizes() == log_probs_behaviour.sizes() &&
                  log_probs_old.sizes() == action_mask.sizes(),
              "rollout correction: expected [B, A] tensors of one shape, got ",
              log_probs_old.sizes(), ", ", log_probs_behaviour.sizes(), ", ", action_mask.sizes());
  const torch::Tensor log_ratio =
      log_probs_old.detach().to(torch::kFloat32) - log_probs_behaviour.detach().to(torch::kFloat32);
  return log_ratio.clamp_max(20.0).exp();
}

}  // namespace

RolloutCorrection parse_rollout_correction(const std::string& name) {
  if (name == "none") return RolloutCorrection::kNone;
  if (name == "tis") return RolloutCorrection::kTis;
  if (name == "decoupled") return RolloutCorrection::kDecoupled;
  throw InputError("algo.rollout_correction: expected none, tis or decoupled, found \"" + name +
                   "\"");
}

const char* rollout_correction_name(RolloutCorrection mode) {
  switch (mode) {
    case RolloutCorrection::kNone:
      return "none";
    case RolloutCorrection::kTis:
      return "tis";
    case RolloutCorrection::kDecoupled:
      return "decoupled";
  }
  return "?";
}

torch::Tensor rollout_correction_weights(const RolloutCorrectionConfig& config,
                                         const torch::Tensor& log_probs_old,
                                         const torch::Tensor& log_probs_behaviour,
                                         const torch::Tensor& action_mask) {
  torch::Tensor w = raw_ratio(log_probs_old, log_probs_behaviour, action_mask);
  switch (config.mode) {
    case RolloutCorrection::kNone:
      return torch::ones_like(w);
    case RolloutCorrection::kTis:
      w = w.clamp_max(config.cap);
      break;
    case RolloutCorrection::kDecoupled:
      break;
  }
  // Padding positions hold arbitrary log-probs: weight 1 there keeps inf * 0 out of the loss.
  return torch::where(action_mask.to(torch::kBool), w, torch::ones_like(w));
}

RolloutMismatch measure_rollout_mismatch(const RolloutCorrectionConfig& config,
                                         const torch::Tensor& log_probs_old,
                                         const torch::Tensor& log_probs_behaviour,
                                         const torch::Tensor& action_mask) {
  const torch::Tensor mask = action_mask.to(torch::kFloat32);
  RolloutMismatch out;
  // k3 = expm1(x) - x, x = old - behav, in FP64: the on-policy gap is ~1e-4 nats a token,
  // whose k3 (~x^2 / 2 = 5e-9) FP32's exp(x) - 1 - x would round to noise of 6e-8.
  const torch::Tensor x =
      log_probs_old.detach().to(torch::kFloat64) - log_probs_behaviour.detach().to(torch::kFloat64);
  out.kl = masked_mean(torch::expm1(x) - x, action_mask.to(torch::kFloat64)).item<double>();
  if (config.mode == RolloutCorrection::kNone || mask.sum().item<double>() == 0) return out;
  const torch::Tensor w =
      rollout_correction_weights(config, log_probs_old, log_probs_behaviour, action_mask);
  out.weight_mean = masked_mean(w, mask).item<double>();
  out.weight_max = (w * mask).max().item<double>();
  if (config.mode == RolloutCorrection::kTis) {
    const torch::Tensor over =
        (raw_ratio(log_probs_old, log_probs_behaviour, action_mask) > config.cap)
            .to(torch::kFloat32);
    out.truncated = masked_mean(over, mask).item<double>();
  }
  return out;
}

}  // namespace rlhf::ppo
