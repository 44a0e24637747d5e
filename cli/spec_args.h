// The SPEC positional and `--set PATH=VALUE` options that every spec-taking subcommand shares.
#pragma once

#include <string>

#include "cli/args.h"
#include "core/spec.h"

namespace rlhf::cli {

// `--set PATH=VALUE` (repeatable), for the option lists of spec-taking commands.
OptionSpec set_option();

// Loads the single SPEC positional with its --set overrides; throws InputError (a usage
// message naming `command`) or SpecError.
JobSpec load_spec_arg(const Args& args, const std::string& command);

// "ppo job (estimator gae): 5 workers on 1 node (actor 1, ...); 8 prompts x 2 samples ..."
std::string spec_summary(const JobSpec& spec);

}  // namespace rlhf::cli
