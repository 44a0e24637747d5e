// A run's report: its metrics.jsonl (and plan.json, samples.jsonl) as an HTML page of SVG
// charts: reward, KL, losses, response length, throughput, the phase timeline per step, and per
// role and rank the measured memory beside the planned bar. The same page is served live by
// report/dashboard.h and written as one self-contained file by `rlhf report` (no script, no
// network in the file). Reads only; never changes the run directory.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace rlhf::report {

struct RunRecords {
  std::string dir;                      // the run directory
  std::string name;                     // its last path component
  std::vector<nlohmann::json> steps;    // training records, in file order
  std::vector<nlohmann::json> evals;    // held-out records ("split": "eval")
  std::vector<nlohmann::json> samples;  // samples.jsonl rows of the last step that has any
  nlohmann::json plan;                  // plan.json ("memory" before any step is measured); null
};

enum class ReadMode {
  kComplete,  // a finished run: a bad line anywhere is an error
  kLive,      // a running job: a last line not yet ended by a newline is skipped
};

// Reads <dir>/metrics.jsonl (required), plan.json and samples.jsonl (optional). Throws
// InputError naming the file (and line) when the directory or metrics file is missing or a
// line is not a JSON object.
RunRecords read_run(const std::string& dir, ReadMode mode = ReadMode::kComplete);

// The page's content: a summary table of the latest values, the charts, the memory bars and
// the last step's samples (all text escaped). Wrapped in <div id="report-body">.
std::string report_body(const RunRecords& run);

enum class PageKind {
  kFile,  // self-contained, static
  kLive,  // the dashboard: a small inline script fetches /body every 2 s and swaps it in
};
// A whole HTML document around report_body.
std::string report_page(const RunRecords& run, PageKind kind);

// A page around any body (the sweep report uses it): inline style, `title` escaped.
std::string html_page(const std::string& title, const std::string& body,
                      const std::string& script = "");

}  // namespace rlhf::report
