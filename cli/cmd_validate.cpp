// `rlhf validate SPEC`: every problem of a job spec at once, or a one-line summary.
#include <iostream>

#include "cli/commands.h"
#include "cli/spec_args.h"

namespace rlhf::cli {

int cmd_validate(const Argv& argv) {
  const std::vector<OptionSpec> options = {
      set_option(),
      {"--print", false, "print the resolved spec (every key, defaults filled) as JSON"},
      {"--print-minimal", false, "print only the keys that differ from their defaults"},
      {"--help", false, "show this help"}};
  Args args(argv, options);
  if (args.flag("--help")) {
    std::cout << "usage: rlhf validate SPEC [--set PATH=VALUE ...] [--print | --print-minimal]\n\n"
                 "Checks a job spec: unknown keys, types, ranges, and the cross-field rules\n"
                 "(batch divisibility, disjoint device groups, devices that exist, lengths).\n"
                 "Exit 0 with a one-line summary, or exit 2 with every problem found.\n\n"
              << format_options(options);
    return 0;
  }
  JobSpec spec = load_spec_arg(args, "validate");
  for (const auto& w : spec.warnings()) std::cerr << "warning: " << w << '\n';
  for (const auto& m : missing_inputs(spec))
    std::cerr << "warning: " << m.path << ": " << m.message << '\n';
  if (args.flag("--print")) {
    std::cout << spec.json().dump(2) << '\n';
  } else if (args.flag("--print-minimal")) {
    std::cout << spec.minimal_json().dump(2) << '\n';
  } else {
    std::cout << "ok: " << spec.source() << ": " << spec_summary(spec) << '\n';
  }
  return 0;
}

}  // namespace rlhf::cli
