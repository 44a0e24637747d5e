// `rlhf report RUN_DIR [--out FILE]`: the run's dashboard as one self-contained HTML file
// (report/run_report.h): inline SVG and style, no script, nothing fetched from a network.
// Works on a finished, failed or running job; changes nothing in the run directory but the
// report file.
#include <filesystem>
#include <fstream>
#include <iostream>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/errors.h"
#include "report/run_report.h"

namespace rlhf::cli {

int cmd_report(const Argv& argv) {
  const std::vector<OptionSpec> options = {
      {"--out", true, "the HTML file to write (default RUN_DIR/report.html)", "FILE"},
      {"--help", false, "show this help"}};
  Args args(argv, options);
  if (args.flag("--help")) {
    std::cout << "usage: rlhf report RUN_DIR [--out FILE]\n\n"
                 "Writes the run's charts as one self-contained HTML file (inline SVG, no\n"
                 "network): reward, KL, losses, response length, throughput, the phase timeline\n"
                 "of each step, and per role and rank the measured memory beside the planned\n"
                 "bar. The same page `rlhf run` serves live (logger.dashboard_port).\n\n"
              << format_options(options);
    return 0;
  }
  if (args.positionals().size() != 1)
    throw InputError("expected one run directory: rlhf report RUN_DIR [--out FILE]");
  const std::string dir = args.positionals()[0];
  namespace fs = std::filesystem;
  if (fs::exists(fs::path(dir) / "sweep.csv") && !fs::exists(fs::path(dir) / "metrics.jsonl"))
    throw InputError(dir +
                     ": a sweep directory: `rlhf sweep` wrote its report.html there; give "
                     "one variant's directory for its run report");
  const report::RunRecords run = report::read_run(dir, report::ReadMode::kComplete);
  const std::string out = args.value("--out").value_or((fs::path(dir) / "report.html").string());
  const std::string tmp = out + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary);
    f << report::report_page(run, report::PageKind::kFile);
    f.close();
    if (!f) throw RuntimeError("cannot write " + tmp);
  }
  fs::rename(tmp, out);
  std::cout << "rlhf report: " << run.steps.size() << " step records";
  if (!run.evals.empty()) std::cout << " and " << run.evals.size() << " evaluations";
  std::cout << " of " << dir << " -> " << out << '\n';
  return 0;
}

}  // namespace rlhf::cli
