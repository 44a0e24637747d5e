// A job driver's own part of a checkpoint: <ckpt.path>/driver/global_stepN.json, written
// last (its presence marks step N's checkpoint complete), with the spec settings that fix the
// job's trajectory, so `rlhf run --resume` can refuse to continue a different job. Keeps the
// newest ckpt.max_num of them, as the trainers keep their shards. Knows no algorithm.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/spec.h"

namespace rlhf::engine {

struct DriverState {
  int64_t step = 0;
  std::string tag;      // "global_step5": the role checkpoints' directory name
  std::string file;     // <ckpt>/driver/global_step5.json
  nlohmann::json data;  // everything the driver saved ("step", "tag", its own fields)
};

// The role whose checkpoint completes a step: actor (ppo, dpo, sft), reward (rm).
Role checkpointed_role(const JobSpec& spec);

// Writes `state` (the driver's own fields; "step", "tag" and "settings", the job's
// trajectory_settings, are added) as <ckpt_dir>/driver/global_step<step>.json through a
// temporary name, then removes the oldest driver files beyond `max_num`. Returns the file's
// path. Throws RuntimeError.
std::string write_driver_state(const std::string& ckpt_dir, int64_t step, nlohmann::json state,
                               const nlohmann::json& settings, int64_t max_num);

// The newest complete checkpoint: the driver file with the highest step whose
// <ckpt_dir>/<role>/<tag> directory exists; nullopt when there is none.
std::optional<DriverState> latest_driver_state(const std::string& ckpt_dir, Role role);

// The spec settings that fix a job's trajectory: every key except those that only say
// where or how fast it runs, or what it writes (name, cluster.*, scheduler.*, logger.*,
// ckpt.*, devices, colocation, gradient checkpointing, offload, token budgets, the KV
// budget, the remote reward's timeout). train.max_steps and train.num_episodes count only
// when a trained role's LR schedule depends on the number of steps (cosine or warmup).
// Paths are made absolute, so the same file named two ways is no change.
nlohmann::json trajectory_settings(const JobSpec& spec);

// "rollout.n_samples_per_prompt: 4 -> 2" for each trajectory setting of `spec` that differs
// from `saved` (a driver file's "settings"); empty when none does, or when `saved` is null
// (a checkpoint written before settings were recorded).
std::vector<std::string> changed_settings(const nlohmann::json& saved, const JobSpec& spec);

}  // namespace rlhf::engine
