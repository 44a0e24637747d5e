// Test helper: start a real child process (fork + exec of a helper executable), wait for it
// with a deadline, kill it. Header-only; used by the transport and engine tests.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace rlhf::testing {

class ChildProcess {
 public:
  // Starts `argv[0]` with `argv`; stdout/stderr go to `log_path` (appended).
  ChildProcess(const std::vector<std::string>& argv, const std::string& log_path) {
    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      FILE* log = std::fopen(log_path.c_str(), "a");
      if (log != nullptr) {
        ::dup2(fileno(log), 1);
        ::dup2(fileno(log), 2);
      }
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      ::execv(args[0], args.data());
      ::_exit(127);
    }
  }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ~ChildProcess() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }

  pid_t pid() const { return pid_; }

  // Exit code (0..255), 128 + signal when killed, or -1 when `timeout` passed (then killed).
  int wait(std::chrono::seconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (true) {
      int status = 0;
      pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        reaped_ = true;
        if (WIFEXITED(status)) return WEXITSTATUS(status);
        if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
        return -2;
      }
      if (std::chrono::steady_clock::now() > deadline) {
        kill(SIGKILL);
        ::waitpid(pid_, nullptr, 0);
        reaped_ = true;
        return -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

  void kill(int signal) { ::kill(pid_, signal); }

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
};

}  // namespace rlhf::testing
