// The process machinery of pyhost's pools: fork/exec of an interpreter in its own process
// group with PR_SET_PDEATHSIG, and its supervision (stop, kill, reap). Shared by the function
// pool (python_pool.cpp) and the object pool (python_objects.cpp).
#include "pyhost/python_process.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <thread>
#include <utility>

#include "core/errors.h"
#include "core/text.h"

namespace rlhf::pyhost {

using nlohmann::json;

[[noreturn]] void throw_errno(const std::string& what) {
  throw RuntimeError("pyhost: " + what + ": " + ::strerror(errno));
}

// "exited with status 3", "was killed by signal 11 (Segmentation fault)".
namespace {

constexpr const char* kRunnerPrelude = R"PY(
import importlib.util, json, os, reprlib, sys, traceback

path, name = sys.argv[1], sys.argv[2]
# The protocol owns the real stdin/stdout; the user's prints (even a C library's) go to stderr.
requests, replies = os.fdopen(os.dup(0), "rb"), os.fdopen(os.dup(1), "wb")
null = os.open(os.devnull, os.O_RDONLY)
os.dup2(null, 0)
os.close(null)
os.dup2(2, 1)
# Whole lines, one write each: workers sharing a log then do not interleave mid-line.
sys.stdout = sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="backslashreplace",
                               closefd=False)

class Refusal(Exception):
    pass

def send(**reply):
    replies.write(json.dumps(reply, allow_nan=False).encode() + b"\n")
    replies.flush()

def user_traceback(e):  # without the runner's own frame
    return "".join(traceback.format_exception(type(e), e, e.__traceback__.tb_next))

def load_attribute(what):
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    stem = os.path.splitext(os.path.basename(path))[0]
    module_name = stem if stem not in sys.modules else "rlhf_user_" + stem
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as e:
        raise Refusal("does not import", user_traceback(e))
    if not hasattr(module, name):
        raise Refusal(f"{os.path.basename(path)} has no attribute {name!r}")
    attribute = getattr(module, name)
    if not callable(attribute):
        raise Refusal(f"{name} is a {type(attribute).__name__}, not a {what}")
    return attribute
)PY";

}  // namespace

std::string python_runner(const char* body) {
  return std::string(kRunnerPrelude) + body;
}

std::string describe_exit(int status) {
  if (status < 0) return "exited (status unknown: reaped elsewhere)";
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const char* what = ::sigdescr_np(WTERMSIG(status));
    return "was killed by signal " + std::to_string(WTERMSIG(status)) + " (" + (what ? what : "?") +
           ")";
  }
  return "stopped with wait status " + std::to_string(status);
}

// `name` itself when it has a '/', else its first executable match on PATH.
std::string find_interpreter(const std::string& name, const std::string& pool_name) {
  namespace fs = std::filesystem;
  auto runnable = [](const std::string& p) {
    std::error_code ec;
    return fs::is_regular_file(p, ec) && ::access(p.c_str(), X_OK) == 0;
  };
  if (name.find('/') != std::string::npos) {
    if (runnable(name)) return name;
    throw InputError(pool_name + ": interpreter '" + name + "' is not an executable file");
  }
  const char* path = std::getenv("PATH");
  for (const auto& dir : split(path ? path : "/usr/local/bin:/usr/bin:/bin", ':')) {
    const std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + name;
    if (runnable(candidate)) return candidate;
  }
  throw InputError(pool_name + ": interpreter '" + name + "' not found on PATH");
}

// At most the last `n` lines of `text`.
std::string last_lines(const std::string& text, size_t n) {
  std::vector<std::string> lines = split(text, '\n');
  while (!lines.empty() && lines.back().empty()) lines.pop_back();
  if (lines.size() > n) lines.erase(lines.begin(), lines.end() - static_cast<ptrdiff_t>(n));
  return join(lines, "\n");
}

// `s` as a JSON string literal, cut to about kPreviewBytes on a UTF-8 boundary.
std::string preview(const std::string& s) {
  std::string cut = s;
  if (s.size() > kPreviewBytes) {
    size_t end = kPreviewBytes;
    while (end > 0 && (static_cast<unsigned char>(s[end]) & 0xC0) == 0x80) --end;
    cut = s.substr(0, end) + "... (" + std::to_string(s.size()) + " bytes)";
  }
  return json(cut).dump(-1, ' ', false, json::error_handler_t::replace);
}

void check_ready(const json& hello, const std::string& name) {
  if (hello.value("ok", false)) return;
  std::string message = name + ": " + hello.value("error", std::string("refused to start"));
  const std::string traceback = last_lines(hello.value("traceback", std::string()), 12);
  if (!traceback.empty()) message += "\n" + traceback;
  throw InputError(message);
}

