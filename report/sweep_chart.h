// The sweep's charts as SVG, for the sweep report (sweep/sweep.h writes it): samples/s per
// variant, and for every role its planned memory beside the measured peaks, with a warning
// when a figure comes from fewer than kFewSteps steps. Knows nothing of how sweeps run: the
// caller fills SweepFigures.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace rlhf::report {

// Fewer logged steps than this make a throughput or peak figure a rough one.
inline constexpr int64_t kFewSteps = 5;

struct SweepRoleMemory {
  int64_t planned_total = -1;    // bytes per rank; -1: not planned
  int64_t planned_engine = -1;   // the tracked tensor peak the planner expects
  int64_t measured_tensor = -1;  // -1: not reported
  int64_t measured_rss = -1;
};

struct SweepFigures {
  std::string label;   // the variant's values: "n_samples_per_prompt=2, batch_size=16"
  std::string status;  // "ok", "failed", "would not fit", ...
  std::string reason;  // why it failed, or ""
  bool bad = false;    // failed, out of memory, bad spec, would not fit
  bool ran = false;    // it ran steps (not plan-only, not skipped)
  int64_t steps = 0;   // logged steps the figures come from
  double samples_per_s = 0.0;
  std::map<std::string, SweepRoleMemory> memory;  // per role
};

// <svg> elements: throughput (when any variant ran) then one chart per role with planned
// total, measured RSS, planned tensor and measured tensor per variant.
std::string sweep_charts_svg(const std::vector<SweepFigures>& variants);

}  // namespace rlhf::report
