// The `rlhf` subcommands. Each is a function in its own cli/cmd_<name>.cpp that takes the
// arguments after the subcommand name and returns an exit code; main.cpp lists them.
#pragma once

#include <string>
#include <vector>

namespace rlhf::cli {

using Argv = std::vector<std::string>;

struct Command {
  const char* name;
  const char* summary;  // one line for `rlhf --help`
  int (*run)(const Argv& args);
};

int cmd_validate(const Argv& args);
int cmd_plan(const Argv& args);
int cmd_sweep(const Argv& args);
int cmd_report(const Argv& args);
int cmd_spec(const Argv& args);
int cmd_init_model(const Argv& args);
int cmd_logprobs(const Argv& args);
int cmd_merge_adapter(const Argv& args);
int cmd_run(const Argv& args);
int cmd_worker(const Argv& args);
int cmd_tokenize(const Argv& args);
int cmd_generate(const Argv& args);
int cmd_reward(const Argv& args);
int cmd_dataset(const Argv& args);
int cmd_version(const Argv& args);

// All subcommands, in the order `rlhf --help` lists them.
const std::vector<Command>& commands();

}  // namespace rlhf::cli
