#include "report/sweep_chart.h"

#include <algorithm>

#include "report/svg.h"

namespace rlhf::report {
namespace {

std::string few_steps_warning(const std::vector<SweepFigures>& variants) {
  const auto few = std::count_if(variants.begin(), variants.end(), [](const SweepFigures& v) {
    return v.ran && v.steps < kFewSteps;
  });
  if (few == 0) return "";
  return std::to_string(few) + " of " + std::to_string(variants.size()) +
         " variants logged fewer than " + std::to_string(kFewSteps) +
         " steps (marked \"few\"): rough figures";
}

std::string note_of(const SweepFigures& v) {
  if (v.bad) return v.status + (v.reason.empty() ? "" : ": " + v.reason.substr(0, 40));
  if (v.ran)
    return std::to_string(v.steps) + " step" + (v.steps == 1 ? "" : "s") +
           (v.steps < kFewSteps ? " (few)" : "");
  return v.status;
}

}  // namespace

std::string sweep_charts_svg(const std::vector<SweepFigures>& variants) {
  const std::string warning = few_steps_warning(variants);
  std::string out;
  const bool any_ran =
      std::any_of(variants.begin(), variants.end(), [](const SweepFigures& v) { return v.ran; });
  if (any_ran) {
    GroupedBars speed{
        "sweep-throughput", "Throughput per variant", "samples/s", {"samples/s"}, {}, {}};
    if (!warning.empty()) speed.warnings.push_back(warning);
    for (const auto& v : variants)
      speed.groups.push_back(
          {v.label, {v.ran && v.steps > 0 ? v.samples_per_s : -1.0}, note_of(v), v.bad});
    out += grouped_bars_svg(speed);
  }
  std::vector<std::string> roles;
  for (const char* r : {"actor", "rollout", "ref", "teacher", "judge", "reward", "critic"})
    for (const auto& v : variants)
      if (v.memory.count(r)) {
        roles.push_back(r);
        break;
      }
  for (const auto& v : variants)  // any other role, after the known ones
    for (const auto& [r, m] : v.memory)
      if (std::find(roles.begin(), roles.end(), r) == roles.end()) roles.push_back(r);
  // Two charts per role: the process (planned total vs peak RSS) and the tracked tensors
  // (planned vs measured peak), which are often a hundred times smaller.
  const auto d = [](int64_t b) { return static_cast<double>(b); };
  for (const auto& role : roles) {
    GroupedBars total{"sweep-memory-" + role,
                      role + " per rank: process memory, planned vs peak RSS",
                      "bytes",
                      {"planned total", "measured RSS"},
                      {},
                      {}};
    GroupedBars tensor{"sweep-tensor-" + role,
                       role + " per rank: tracked tensors, planned vs measured peak",
                       "bytes",
                       {"planned tensor", "measured tensor"},
                       {},
                       {}};
    if (!warning.empty()) {
      total.warnings.push_back(warning);
      tensor.warnings.push_back(warning);
    }
    for (const auto& v : variants) {
      const auto it = v.memory.find(role);
      const SweepRoleMemory m = it == v.memory.end() ? SweepRoleMemory{} : it->second;
      total.groups.push_back({v.label, {d(m.planned_total), d(m.measured_rss)}, note_of(v), v.bad});
      tensor.groups.push_back(
          {v.label, {d(m.planned_engine), d(m.measured_tensor)}, note_of(v), v.bad});
    }
    out += grouped_bars_svg(total) + grouped_bars_svg(tensor);
  }
  return out;
}

}  // namespace rlhf::report
