// Error types and the exit codes they map to. Library code throws; only main() and a
// worker's top loop catch. Messages name the file, key, line or rank and what was expected.
#pragma once

#include <stdexcept>
#include <string>

namespace rlhf {

// Process exit codes, documented in `rlhf --help` and the README.
enum class ExitCode : int {
  kOk = 0,
  kRuntime = 1,   // something failed while running: a worker died, I/O failed
  kBadInput = 2,  // bad spec, dataset, checkpoint, message or command line
};

// Bad user input (spec, dataset line, checkpoint file, command-line argument): exit 2.
class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A failure while running (worker death, I/O, collective timeout): exit 1.
class RuntimeError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace rlhf
