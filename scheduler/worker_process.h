// One launched worker process (Boost.Process v1): its placement, pid, log file, exit status,
// and the failure report the job prints when it dies. Knows nothing about messages.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/errors.h"
#include "core/placement.h"

namespace rlhf {

// A worker died, stopped answering or failed to register; what() is the full report
// (role, rank, host, device, exit status or signal, last lines of its log).
class WorkerFailure : public RuntimeError {
 public:
  using RuntimeError::RuntimeError;
};

// The job was interrupted by SIGINT or SIGTERM; signal() says which (128 + it is the
// conventional exit status: 130 for SIGINT).
class JobInterrupted : public RuntimeError {
 public:
  explicit JobInterrupted(const std::string& what, int signal = 2)
      : RuntimeError(what), signal_(signal) {}
  int signal() const { return signal_; }

 private:
  int signal_;
};

// "exit code 3", "killed by signal 9 (SIGKILL)" from a waitpid status.
std::string describe_wait_status(int status);

// The last `lines` lines of a text file ("" when unreadable).
std::string tail_lines(const std::string& path, size_t lines);

class WorkerProcess {
 public:
  // Launches `program args...` with the placement's env plus `extra_env`; stdout and stderr
  // go to `log_path` (truncated). Throws RuntimeError when the launch fails.
  WorkerProcess(WorkerPlacement placement, const std::string& program,
                const std::vector<std::string>& args,
                const std::vector<std::pair<std::string, std::string>>& extra_env,
                std::string log_path);
  ~WorkerProcess();  // kills and reaps a still-running process
  WorkerProcess(const WorkerProcess&) = delete;
  WorkerProcess& operator=(const WorkerProcess&) = delete;

  const WorkerPlacement& placement() const { return placement_; }
  int pid() const { return pid_; }
  const std::string& log_path() const { return log_path_; }

  // Reaps without blocking: the waitpid status once it has exited, nullopt while it runs.
  std::optional<int> poll_exit();
  // Sends a signal unless already reaped (ignores ESRCH).
  void signal(int signo);
  // The failure report for this worker: `what` ("killed by signal 9 (SIGKILL)") + identity +
  // log tail.
  // `remote_pid` (> 0): the pid the worker registered with on its host, this one being its
  // launcher's (srun).
  std::string report(const std::string& what, size_t tail = 20, int remote_pid = -1) const;

 private:
  struct Impl;
  WorkerPlacement placement_;
  std::string log_path_;
  std::unique_ptr<Impl> impl_;
  int pid_ = -1;
  std::optional<int> exit_status_;
};

}  // namespace rlhf
