// `rlhf spec`: the job-spec reference generated from the key table.
#include <iostream>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/errors.h"
#include "core/spec_schema.h"

namespace rlhf::cli {

int cmd_spec(const Argv& argv) {
  const std::vector<OptionSpec> options = {
      {"--markdown", false, "print docs/job-spec.md (every key: type, default, range, doc)"},
      {"--defaults", false, "print the default spec as JSON"},
      {"--help", false, "show this help"}};
  Args args(argv, options);
  if (args.flag("--markdown")) {
    std::cout << spec_markdown();
  } else if (args.flag("--defaults")) {
    std::cout << default_spec_json().dump(2) << '\n';
  } else {
    std::cout << "usage: rlhf spec (--markdown | --defaults)\n\n"
                 "Prints the job-spec reference, generated from the one table of keys.\n\n"
              << format_options(options);
    if (!args.flag("--help")) throw InputError("choose --markdown or --defaults");
  }
  return 0;
}

}  // namespace rlhf::cli
