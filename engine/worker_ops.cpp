// engine/worker_ops.h's conversions.
#include "engine/worker_ops.h"

namespace rlhf::ops {

StepFigures step_figures(const engine::StepMetrics& m) {
  StepFigures f;
  f.step = m.step;
  f.loss = m.loss;
  f.grad_norm = m.grad_norm;
  f.lr = m.lr;
  f.skipped = m.skipped;
  f.loss_scale = m.loss_scale;
  f.skipped_steps = m.skipped_steps;
  f.peak_tensor_bytes = m.memory.peak;
  return f;
}

}  // namespace rlhf::ops
