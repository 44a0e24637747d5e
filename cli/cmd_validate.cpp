// `rlhf validate SPEC`: every problem of a job spec at once, or a one-line summary. Checks
// what `rlhf run` checks before it starts any worker (cli/preflight.h), so a spec that
// validates here does not fail at run time for its input; --no-files leaves out this
// machine (files, GPUs) for a spec meant for another one.
#include <iostream>

#include "cli/commands.h"
#include "cli/preflight.h"
#include "cli/spec_args.h"

namespace rlhf::cli {

int cmd_validate(const Argv& argv) {
  const std::vector<OptionSpec> options = {
      set_option(),
      {"--no-files", false,
       "skip the checks of this machine (model and dataset files, checkpoint headers, "
       "tokenizer, CUDA devices): for a spec meant for another machine"},
      {"--print", false, "print the resolved spec (every key, defaults filled) as JSON"},
      {"--print-minimal", false, "print only the keys that differ from their defaults"},
      {"--help", false, "show this help"}};
  Args args(argv, options);
  if (args.flag("--help")) {
    std::cout << "usage: rlhf validate SPEC [--set PATH=VALUE ...] [--no-files] [--print | "
                 "--print-minimal]\n\n"
                 "Checks a job spec as `rlhf run` does before it starts any worker: unknown keys,\n"
                 "types, ranges, the cross-field rules (batch divisibility, disjoint device\n"
                 "groups, devices that exist, lengths), built-in names (reward.rule, synthetic:\n"
                 "datasets), the memory plan's limits, and on this machine the model and dataset\n"
                 "files, checkpoint headers, tokenizer, data lines and CUDA devices.\n"
                 "Exit 0 with a one-line summary, or exit 2 with every problem found.\n\n"
              << format_options(options);
    return 0;
  }
  JobSpec spec = load_spec_arg(args, "validate");
  for (const auto& w : spec.warnings()) std::cerr << "warning: " << w << '\n';
  PreflightOptions checks;
  checks.machine = !args.flag("--no-files");
  preflight(spec, checks);
  if (args.flag("--print")) {
    std::cout << spec.json().dump(2) << '\n';
  } else if (args.flag("--print-minimal")) {
    std::cout << spec.minimal_json().dump(2) << '\n';
  } else {
    std::cout << "ok: " << spec.source() << ": " << spec_summary(spec)
              << (checks.machine ? "" : " (files and devices not checked: --no-files)") << '\n';
  }
  return 0;
}

}  // namespace rlhf::cli
