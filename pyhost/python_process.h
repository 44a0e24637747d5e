// pyhost's process machinery, shared by its pools (internal to pyhost/): one supervised
// interpreter process (PythonWorker) and the helpers that describe what happened to it.
// Each worker runs `interpreter -u -c <runner> ARGS...` in its own process group, killed by
// the kernel if the thread that forked it dies (PR_SET_PDEATHSIG); its stdin and stdout are
// one end of a socket pair, non-blocking on this side.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "core/errors.h"
#include "pyhost/python_pool.h"

namespace rlhf::pyhost {

using Clock = std::chrono::steady_clock;

constexpr size_t kPreviewBytes = 200;

// Throws RuntimeError "pyhost: WHAT: strerror(errno)".
[[noreturn]] void throw_errno(const std::string& what);

// An owned file descriptor. close() errors are not actionable here (the peer is ours).
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;

  int get() const { return fd_; }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

// "exited with status 3", "was killed by signal 11 (Segmentation fault)".
std::string describe_exit(int status);

// A pool's Python worker process died (exited or was killed) during a call; the pool is
// stopped. What a caller may recover from by starting the pool again.
class WorkerDied : public RuntimeError {
 public:
  using RuntimeError::RuntimeError;
};

// The source of a worker's runner, `python -u -c SOURCE FILE NAME`: a prelude every runner
// shares, then `body`. The prelude sets `path, name` from argv; keeps the protocol's
// stdin/stdout as `requests`/`replies` (binary) and sends the user's prints to stderr; and
// defines Refusal, send(**reply), user_traceback(e) and load_attribute(what), which imports
// FILE and returns its callable NAME or raises Refusal naming what is wrong (`what`: the kind
// of callable expected, for the message).
std::string python_runner(const char* body);
// `name` itself when it has a '/', else its first executable match on PATH. Throws InputError
// naming `pool_name` when there is none.
std::string find_interpreter(const std::string& name, const std::string& pool_name);
// At most the last `n` lines of `text`.
std::string last_lines(const std::string& text, size_t n);
// `s` as a JSON string literal, cut to about kPreviewBytes on a UTF-8 boundary.
std::string preview(const std::string& s);
// The start-up reply of a runner ({"ok": true} or {"ok": false, "error", "traceback"}) as an
// InputError naming `name` with the traceback's last lines; returns when it is ok.
void check_ready(const nlohmann::json& hello, const std::string& name);
// Opens `path` for appending (the workers' stderr); an empty Fd for "" (inherit ours).
Fd open_log(const std::string& path);

// One interpreter process, its group and its end of the protocol socket. Destroying it
// kills and reaps the process.
class PythonWorker {
 public:
  // Starts argv (argv[0] an executable path) with stderr to `log_fd` (-1: ours). Throws
  // RuntimeError when fork or exec fails.
  PythonWorker(const std::vector<std::string>& argv, int log_fd);
  ~PythonWorker();
  PythonWorker(const PythonWorker&) = delete;
  PythonWorker& operator=(const PythonWorker&) = delete;

  pid_t pid() const { return pid_; }
  int channel() const { return channel_.get(); }
  std::string& inbox() { return inbox_; }  // bytes received after the last complete line
  void close_channel() { channel_.reset(); }

  // Closes its input (the runner then exits by itself), waits for that until `deadline`,
  // kills its process group and reaps it. Returns the wait status (-1 if unknown).
  int stop(Clock::time_point deadline);

 private:
  pid_t pid_ = -1;
  int status_ = -1;
  Fd channel_;
  std::string inbox_;
};

// A pool's workers (PythonFunctionPool, PythonObjectPool).
using Workers = std::vector<std::unique_ptr<PythonWorker>>;

// config.workers interpreters running python_runner(runner) on `file` and `attribute` (the
// user's function or factory), stderr to config.log_path. Throws InputError naming
// `pool_name` when config.workers < 1, `file` does not exist or the interpreter is not found;
// RuntimeError when fork or exec fails.
Workers start_workers(const PythonPoolConfig& config, const std::string& pool_name,
                      const char* runner, const std::string& file, const std::string& attribute);

// The live workers' pids (for supervision).
std::vector<pid_t> live_pids(const Workers& workers);

// Closes every worker's input at once (so they exit in parallel), waits up to `grace_s` for
// them, then kills and reaps what is left.
void stop_workers(Workers& workers, double grace_s);

}  // namespace rlhf::pyhost
