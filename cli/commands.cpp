#include "cli/commands.h"

namespace rlhf::cli {

const std::vector<Command>& commands() {
  static const std::vector<Command> kCommands = {
  };
  return kCommands;
}

}  // namespace rlhf::cli
