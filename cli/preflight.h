// What `rlhf run` checks before any worker starts, in one place, so `rlhf validate` checks
// exactly the same: the spec's names (reward rule, synthetic datasets), the files it reads
// (models, their safetensors headers, datasets, tokenizer), this machine's GPUs, the memory
// plan's hard limits, a --resume checkpoint and its settings; and it builds the job's driver
// (data read and tokenized). Every problem found is reported at once.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/spec.h"
#include "engine/driver_state.h"
#include "scheduler/smoke_driver.h"

namespace rlhf::cli {

struct PreflightOptions {
  // Check this machine: model and dataset files, checkpoint headers, the tokenizer, CUDA
  // devices, and build the driver. Off for `validate --no-files` (a spec for elsewhere).
  bool machine = true;
  bool resume = false;          // --resume: a complete checkpoint must exist
  bool resume_changed = false;  // --resume-changed: its trajectory settings may differ
};

struct Preflight {
  JobDriver driver;                                // empty unless options.machine
  std::optional<engine::DriverState> resume_from;  // with options.resume
};

// Throws SpecError (exit 2) listing every problem found, named by spec key.
Preflight preflight(const JobSpec& spec, const PreflightOptions& options);

}  // namespace rlhf::cli