Fd open_log(const std::string& path) {
  if (path.empty()) return Fd();
  Fd log(::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
  if (log.get() < 0) throw_errno("open worker log " + path);
  return log;
}

namespace {

// Runs in the forked child until exec: async-signal-safe calls only. A failure before exec
// writes errno to `error_pipe` (closed by exec on success) for the parent to report.
[[noreturn]] void exec_child(char* const* argv, int channel, int log_fd, int error_pipe,
                             pid_t parent) {
  auto fail = [error_pipe](int err) {
    if (::write(error_pipe, &err, sizeof err) < 0) {
      // Nothing left to tell: the parent then sees exit status 127.
    }
    ::_exit(127);
  };
  sigset_t none;
  if (::sigemptyset(&none) != 0 || ::sigprocmask(SIG_SETMASK, &none, nullptr) != 0) fail(errno);
  if (::setpgid(0, 0) != 0) fail(errno);  // its own group: a timeout kills what it started too
  if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) fail(errno);
  if (::getppid() != parent) ::_exit(127);  // the parent died before prctl took effect
  if (::dup2(channel, 0) < 0 || ::dup2(channel, 1) < 0) fail(errno);
  if (log_fd >= 0 && ::dup2(log_fd, 2) < 0) fail(errno);
  // Descriptors other code opened without O_CLOEXEC must not leak into Python. Best effort:
  // kernels before 5.11 answer EINVAL/ENOSYS and then those stay open.
  ::close_range(3, ~0U, CLOSE_RANGE_CLOEXEC);
  ::execv(argv[0], argv);
  fail(errno);
  ::_exit(127);  // not reached
}

}  // namespace

PythonWorker::PythonWorker(const std::vector<std::string>& argv, int log_fd) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) throw_errno("socketpair");
  Fd ours(sv[0]), theirs(sv[1]);
  int ep[2];
  if (::pipe2(ep, O_CLOEXEC) != 0) throw_errno("pipe2");
  Fd exec_error_read(ep[0]), exec_error_write(ep[1]);
  std::vector<std::string> args = argv;  // execv wants char*; prepared before fork
  std::vector<char*> raw;
  for (auto& a : args) raw.push_back(a.data());
  raw.push_back(nullptr);

  const pid_t parent = ::getpid();
  pid_ = ::fork();
  if (pid_ < 0) throw_errno("fork");
  if (pid_ == 0) exec_child(raw.data(), theirs.get(), log_fd, exec_error_write.get(), parent);
  theirs.reset();
  exec_error_write.reset();

  int child_errno = 0;
  ssize_t got;
  do {
    got = ::read(exec_error_read.get(), &child_errno, sizeof child_errno);
  } while (got < 0 && errno == EINTR);
  if (got != 0) {  // exec did not happen (or the read failed): the child is exiting
    const int err = got < 0 ? errno : child_errno;
    stop(Clock::now());
    throw RuntimeError("pyhost: cannot start " + argv[0] + ": " + ::strerror(err));
  }
  const int flags = ::fcntl(ours.get(), F_GETFL);
  if (flags < 0 || ::fcntl(ours.get(), F_SETFL, flags | O_NONBLOCK) != 0) {
    stop(Clock::now());
    throw_errno("fcntl O_NONBLOCK");
  }
  channel_ = std::move(ours);
}

PythonWorker::~PythonWorker() {
  stop(Clock::now());
}

int PythonWorker::stop(Clock::time_point deadline) {
  if (pid_ <= 0) return status_;
  channel_.reset();
  while (Clock::now() < deadline) {
    siginfo_t info{};
    if (::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) != 0) {
      if (errno == EINTR) continue;
      break;  // ECHILD: this process ignores SIGCHLD, so the kernel reaps for us
    }
    if (info.si_pid == pid_) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  // The whole group, so whatever the function started goes too. The leader is not reaped
  // yet, so its pid (the group's id) cannot have been reused. ESRCH: nothing left. Any
  // other failure leaves the direct kill, whose own failure means it is gone already.
  if (::kill(-pid_, SIGKILL) != 0 && errno != ESRCH && ::kill(pid_, SIGKILL) != 0) {
    // Nothing more to do: waitpid below reports what happened.
  }
  int status = 0;
  pid_t r;
  do {
    r = ::waitpid(pid_, &status, 0);
  } while (r < 0 && errno == EINTR);
  status_ = r == pid_ ? status : -1;
  pid_ = -1;
  return status_;
}

Workers start_workers(const PythonPoolConfig& config, const std::string& pool_name,
                      const char* runner, const std::string& file, const std::string& attribute) {
  if (config.workers < 1) {
    throw InputError(pool_name + ": pyhost needs at least 1 worker, got " +
                     std::to_string(config.workers));
  }
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file, ec)) throw InputError(pool_name + ": no such file");
  const std::string interpreter = find_interpreter(config.interpreter, pool_name);
  const Fd log = open_log(config.log_path);
  const std::vector<std::string> argv = {interpreter,           "-u", "-c",
                                         python_runner(runner), file, attribute};
  Workers workers;
  for (int i = 0; i < config.workers; ++i)
    workers.push_back(std::make_unique<PythonWorker>(argv, log.get()));
  return workers;
}

std::vector<pid_t> live_pids(const Workers& workers) {
  std::vector<pid_t> pids;
  for (const auto& w : workers) {
    if (w->pid() > 0) pids.push_back(w->pid());
  }
  return pids;
}

void stop_workers(Workers& workers, double grace_s) {
  for (auto& w : workers) w->close_channel();  // all at once, so they exit in parallel
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(grace_s));
  for (auto& w : workers) w->stop(deadline);
}

}  // namespace rlhf::pyhost
