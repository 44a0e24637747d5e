#include "cli/commands.h"

namespace rlhf::cli {

const std::vector<Command>& commands() {
  static const std::vector<Command> kCommands = {
      {"tokenize", "token ids of text (or text of ids) with a model's tokenizer", cmd_tokenize},
  };
  return kCommands;
}

}  // namespace rlhf::cli
