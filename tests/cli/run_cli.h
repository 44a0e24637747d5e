// Runs the real `rlhf` binary and captures its exit code, stdout and stderr.
#pragma once

#include <string>
#include <vector>

namespace rlhf::test {

struct CliResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// `args` are passed through a shell, each single-quoted.
CliResult run_cli(const std::vector<std::string>& args);

// Writes `text` to a fresh file under the test temp dir and returns its path.
std::string write_temp(const std::string& name, const std::string& text);

}  // namespace rlhf::test
