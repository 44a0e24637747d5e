// Where a job writes (<logger.run_dir>/<name>, its checkpoint directory), and how a fresh run
// keeps an earlier run's outputs instead of overwriting or resuming from them.
#pragma once

#include <optional>
#include <string>

#include "core/spec.h"

namespace rlhf {

// logger.run_dir/name.
std::string run_directory(const JobSpec& spec);
// ckpt.path, or <run directory>/ckpt when it is empty.
std::string checkpoint_directory(const JobSpec& spec);

// Before a fresh (not resumed) run: moves an earlier run's metrics.jsonl, samples.jsonl,
// plan.json, tensorboard/, export/ and checkpoint directory to <run directory>/previous-K (the
// first free K) and returns that directory; nullopt when there was nothing to keep. A ckpt.path
// outside the run directory is renamed beside itself (<ckpt.path>-previous-K) instead. Nothing
// already written is lost.
std::optional<std::string> set_aside_previous_run(const JobSpec& spec);

}  // namespace rlhf
