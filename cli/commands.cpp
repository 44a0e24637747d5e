#include "cli/commands.h"

namespace rlhf::cli {

const std::vector<Command>& commands() {
  static const std::vector<Command> kCommands = {
      {"run", "start the workers of a job spec, run it, stop them (exit 1 names a failed worker)", cmd_run},
      {"worker", "internal: one worker process, started by `rlhf run`", cmd_worker},
  };
  return kCommands;
}

}  // namespace rlhf::cli
