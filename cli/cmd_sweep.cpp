// `rlhf sweep SPEC --grid KEY=V1,V2 [--grid ...] [--steps N] [--plan-only]`: every
// combination as its own `rlhf run` (sweep/sweep.h), or planned only; SIGINT stops the
// running variant cleanly and keeps what finished.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstring>
#include <iostream>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/spec_args.h"
#include "core/errors.h"
#include "sweep/sweep.h"

namespace rlhf::cli {
namespace {

std::atomic<bool> g_stop{false};

extern "C" void on_interrupt(int) {
  g_stop = true;
}

std::string self_executable() {
  char buf[PATH_MAX] = {};
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) throw RuntimeError("cannot read /proc/self/exe to start the variants");
  return std::string(buf, static_cast<size_t>(n));
}

}  // namespace

int cmd_sweep(const Argv& argv) {
  const std::vector<OptionSpec> options = {
      set_option(),
      {"--grid", true, "a key and the values to sweep (repeatable; the grid is every combination)",
       "KEY=V1,V2"},
      {"--steps", true, "training steps per variant (train.max_steps; default 2)", "N"},
      {"--plan-only", false,
       "fill the table from the memory planner alone, marking what would not fit"},
      {"--out", true, "output directory (default <logger.run_dir>/sweep-<name>)", "DIR"},
      {"--help", false, "show this help"}};
  Args args(argv, options);
  if (args.flag("--help")) {
    std::cout
        << "usage: rlhf sweep SPEC --grid KEY=V1,V2,... [--grid ...] [--steps N] [--plan-only]\n\n"
           "Runs every combination of the grid as its own `rlhf run` (fresh processes, run\n"
           "directory <out>/<variant>), one after another, for N steps. A failed or\n"
           "out-of-memory variant is recorded with its reason and the sweep goes on; Ctrl-C\n"
           "stops the running variant cleanly and keeps what finished. Writes sweep.csv,\n"
           "sweep.md and report.html (SVG charts of samples/s and every role's planned vs\n"
           "measured memory per variant, linking each variant's run report) into <out>.\n\n"
        << format_options(options);
    return 0;
  }
  if (args.positionals().size() != 1)
    throw InputError("expected one job spec file: rlhf sweep SPEC --grid KEY=V1,V2 [--grid ...]");
  SweepOptions o;
  o.spec_path = args.positionals()[0];
  o.base_overrides = args.values("--set");
  for (const auto& g : args.values("--grid")) o.grid.push_back(GridAxis::parse(g));
  if (auto steps = args.value("--steps")) {
    try {
      o.steps = std::stoll(*steps);
    } catch (const std::exception&) {
      throw InputError("--steps " + *steps + ": expected a positive integer");
    }
  }
  o.plan_only = args.flag("--plan-only");
  o.out_dir = args.value("--out").value_or("");
  o.rlhf_binary = self_executable();
  struct sigaction sa {};
  sa.sa_handler = on_interrupt;
  sigemptyset(&sa.sa_mask);
  if (::sigaction(SIGINT, &sa, nullptr) != 0 || ::sigaction(SIGTERM, &sa, nullptr) != 0)
    throw RuntimeError(std::string("sigaction failed: ") + std::strerror(errno));
  const auto results = run_sweep(o, g_stop, std::cerr);
  int ok = 0, bad = 0;
  for (const auto& r : results) {
    if (r.status == VariantStatus::kOk || r.status == VariantStatus::kFits)
      ++ok;
    else
      ++bad;
  }
  std::cout << sweep_markdown(results, o.grid) << "\nrlhf sweep: " << ok << " of " << results.size()
            << (o.plan_only ? " fit" : " ran") << "; outputs in " << o.out_dir
            << " (sweep.csv, sweep.md, report.html)\n";
  if (g_stop) {
    std::cerr << "rlhf sweep: interrupted; finished variants kept\n";
    return static_cast<int>(ExitCode::kRuntime);
  }
  return 0;
}

}  // namespace rlhf::cli
