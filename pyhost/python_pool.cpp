// PythonFunctionPool: fork/exec of the interpreters, the embedded runner script, and one poll()
// loop that feeds every worker its chunk and reads the replies before the deadline. No threads:
// the workers run concurrently as processes; this side only moves bytes.
#include "pyhost/python_pool.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <optional>
#include <thread>
#include <utility>

#include "core/errors.h"
#include "core/text.h"

namespace rlhf::pyhost {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

// Runs inside each worker as `python -u -c RUNNER FILE FUNCTION`. Replies, one JSON line each:
// {"ok":true,"ready":true} once the function is loaded (or {"ok":false,"error","traceback"},
// then exit), then per request {"ok":true,"rewards":[float|null]} or
// {"ok":false,"kind":"raised"|"returned","error":...,"traceback":...}.
constexpr const char* kRunner = R"PY(
import importlib.util, inspect, json, math, numbers, os, reprlib, sys, traceback

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

def load():
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
    fn = getattr(module, name)
    if not callable(fn):
        raise Refusal(f"{name} is a {type(fn).__name__}, not a function")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError) as e:
        raise Refusal(f"{name}: cannot read its signature: {e}")
    try:
        sig.bind_partial(prompts=[], completions=[], labels=[], any_column=[])
    except TypeError as e:
        raise Refusal(f"{name}{sig} must accept the keywords"
                      f" (prompts, completions, labels, **columns): {e}")
    return fn

def rewards_of(out, n):
    if hasattr(out, "tolist"):  # numpy arrays, torch tensors
        out = out.tolist()
    if not isinstance(out, (list, tuple)) or len(out) != n:
        raise Refusal(f"{type(out).__name__} {reprlib.repr(out)}, not a list of {n} numbers")
    rewards = []
    for i, r in enumerate(out):
        if isinstance(r, numbers.Real) and not math.isinf(r):
            rewards.append(None if math.isnan(r) else float(r))
        elif r is None:
            rewards.append(None)
        else:
            raise Refusal(f"{reprlib.repr(r)} at position {i}, not a finite number or None")
    return rewards

def main():
    try:
        fn = load()
    except Refusal as r:
        return send(ok=False, error=r.args[0], traceback=r.args[1] if len(r.args) > 1 else "")
    send(ok=True, ready=True)
    for line in requests:
        req = json.loads(line)
        try:
            out = fn(prompts=req["prompts"], completions=req["completions"],
                     labels=req["labels"], **req["columns"])
        except BaseException as e:
            send(ok=False, kind="raised", error=f"{type(e).__name__}: {e}",
                 traceback=user_traceback(e))
            continue
        try:
            send(ok=True, rewards=rewards_of(out, len(req["completions"])))
        except Refusal as r:
            send(ok=False, kind="returned", error=r.args[0])

main()
)PY";

constexpr const char* kReserved[] = {"prompts", "completions", "labels"};
constexpr size_t kPreviewBytes = 200;

[[noreturn]] void throw_errno(const std::string& what) {
  throw RuntimeError("pyhost: " + what + ": " + ::strerror(errno));
}

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

// One interpreter process, its group and its end of the protocol socket. Destroying it
// kills and reaps the process.
class PythonWorker {
 public:
  PythonWorker(const std::vector<std::string>& argv, int log_fd) {
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
  ~PythonWorker() { stop(Clock::now()); }
  PythonWorker(const PythonWorker&) = delete;
  PythonWorker& operator=(const PythonWorker&) = delete;

  pid_t pid() const { return pid_; }
  int channel() const { return channel_.get(); }
  std::string& inbox() { return inbox_; }  // bytes received after the last complete line
  void close_channel() { channel_.reset(); }

  // Closes its input (the runner then exits by itself), waits for that until `deadline`,
  // kills its process group and reaps it. Returns the wait status (-1 if unknown).
  int stop(Clock::time_point deadline) {
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

 private:
  pid_t pid_ = -1;
  int status_ = -1;
  Fd channel_;
  std::string inbox_;
};

PythonFunctionPool::PythonFunctionPool(PythonPoolConfig config, std::string file,
                                       std::string function)
    : config_(std::move(config)),
      file_(std::move(file)),
      function_(std::move(function)),
      name_(file_ + ":" + function_) {
  if (config_.workers < 1) {
    throw InputError(name_ + ": pyhost needs at least 1 worker, got " +
                     std::to_string(config_.workers));
  }
  if (!(config_.timeout_s > 0) || !(config_.start_timeout_s > 0)) {
    throw InputError(name_ + ": pyhost timeouts must be > 0 s, got " +
                     std::to_string(config_.timeout_s) + " and " +
                     std::to_string(config_.start_timeout_s));
  }
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file_, ec)) throw InputError(name_ + ": no such file");
  const std::string interpreter = find_interpreter(config_.interpreter, name_);

