// Sweeps: every combination of a grid of spec values run as its own `rlhf run` child process
// (fresh processes, its own run directory), one after another, or planned only. Collects
// each variant's status, throughput, phase times, planned and measured peak memory and last
// reward, and writes sweep.csv, sweep.md and report.html (SVG charts). Does not choose values
// or rank them.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "core/spec.h"

namespace rlhf {

// One --grid KEY=V1,V2,...
struct GridAxis {
  std::string key;                  // "rollout.n_samples_per_prompt"
  std::vector<std::string> values;  // as --set takes them
  // Parses "KEY=V1,V2" (commas inside [] or {} do not split). Throws InputError.
  static GridAxis parse(const std::string& text);
};

enum class VariantStatus {
  kOk,           // ran all its steps
  kFailed,       // nonzero exit (reason: exit code and the last stderr line)
  kOutOfMemory,  // killed by the OOM killer or reported an allocation failure
  kFits,         // --plan-only: every device fits
  kWouldNotFit,  // --plan-only: some device is over budget
  kBadSpec,      // the overrides make an invalid spec (reason: the first problem)
  kNotRun,       // the sweep was interrupted before it
};
const char* variant_status_name(VariantStatus status);

struct RoleMemoryFigures {
  int64_t planned_total = -1;    // planner: device total per rank (-1: not planned)
  int64_t planned_engine = -1;   // planner: engine-tracked peak per rank (-1: not planned)
  int64_t measured_tensor = -1;  // metrics: max peak_tensor_bytes (-1: not reported)
  int64_t measured_rss = -1;     // metrics: max peak_rss_bytes
  // planner: bytes one rank sends (and receives) in its group's collectives per optimizer step
  // (trained roles; -1: not planned or not trained)
  int64_t planned_comm = -1;
};

struct VariantResult {
  std::string name;                    // "n_samples_per_prompt=2,batch_size=16"
  std::vector<std::string> overrides;  // "rollout.n_samples_per_prompt=2", ...
  std::vector<std::string> values;     // one per axis
  VariantStatus status = VariantStatus::kNotRun;
  std::string reason;  // why it failed or does not fit
  std::string run_dir;
  double seconds = 0.0;        // wall time of the child
  double samples_per_s = 0.0;  // mean over logged steps (after the first when > 1)
  double tokens_per_s = 0.0;
  std::map<std::string, double> phase_s;  // generate, score, train, sync: mean seconds per step
  double reward_mean = 0.0;  // of the last logged step; NaN when the job logs none (dpo, sft, rm)
  // PPO-family means over the same steps (NaN where the records lack them): the share of all
  // workers' time that was busy (devices_busy) and the samples' staleness (staleness.mean),
  // what a sweep of algo.max_staleness compares.
  double devices_busy = 0.0;
  double staleness = 0.0;
  int64_t steps = 0;                                // logged steps
  std::map<std::string, RoleMemoryFigures> memory;  // per role
  int64_t max_planned_device = 0;                   // largest planned device total
  int64_t max_measured_rss = -1;                    // largest measured RSS over roles
};

struct SweepOptions {
  std::string spec_path;
  std::vector<std::string> base_overrides;  // --set, applied before the grid values
  std::vector<GridAxis> grid;
  int64_t steps = 2;  // train.max_steps of each variant
  bool plan_only = false;
  std::string rlhf_binary;  // the `rlhf` executable to run children with
  std::string out_dir;      // default: <logger.run_dir>/sweep-<name>
};

// Runs the sweep; `stop` set (by SIGINT) ends the running child cleanly and skips the rest.
// Progress goes to `progress`. Returns every variant (finished, failed or not run) and
// writes the outputs into options.out_dir (filled in when empty). Throws InputError for a
// bad spec or grid.
std::vector<VariantResult> run_sweep(SweepOptions& options, const std::atomic<bool>& stop,
                                     std::ostream& progress);

// The three outputs. File names: sweep.csv, sweep.md, report.html.
void write_sweep_csv(const std::vector<VariantResult>& results, const std::vector<GridAxis>& grid,
                     const std::string& path);
std::string sweep_markdown(const std::vector<VariantResult>& results,
                           const std::vector<GridAxis>& grid);
// report.html: samples/s and every role's planned vs measured memory per variant as SVG
// (sweep/sweep_report.cpp), the table, and each variant's own run report linked.
void write_sweep_report(const std::vector<VariantResult>& results,
                        const std::vector<GridAxis>& grid, const std::string& path);

}  // namespace rlhf
