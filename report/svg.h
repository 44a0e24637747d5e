// SVG charts drawn as text by our own code (no library, no script): line charts over steps,
// stacked bars (the phase timeline) and horizontal grouped bars (memory, sweeps), each with
// axes, tick labels in the chart's unit and every series' latest value written beside it.
// Every string that comes from a run (names, roles, labels) is escaped here. Layout only: what
// to draw comes from report/run_report.h and report/sweep_chart.h.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace rlhf::report {

// Text for HTML/SVG content and attribute values: & < > " ' as entities.
std::string escape(std::string_view text);

// A value with its unit: "bytes" -> "412.50 MiB", "s" -> "0.193 s", "samples/s" -> "332
// samples/s", "" -> "0.4400"; four significant digits, k/M for large counts.
std::string format_value(double value, const std::string& unit);

// About `target` round tick values (1, 2 or 5 x 10^k apart) covering [lo, hi].
std::vector<double> nice_ticks(double lo, double hi, int target = 5);

struct Series {
  std::string name;                               // "reward_mean"
  std::vector<std::pair<double, double>> points;  // (step, value), in step order
  bool markers = false;  // dots, not a line (sparse series: held-out evaluations)
};

struct LineChart {
  std::string id;     // element id: "chart-reward"
  std::string title;  // "Reward"
  std::string unit;   // of the y axis, as format_value takes it
  std::vector<Series> series;
};
// <svg> with a y axis in `unit`, the step axis, one polyline (or dots) per series and a legend
// naming each series with its latest value and step. A chart without points says so.
std::string line_chart_svg(const LineChart& chart);

struct StackedBars {
  std::string id, title, unit;
  std::vector<std::string> parts;  // "generate", "score", ... bottom to top
  // (step, one value per part, NaN/negative: absent)
  std::vector<std::pair<double, std::vector<double>>> columns;
  Series total;  // drawn over the bars as a line ("step": the whole step), may be empty
};
// One stacked column per step (evenly thinned to at most 300 columns, said in the chart);
// the legend gives each part's mean and latest value.
std::string stacked_bars_svg(const StackedBars& chart);

// Busy lanes over time (issue 42.4): one lane per role group, each step's busy intervals
// laid end to end with the step boundaries marked.
struct LaneStep {
  double step = 0;                                           // its number
  double seconds = 0;                                        // its wall time
  std::vector<std::vector<std::pair<double, double>>> busy;  // per lane: [from, to) seconds
};
struct Lanes {
  std::string id, title;
  std::vector<std::string> lanes;  // "actor", "rollout", ... top to bottom
  std::vector<LaneStep> steps;     // in order
};
// One row per lane with a rect per busy interval (its seconds in a tooltip), the seconds axis
// under them, a dashed line and label at each step's start, and each lane's busy share of
// the steps shown at its end.
std::string lanes_svg(const Lanes& chart);

struct BarGroup {
  std::string label;           // "actor[0] cpu:0", a sweep variant
  std::vector<double> values;  // one per bar name; < 0: nothing to draw ("-")
  std::string note;            // written after the group's label ("2 steps", "failed: ...")
  bool bad = false;            // drawn in red: failed, would not fit
};
struct GroupedBars {
  std::string id, title, unit;
  std::vector<std::string> bar_names;  // "planned total", "measured RSS"
  std::vector<BarGroup> groups;
  std::vector<std::string> warnings;  // written under the title
};
// Horizontal bars, one row of bars per group, each bar with its value written at its end.
std::string grouped_bars_svg(const GroupedBars& chart);

}  // namespace rlhf::report