  Fd log;
  if (!config_.log_path.empty()) {
    log = Fd(::open(config_.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
    if (log.get() < 0) throw_errno("open worker log " + config_.log_path);
  }
  const std::vector<std::string> argv = {interpreter, "-u", "-c", kRunner, file_, function_};
  for (int i = 0; i < config_.workers; ++i) {
    workers_.push_back(std::make_unique<PythonWorker>(argv, log.get()));
  }

  const auto hellos = exchange(std::vector<std::string>(workers_.size()), config_.start_timeout_s,
                               [](size_t) { return std::string("while starting"); });
  for (const auto& hello : hellos) {
    if (hello.value("ok", false)) continue;
    std::string message = name_ + ": " + hello.value("error", std::string("refused to start"));
    const std::string traceback = last_lines(hello.value("traceback", std::string()), 12);
    if (!traceback.empty()) message += "\n" + traceback;
    throw InputError(message);
  }
}

PythonFunctionPool::~PythonFunctionPool() {
  stop_all(1.0);
}

std::vector<pid_t> PythonFunctionPool::worker_pids() const {
  std::vector<pid_t> pids;
  for (const auto& w : workers_) {
    if (w->pid() > 0) pids.push_back(w->pid());
  }
  return pids;
}

void PythonFunctionPool::stop_all(double grace_s) {
  for (auto& w : workers_) w->close_channel();  // all at once, so they exit in parallel
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(grace_s));
  for (auto& w : workers_) w->stop(deadline);
}

void PythonFunctionPool::fail_and_stop(const std::string& message) {
  stopped_because_ = message;
  stop_all(0);
  throw RuntimeError(message);
}

std::vector<json> PythonFunctionPool::exchange(const std::vector<std::string>& requests,
                                               double timeout_s,
                                               const std::function<std::string(size_t)>& doing) {
  const size_t n = requests.size();
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(timeout_s));
  const std::string log_hint =
      config_.log_path.empty() ? "" : " (its stderr is in " + config_.log_path + ")";
  std::vector<size_t> sent(n, 0);
  std::vector<std::optional<json>> replies(n);
  size_t answered = 0;
  std::vector<pollfd> fds;
  std::vector<size_t> polled;  // fds[k] is worker polled[k]

  auto died = [&](size_t i) {
    const pid_t pid = workers_[i]->pid();
    const int status = workers_[i]->stop(Clock::now() + std::chrono::seconds(1));
    fail_and_stop(name_ + ": Python worker pid " + std::to_string(pid) + " " +
                  describe_exit(status) + " " + doing(i) + log_hint + "; the pool is stopped");
  };

  while (answered < n) {
    fds.clear();
    polled.clear();
    for (size_t i = 0; i < n; ++i) {
      if (replies[i]) continue;
      const short out = sent[i] < requests[i].size() ? POLLOUT : 0;
      fds.push_back(pollfd{workers_[i]->channel(), static_cast<short>(POLLIN | out), 0});
      polled.push_back(i);
    }
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      std::vector<std::string> late;
      for (size_t i : polled) {
        late.push_back("pid " + std::to_string(workers_[i]->pid()) + " " + doing(i));
      }
      char limit[32];
      std::snprintf(limit, sizeof limit, "%g", timeout_s);
      fail_and_stop(name_ + " did not answer within " + limit + " s (" + join(late, ", ") +
                    "); every worker was killed and the pool is stopped");
    }
    const int ready = ::poll(fds.data(), fds.size(), static_cast<int>(left.count()));
    if (ready < 0) {
      if (errno == EINTR) continue;
      throw_errno("poll");
    }
    for (size_t k = 0; k < fds.size(); ++k) {
      const size_t i = polled[k];
      const int fd = fds[k].fd;
      if (fds[k].revents & POLLOUT) {
        const ssize_t w =
            ::send(fd, requests[i].data() + sent[i], requests[i].size() - sent[i], MSG_NOSIGNAL);
        if (w >= 0) {
          sent[i] += static_cast<size_t>(w);
        } else if (errno == EPIPE || errno == ECONNRESET) {
          died(i);
        } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
          throw_errno("send to Python worker");
        }
      }
      if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buffer[1 << 16];
      const ssize_t r = ::recv(fd, buffer, sizeof buffer, 0);
      if (r == 0 || (r < 0 && errno == ECONNRESET)) died(i);
      if (r < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
        throw_errno("recv from Python worker");
      }
      std::string& inbox = workers_[i]->inbox();
      inbox.append(buffer, static_cast<size_t>(r));
      const size_t eol = inbox.find('\n');
      if (eol == std::string::npos) continue;
      const std::string line = inbox.substr(0, eol);
      inbox.erase(0, eol + 1);
      json reply = json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (!reply.is_object()) {
        fail_and_stop(name_ + ": Python worker sent a line that is not a JSON object " + doing(i) +
                      ": " + preview(line));
      }
      replies[i] = std::move(reply);
      ++answered;
    }
  }
  std::vector<json> out;
  for (auto& r : replies) out.push_back(std::move(*r));
  return out;
}

