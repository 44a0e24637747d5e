// `rlhf dataset synthetic:NAME`: the rows of a built-in prompt dataset as JSON lines
// {"prompt", "label"}, to read what a job trains on or to hand the same problems to another
// framework (bench/trl_grpo_arith.py does).
#include <iostream>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/errors.h"
#include "ppo/prompt_dataset.h"

namespace rlhf::cli {

int cmd_dataset(const Argv& argv) {
  const std::vector<OptionSpec> options = {
      {"--count", true, "rows (default 1024)", "N"},
      {"--seed", true, "the seed (train.seed; default 42; arith_test ignores it)", "S"},
      {"--help", false, "show this help"}};
  Args args(argv, options);
  if (args.flag("--help") || args.positionals().size() != 1) {
    std::cout << "usage: rlhf dataset synthetic:NAME [--count N] [--seed S]\n\n"
                 "Prints the rows of a built-in prompt dataset as JSON lines {\"prompt\", "
                 "\"label\"}.\n\n"
              << format_options(options);
    return args.flag("--help") ? 0 : 2;
  }
  const std::string source = args.positionals()[0];
  if (source.rfind("synthetic:", 0) != 0)
    throw InputError("rlhf dataset: expected synthetic:NAME, got \"" + source + "\"");
  const auto rows = ppo::synthetic_prompts(source.substr(10), args.integer("--count", 1024, 1),
                                           static_cast<uint64_t>(args.integer("--seed", 42, 0)));
  for (const auto& r : rows)
    std::cout << nlohmann::json({{"prompt", r.input}, {"label", r.label}}).dump() << '\n';
  return 0;
}

}  // namespace rlhf::cli
