// WorkerProcess over boost::process::child; exit statuses decoded from waitpid.
#include "scheduler/worker_process.h"

#include <signal.h>
#include <string.h>
#include <sys/wait.h>

#include <boost/process/args.hpp>
#include <boost/process/child.hpp>
#include <boost/process/env.hpp>
#include <boost/process/environment.hpp>
#include <boost/process/exe.hpp>
#include <boost/process/io.hpp>
#include <boost/process/search_path.hpp>
#include <deque>
#include <fstream>
#include <sstream>

namespace bp = boost::process;

namespace rlhf {

struct WorkerProcess::Impl {
  bp::child child;
};

std::string describe_wait_status(int status) {
  if (WIFEXITED(status)) return "exit code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* abbrev = sigabbrev_np(sig);
    return "killed by signal " + std::to_string(sig) +
           (abbrev ? std::string(" (SIG") + abbrev + ")" : "");
  }
  return "wait status " + std::to_string(status);
}

std::string tail_lines(const std::string& path, size_t lines) {
  std::ifstream in(path);
  if (!in) return "";
  std::deque<std::string> last;
  for (std::string line; std::getline(in, line);) {
    last.push_back(line);
    if (last.size() > lines) last.pop_front();
  }
  std::string out;
  for (const auto& l : last) out += l + '\n';
  return out;
}

WorkerProcess::WorkerProcess(WorkerPlacement placement, const std::string& program,
                             const std::vector<std::string>& args,
                             const std::vector<std::pair<std::string, std::string>>& extra_env,
                             std::string log_path)
    : placement_(std::move(placement)), log_path_(std::move(log_path)) {
  bp::environment env = boost::this_process::environment();
  for (const auto& [k, v] : placement_.env) env[k] = v;
  for (const auto& [k, v] : extra_env) env[k] = v;
  // A bare name (the Slurm launcher's "srun") is looked up in PATH, as a shell would.
  const std::string exe =
      program.find('/') == std::string::npos ? bp::search_path(program).string() : program;
  if (exe.empty())
    throw RuntimeError("cannot start worker " + placement_.label() + ": " + program +
                       " is not in PATH");
  std::error_code ec;
  impl_ = std::make_unique<Impl>(
      Impl{bp::child(bp::exe = exe, bp::args = args, bp::env = env,
                     (bp::std_out & bp::std_err) > log_path_, bp::std_in < bp::null, ec)});
  if (ec)
    throw RuntimeError("cannot start worker " + placement_.label() + " (" + program +
                       "): " + ec.message());
  pid_ = impl_->child.id();
}

WorkerProcess::~WorkerProcess() {
  if (!impl_ || exit_status_) return;
  signal(SIGKILL);
  std::error_code ec;
  impl_->child.wait(ec);
}

std::optional<int> WorkerProcess::poll_exit() {
  if (exit_status_) return exit_status_;
  int status = 0;
  const pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    exit_status_ = status;
    impl_->child.detach();  // reaped here; keep boost from waiting on it again
  } else if (r < 0 && errno == ECHILD) {
    exit_status_ = 0;  // someone else reaped it; status unknown
  }
  return exit_status_;
}

void WorkerProcess::signal(int signo) {
  if (exit_status_) return;
  if (::kill(pid_, signo) != 0 && errno != ESRCH)
    throw RuntimeError("kill(" + std::to_string(pid_) + ") failed: " + strerror(errno));
}

std::string WorkerProcess::report(const std::string& what, size_t tail, int remote_pid) const {
  std::ostringstream out;
  const auto& p = placement_;
  out << "worker " << p.label() << " " << what << "\n"
      << "  role " << role_name(p.role) << ", rank " << p.rank << " of " << p.group_size
      << ", host " << p.host << " (node " << p.node << "), device "
      << device_kind_name(p.device_kind) << ":" << p.device_id;
  if (remote_pid > 0)
    out << ", pid " << remote_pid << " there (its launcher's pid here: " << pid_ << ")\n";
  else
    out << ", pid " << pid_ << "\n";
  out << "  last lines of " << log_path_ << ":\n";
  std::istringstream lines(tail_lines(log_path_, tail));
  for (std::string line; std::getline(lines, line);) out << "    | " << line << "\n";
  return out.str();
}

}  // namespace rlhf