std::vector<double> PythonFunctionPool::call(const std::vector<std::string>& prompts,
                                             const std::vector<std::string>& completions,
                                             const std::vector<std::string>& labels,
                                             const std::vector<json>& extra) {
  if (!stopped_because_.empty()) {
    throw RuntimeError(name_ + ": the pool was stopped by an earlier failure: " + stopped_because_);
  }
  const size_t rows = completions.size();
  if (prompts.size() != rows || (!labels.empty() && labels.size() != rows) ||
      (!extra.empty() && extra.size() != rows)) {
    throw InputError(name_ + ": " + std::to_string(prompts.size()) + " prompts, " +
                     std::to_string(rows) + " completions, " + std::to_string(labels.size()) +
                     " labels, " + std::to_string(extra.size()) +
                     " extra rows (labels and extra may be empty; otherwise one per row)");
  }
  if (rows == 0) return {};

  std::vector<std::string> columns;  // in first-seen order
  for (size_t r = 0; r < extra.size(); ++r) {
    if (!extra[r].is_object()) {
      throw InputError(name_ + ": extra columns of row " + std::to_string(r) +
                       " must be a JSON object, got " + extra[r].type_name());
    }
    for (const auto& [key, value] : extra[r].items()) {
      for (const char* reserved : kReserved) {
        if (key == reserved) {
          throw InputError(name_ + ": a column may not be named '" + key +
                           "' (the function already gets it)");
        }
      }
      if (std::find(columns.begin(), columns.end(), key) == columns.end()) columns.push_back(key);
    }
  }

  // Contiguous chunks, the first rows % chunks of them one row longer.
  const size_t chunks = std::min(rows, static_cast<size_t>(workers_.size()));
  std::vector<size_t> begin(chunks + 1, 0);
  for (size_t c = 0; c < chunks; ++c) begin[c + 1] = begin[c] + rows / chunks + (c < rows % chunks);

  std::vector<std::string> requests(chunks);
  for (size_t c = 0; c < chunks; ++c) {
    const size_t b = begin[c], e = begin[c + 1];
    json request;
    request["prompts"] = std::vector<std::string>(prompts.begin() + b, prompts.begin() + e);
    request["completions"] =
        std::vector<std::string>(completions.begin() + b, completions.begin() + e);
    if (labels.empty()) {
      request["labels"] = json::array();
      for (size_t r = b; r < e; ++r) request["labels"].push_back(nullptr);
    } else {
      request["labels"] = std::vector<std::string>(labels.begin() + b, labels.begin() + e);
    }
    json& cols = request["columns"] = json::object();
    for (const auto& column : columns) {
      json& values = cols[column] = json::array();
      for (size_t r = b; r < e; ++r) values.push_back(extra[r].value(column, json()));
    }
    requests[c] = request.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
  }
  auto rows_of = [&](size_t c) {
    const std::string first = std::to_string(begin[c]), last = std::to_string(begin[c + 1] - 1);
    return "while scoring " + (first == last ? "row " + first : "rows " + first + ".." + last) +
           " of " + std::to_string(rows);
  };
  const auto replies = exchange(requests, config_.timeout_s, rows_of);

  std::vector<double> rewards;
  rewards.reserve(rows);
  for (size_t c = 0; c < chunks; ++c) {
    const json& reply = replies[c];
    const size_t b = begin[c], n = begin[c + 1] - b;
    if (!reply.value("ok", false)) {
      const std::string kind = reply.value("kind", std::string());
      const std::string error = reply.value("error", std::string());
      std::string first_row =
          "; the first: prompt=" + preview(prompts[b]) + " completion=" + preview(completions[b]);
      if (!labels.empty()) first_row += " label=" + preview(labels[b]);
      if (kind == "raised") {
        throw RuntimeError(name_ + " raised " + error + "\n" +
                           last_lines(reply.value("traceback", std::string()), 40) + "\n" +
                           rows_of(c) + first_row);
      }
      throw RuntimeError(name_ + " returned " + error + " " + rows_of(c) + first_row);
    }
    const json& values = reply.value("rewards", json());
    if (!values.is_array() || values.size() != n) {
      fail_and_stop(name_ + ": Python worker sent a malformed reply " + rows_of(c) + ": " +
                    preview(reply.dump()));
    }
    for (const auto& v : values) {
      rewards.push_back(v.is_number() ? v.get<double>() : std::nan(""));
    }
  }
  return rewards;
}

}  // namespace rlhf::pyhost
