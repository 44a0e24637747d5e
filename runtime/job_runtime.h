// The runtime every job driver shares (ppo/, dpo/): where the run writes, starting the role
// groups at once with a line each, checkpoints (each trained role's shards, then the driver's
// state, which marks the step complete) and resuming from the newest complete one, the HF
// export of a trained role, the metrics sink and each role's peak memory beside the plan,
// the logging and checkpoint schedule, and the console lines' numbers. A driver says what its
// roles load and what its own state is; nothing here knows an algorithm.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "core/spec.h"
#include "engine/driver_state.h"
#include "engine/role_config.h"

namespace rlhf {
class RoleGroup;
class Scheduler;
namespace report {
class MetricsSink;
}  // namespace report
}  // namespace rlhf

namespace rlhf::runtime {

// `v` with `precision` decimals ("0.693"), for console lines (the stream's format untouched).
std::string fixed(double v, int precision = 3);

// What the runtime reads of the spec, once, when a driver is built.
struct RuntimeSettings {
  std::string kind;              // the console lines' prefix: "ppo", "dpo", "sft", "rm", "kto"
  std::string run_dir;           // <logger.run_dir>/<name>
  std::string ckpt_path;         // ckpt.path ("": <run_dir>/ckpt)
  int64_t save_steps = -1;       // ckpt.save_steps (<= 0: only after the last step)
  int64_t max_ckpt = 3;          // ckpt.max_num
  bool save_only_model = false;  // ckpt.save_only_model
  bool export_hf = true;         // ckpt.export_hf
  int64_t logging_steps = 1;     // logger.logging_steps
  bool tensorboard = false;      // logger.tensorboard
  nlohmann::json trajectory_settings;  // recorded with each checkpoint (driver_state.h)

  static RuntimeSettings from_spec(const JobSpec& spec, std::string kind);
};

// One role group's start-up: how its workers are described on the console ("2 workers") and
// the call that loads them (run on the group's own thread); `reload`, where one rank can be
// loaded alone (no collective group among the ranks), loads a relaunched rank the same way
// (RoleGroup::set_revive, fault.max_restarts).
struct RoleStart {
  std::string workers;
  std::function<void()> load;
  std::function<void(int rank)> reload;
};

class JobRuntime {
 public:
  explicit JobRuntime(RuntimeSettings settings);
  ~JobRuntime();
  JobRuntime(const JobRuntime&) = delete;
  JobRuntime& operator=(const JobRuntime&) = delete;

  const RuntimeSettings& settings() const { return settings_; }
  const std::string& kind() const { return settings_.kind; }
  // The console line's prefix: out << "KIND: ".
  std::ostream& say(std::ostream& out) const;

  // At the start of a run: opens <run_dir>/metrics.jsonl (and TensorBoard's events) and reads
  // plan.json's per-role figures for the memory records.
  report::MetricsSink& open_metrics();
  report::MetricsSink& metrics();
  // Each role's peak memory per rank beside what `rlhf plan` predicted (scheduler/peak_memory.h).
  nlohmann::json memory(Scheduler& s) const;

  // Starts every role group of `s` at once: "KIND: loading ROLE (WORKERS)" in role order, then
  // "KIND: ROLE ready after T s" as each finishes. Throws the first group's error.
  void start_roles(Scheduler& s, const std::function<RoleStart(RoleGroup&)>& start,
                   std::ostream& out) const;
  // A model role's start-up: its `init` with `roles`' config for it and, on a trained role,
  // the micro batches each rank accumulates per optimizer step: global_batch / (micro x ranks),
  // at least 1; a reload for an untrained, unsharded role. Throws RuntimeError when `roles`
  // has no config for the group.
  RoleStart init_role(Scheduler& s, RoleGroup& g,
                      const std::map<Role, engine::ModelRoleConfig>& roles, int64_t global_batch,
                      int64_t micro_batch) const;

  // The schedule: a metrics record every logger.logging_steps and at the last step; a
  // checkpoint every ckpt.save_steps and always after the last step (a finished run can be
  // resumed with more steps, and its final state is kept whatever save_steps says).
  bool logs_at(int64_t step, int64_t total_steps) const;
  bool saves_at(int64_t step, int64_t total_steps) const;

  // Saves step `step`: every role of `trained` its own shards at once, then the driver's
  // `state` (driver_state.h) last, which marks the checkpoint complete. Console lines and a
  // progress phase around it.
  void save(Scheduler& s, int64_t step, const std::vector<Role>& trained,
            const nlohmann::json& state, std::ostream& out) const;
  // Loads the newest complete checkpoint (the driver file whose trained[0] shards exist) into
  // every role of `trained` and returns its driver state; InputError when there is none.
  engine::DriverState resume(Scheduler& s, const std::vector<Role>& trained,
                             std::ostream& out) const;
  // Writes the trained `role` as an HF model to <run_dir>/export/<role> with the tokenizer
  // files of `tokenizer_from` beside it (a complete model directory); returns the directory.
  std::string export_model(Scheduler& s, Role role, const std::string& tokenizer_from,
                           std::ostream& out) const;

 private:
  RuntimeSettings settings_;
  nlohmann::json planned_;  // plan.json's per-role figures (null without a plan)
  std::unique_ptr<report::MetricsSink> metrics_;
};

// A step loop's elapsed time and ETA for its console lines: steps first..total of this run.
class StepClock {
 public:
  StepClock(int64_t first_step, int64_t total_steps);
  // after `step` (scheduler/progress.h's elapsed_and_eta).
  std::string after(int64_t step) const;

 private:
  std::chrono::steady_clock::time_point start_;
  int64_t first_, total_;
};

// Where a step's time went, per role group: from its construction to since(), each group's
// busy seconds (the mean over its workers of the time each had a request in hand,
// scheduler/busy_clock.h) and idle seconds (the step's wall time less that), and the share
// of the job's workers' time that was busy ("devices_busy": one worker per device, so
// colocated roles count their device twice).
class BusyWindow {
 public:
  explicit BusyWindow(const Scheduler& s);
  // {"busy_s": {role: s}, "idle_s": {role: s}, "devices_busy": share in [0, 1], "timeline":
  // {role: [[from, to], ...]}} over the `seconds` of wall time since construction; a
  // timeline lane is the union of the group's ranks' busy intervals, in seconds from the
  // window's start (rounded to 0.1 ms).
  nlohmann::json since(Scheduler& s, double seconds) const;

 private:
  std::vector<double> start_;
  std::chrono::steady_clock::time_point started_;
};

}  // namespace rlhf::runtime
