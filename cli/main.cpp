// `rlhf`: parse the subcommand, run it, map exceptions to exit codes. Nothing else.
#include <cstring>
#include <iostream>

#include "cli/commands.h"
#include "cli/job_schema.h"
#include "core/errors.h"
#include "rlhf_version.h"

namespace {

void print_help() {
  std::cout
      << "rlhf: train language models with RLHF (PPO, GRPO, RLOO, REINFORCE++, DPO, SFT, RM)\n"
         "from one JSON job spec, each model role on its own device group.\n\n"
         "usage: rlhf COMMAND [ARGS...]      rlhf COMMAND --help for its options\n\n"
         "commands:\n";
  for (const auto& c : rlhf::cli::commands()) {
    std::string name = c.name;
    std::cout << "  " << name << std::string(name.size() < 12 ? 12 - name.size() : 1, ' ')
              << c.summary << '\n';
  }
  std::cout << "\nexit codes: 0 success, 1 runtime failure, 2 bad input (spec, data, arguments), "
               "130 interrupted (Ctrl-C)\n"
               "rlhf --version prints the version (rlhf version: also torch, CUDA, GPUs)\n";
}

}  // namespace

int main(int argc, char** argv) {
  using rlhf::ExitCode;
  rlhf::cli::install_composed_job_schema();
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") ||
      !std::strcmp(argv[1], "help")) {
    print_help();
    return argc < 2 ? static_cast<int>(ExitCode::kBadInput) : 0;
  }
  if (!std::strcmp(argv[1], "--version") || !std::strcmp(argv[1], "-V")) {
    std::cout << "rlhf " << RLHF_VERSION << '\n';
    return 0;
  }
  const std::string name = argv[1];
  rlhf::cli::Argv args(argv + 2, argv + argc);
  for (const auto& c : rlhf::cli::commands()) {
    if (name != c.name) continue;
    try {
      return c.run(args);
    } catch (const rlhf::InputError& e) {
      std::cerr << "rlhf " << name << ": error: " << e.what() << '\n';
      return static_cast<int>(ExitCode::kBadInput);
    } catch (const std::exception& e) {
      std::cerr << "rlhf " << name << ": error: " << e.what() << '\n';
      return static_cast<int>(ExitCode::kRuntime);
    }
  }
  std::cerr << "rlhf: unknown command '" << name << "' (see rlhf --help)\n";
  return static_cast<int>(ExitCode::kBadInput);
}
