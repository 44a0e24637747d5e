// report.html of a sweep: its charts (report/sweep_chart.h: samples/s, and every role's
// planned beside measured memory, warning about figures from few steps) and the table of
// variants, each linked to its own run report (written here too, for the variants that ran).
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/errors.h"
#include "report/run_report.h"
#include "report/svg.h"
#include "report/sweep_chart.h"
#include "sweep/sweep.h"

namespace rlhf {
namespace {

namespace fs = std::filesystem;
using report::escape;
using report::format_value;

// "n_samples_per_prompt=2, batch_size=16": the last component of each swept key.
std::string label_of(const VariantResult& r) {
  std::string label;
  const size_t axes = r.values.size();
  for (size_t a = 0; a < axes && a < r.overrides.size(); ++a) {
    const std::string& o = r.overrides[r.overrides.size() - axes + a];
    std::string key = o.substr(0, o.find('='));
    key = key.substr(key.rfind('.') == std::string::npos ? 0 : key.rfind('.') + 1);
    label += (a ? ", " : "") + key + "=" + r.values[a];
  }
  return label.empty() ? r.name : label;
}

std::string bytes_cell(int64_t b) {
  return b < 0 ? "-" : format_value(static_cast<double>(b), "bytes");
}

// Writes the variant's own report.html; returns whether it did.
bool write_variant_report(const VariantResult& r) {
  if (r.run_dir.empty() || !fs::exists(fs::path(r.run_dir) / "metrics.jsonl")) return false;
  try {
    const auto run = report::read_run(r.run_dir, report::ReadMode::kComplete);
    std::ofstream f(fs::path(r.run_dir) / "report.html");
    f << report::report_page(run, report::PageKind::kFile);
    return static_cast<bool>(f);
  } catch (const InputError&) {
    return false;  // a variant killed mid-line: the sweep table still has its figures
  }
}

}  // namespace

void write_sweep_report(const std::vector<VariantResult>& results,
                        const std::vector<GridAxis>& grid, const std::string& path) {
  std::vector<report::SweepFigures> figures;
  for (const auto& r : results) {
    report::SweepFigures f;
    f.label = label_of(r);
    f.status = variant_status_name(r.status);
    f.reason = r.reason;
    f.bad = r.status != VariantStatus::kOk && r.status != VariantStatus::kFits &&
            r.status != VariantStatus::kNotRun;
    f.ran = r.steps > 0;
    f.steps = r.steps;
    f.samples_per_s = r.samples_per_s;
    for (const auto& [role, m] : r.memory)
      f.memory[role] = {m.planned_total, m.planned_engine, m.measured_tensor, m.measured_rss};
    figures.push_back(std::move(f));
  }
  std::ostringstream body;
  body << "<p class=\"meta\">" << results.size() << " variants of";
  for (const auto& axis : grid) {
    body << " <code>" << escape(axis.key) << "</code> (";
    for (size_t i = 0; i < axis.values.size(); ++i)
      body << (i ? ", " : "") << escape(axis.values[i]);
    body << ")";
  }
  body << "; figures per rank, memory as bytes (KiB/MiB/GiB = 1024-based)</p>";
  body << "<div class=\"charts\">" << report::sweep_charts_svg(figures) << "</div>";
  body << "<h2>Variants</h2><table id=\"variants\"><tr><th>variant</th><th>status</th>"
          "<th>steps</th><th>samples/s</th><th>tokens/s</th><th>reward</th>";
  std::vector<std::string> roles;
  for (const auto& r : results)
    for (const auto& [role, m] : r.memory)
      if (std::find(roles.begin(), roles.end(), role) == roles.end()) roles.push_back(role);
  for (const auto& role : roles) body << "<th>" << escape(role) << " planned / tensor / RSS</th>";
  body << "</tr>";
  for (const auto& r : results) {
    const bool linked = write_variant_report(r);
    body << "<tr><td>";
    if (linked)
      body << "<a href=\"" << escape(r.name) << "/report.html\">" << escape(label_of(r)) << "</a>";
    else
      body << escape(label_of(r));
    body << "</td><td>" << escape(variant_status_name(r.status))
         << (r.reason.empty() ? "" : " (" + escape(r.reason) + ")") << "</td><td class=\"value\">"
         << r.steps << (r.steps > 0 && r.steps < report::kFewSteps ? " (few)" : "")
         << "</td><td class=\"value\">" << (r.steps > 0 ? format_value(r.samples_per_s, "") : "-")
         << "</td><td class=\"value\">" << (r.steps > 0 ? format_value(r.tokens_per_s, "") : "-")
         << "</td><td class=\"value\">"
         << (r.steps > 0 && !std::isnan(r.reward_mean) ? format_value(r.reward_mean, "") : "-")
         << "</td>";
    for (const auto& role : roles) {
      const auto it = r.memory.find(role);
      const RoleMemoryFigures m = it == r.memory.end() ? RoleMemoryFigures{} : it->second;
      body << "<td class=\"value\">" << bytes_cell(m.planned_total) << " / "
           << bytes_cell(m.measured_tensor) << " / " << bytes_cell(m.measured_rss) << "</td>";
    }
    body << "</tr>";
  }
  body << "</table><p class=\"meta\">planned: the planner's bytes per rank (everything the "
          "process holds); tensor: the largest peak_tensor_bytes the run reported; RSS: the "
          "process's peak resident set.</p>";
  std::string title = "rlhf sweep";
  if (!results.empty()) title += " " + fs::path(path).parent_path().filename().string();
  std::ofstream out(path, std::ios::binary);
  out << report::html_page(title, body.str());
  out.close();
  if (!out) throw RuntimeError("cannot write " + path);
}

}  // namespace rlhf
