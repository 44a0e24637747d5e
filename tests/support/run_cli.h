// Test support shared by the suites that run the real `rlhf` binary: run it and capture its
// exit code, stdout and stderr; read the files a run writes.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace rlhf::test {

struct CliResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// Runs `rlhf ARGS` from the source directory (examples/ paths work); `args` are passed
// through a shell, each single-quoted. A run past `timeout_s` (300 s unless a long job says
// otherwise, under ctest's 600 s per test) is killed (exit code 124), so a hanging job fails
// its test instead of stalling the suite.
CliResult run_cli(const std::vector<std::string>& args, int timeout_s = 300);

// The whole file ("" when it cannot be read).
std::string slurp(const std::string& path);
// One JSON value per non-empty line.
std::vector<nlohmann::json> read_jsonl(const std::string& path);

// Writes `text` to a fresh file under the test temp dir and returns its path.
std::string write_temp(const std::string& name, const std::string& text);

// A fresh directory <build>/test-runs/<name>-<pid> holding two models made by `rlhf
// init-model`: "tiny" (the tiny preset, seed 0) and "tiny-value" (with a value head, seed
// 7). Throws std::runtime_error with init-model's stderr when one cannot be made.
std::string tiny_models_dir(const std::string& name);

// `s` single-quoted for a POSIX shell.
std::string shell_quote(const std::string& s);

// Runs `RLHF_PYTHON SCRIPT ARGS` (one torch thread, killed after 300 s) with its output in
// `log`; "" on success, else the command, its status, `install_hint` and the output (why the
// reference could not run). `args` go to the shell as they are.
std::string run_python_reference(const std::string& script, const std::string& args,
                                 const std::string& log, const std::string& install_hint);

// How often `part` occurs in `text` (overlapping occurrences counted).
size_t count_of(const std::string& text, const std::string& part);

}  // namespace rlhf::test
