// Planned beside measured memory for one run directory: `rlhf run` writes the plan
// (<run_dir>/plan.json) before its workers start; the driver's metrics.jsonl carries the
// measured peaks. This reads both and pairs them per role and rank; it does not plan or
// measure anything itself.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/spec.h"

namespace rlhf::engine {

inline constexpr const char* kPlanFileName = "plan.json";

// Writes <run_dir>/plan.json: {"spec": source, "memory": MemoryPlan JSON} when every role's
// config.json exists, else {"spec", "missing": [...]} (a run without models fails later with
// its own error). Throws RuntimeError when the file cannot be written.
void write_run_plan(const JobSpec& spec, const std::string& run_dir);

// The plan's per-role figures of <run_dir>/plan.json ({"actor": {"device_total": ..,
// "engine_peak": .., ...}, ...}), or null when the run has no memory plan (no plan.json, or
// model directories were missing). Drivers put them beside the measured peaks.
nlohmann::json planned_roles(const std::string& run_dir);

// One role rank: the planner's figures and the largest measured ones over all metrics records.
struct MemoryCheckRow {
  std::string role;
  int rank = 0;
  std::string device;
  int64_t planned_engine = 0;    // plan: engine_peak (trainer-tracked tensors, or weights)
  int64_t measured_tensor = -1;  // metrics: peak_tensor_bytes (-1: not reported, e.g. rollout)
  int64_t planned_total = 0;     // plan: device_total (everything the process holds)
  int64_t measured_rss = -1;     // metrics: peak_rss_bytes
  int64_t planned_cuda = 0;      // plan: cuda_allocated (cuda roles; 0 on cpu)
  int64_t measured_cuda = -1;    // metrics: cuda_peak_allocated_bytes (-1: not on a GPU)
  // Trained roles: collective payload bytes per optimizer step, plan (collectives_per_step)
  // and as the rank's group counted its last logged step (step_collectives); -1: none.
  int64_t planned_collectives = -1;
  int64_t measured_collectives = -1;  // all kinds but all-to-all (compared with the plan)
  // Expert parallelism's all-to-all payload, counted (its bytes follow the routing: not
  // planned); 0 without.
  int64_t measured_all_to_all = 0;
  // (planned - measured) / measured; 0 when nothing was measured.
  double tensor_error() const;
  double rss_error() const;
  double cuda_error() const;
  // GPU workers, per phase of the step: the plan's allocator bytes in that phase (its phase
  // bytes less the CUDA context, NCCL's buffers and a CUDA IPC bucket) and the allocator's
  // peak over the operations of that phase (cuda_phases: generate; log_probs, values, score;
  // train_actor, train_critic; sync_weights, push_weights; save, export_hf; load_model, init).
  struct Phase {
    std::string phase;
    int64_t planned = 0;
    int64_t measured = -1;
    double error() const;
  };
  std::vector<Phase> phases;
  // Every model worker (CPU and GPU), per phase: the plan's engine_phases (the bytes its
  // MemoryTracker counts in that phase) and the largest tensor_phases peak over the phase's
  // operations. On the CPU machine these match to the byte where the plan replays the engine.
  std::vector<Phase> tensor_phases;
};

// The phase of the step a worker operation belongs to ("" for bookkeeping operations):
// generate; log_probs, values, score, sequence_log_probs, sequence_scores: score;
// train_actor, train_critic, train_dpo/kto/sft/rm: train; sync_weights, push_weights: sync;
// save, export_hf: save; load_model, init: load.
std::string phase_of_operation(const std::string& op);

// Reads <run_dir>/plan.json and <run_dir>/metrics.jsonl. Throws InputError naming the
// missing or malformed file.
std::vector<MemoryCheckRow> check_run_memory(const std::string& run_dir);

// The largest measured peaks per role over every metrics record of a run:
// {"actor": {"peak_tensor_bytes": .., "peak_rss_bytes": ..}, ...} (max over ranks).
nlohmann::json measured_peaks(const std::string& metrics_path);

}  // namespace rlhf::engine
