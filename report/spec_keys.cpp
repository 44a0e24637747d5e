#include "report/spec_keys.h"

namespace rlhf::report {

SpecSection spec_section() {
  SpecSection s;
  s.owner = "report";
  s.keys = [](KeyTable& t) {
    t.file("logger.run_dir", "runs", "Parent directory of run directories.");
    t.integer("logger.logging_steps", 1, 1, kUnbounded, "Log metrics every N steps.");
    t.boolean("logger.tensorboard", true,
              "Write TensorBoard event files to <run dir>/tensorboard: every logged number as a "
              "scalar at its step, sample generations as text.");
    t.integer("logger.samples_per_step", 4, 0, 1000,
              "Sample generations (prompt, response, reward) of each logged PPO step kept in "
              "samples.jsonl and TensorBoard's text tab (0: none).");
    t.integer("logger.dashboard_port", -1, -1, 65535,
              "`rlhf run` serves a live dashboard (charts of the run's metrics) on "
              "127.0.0.1:PORT and prints its address at start; -1: any free port (the default, so "
              "jobs run side by side never clash), 0: no dashboard. `rlhf report RUN_DIR` writes "
              "the same page as a file.");
  };
  return s;
}

}  // namespace rlhf::report
