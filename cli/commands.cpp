#include "cli/commands.h"

namespace rlhf::cli {

const std::vector<Command>& commands() {
  static const std::vector<Command> kCommands = {
      {"init-model", "write a randomly initialised model (preset) in Hugging Face format", cmd_init_model},
      {"logprobs", "per-token log-probs of token-id sequences under a model (JSON lines)", cmd_logprobs},
  };
  return kCommands;
}

}  // namespace rlhf::cli
