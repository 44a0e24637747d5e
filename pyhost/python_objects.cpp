// PythonObjectPool: the object runner script and a poll() loop that writes queued requests
// and reads reply lines from every worker. No threads: the workers run concurrently as
// processes; this side only moves bytes.
#include "pyhost/python_objects.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>

#include <chrono>
#include <cstdio>

#include "core/errors.h"
#include "core/text.h"
#include "pyhost/python_process.h"

namespace rlhf::pyhost {
namespace {

using nlohmann::json;

// Runs inside each worker after python_runner's prelude, as `python -u -c RUNNER FILE FACTORY`.
// Replies, one JSON line each:
// {"ok":true,"ready":true} once the factory is found (or {"ok":false,"error","traceback"},
// then exit), then one per request as python_objects.h says. SIGINT raises KeyboardInterrupt
// only while a user call runs (`busy`), so a late interrupt cannot kill the loop itself.
constexpr const char* kObjectRunner = R"PY(
import inspect, signal

busy = False

def on_sigint(signum, frame):
    if busy:
        raise KeyboardInterrupt("interrupted by rlhf: the call ran past its time limit")

signal.signal(signal.SIGINT, on_sigint)

def load():
    return load_attribute("class or function")

def as_json(out):
    try:
        return json.loads(json.dumps(out, allow_nan=False))
    except (TypeError, ValueError) as e:
        raise Refusal(f"{type(out).__name__} {reprlib.repr(out)}, which is not JSON ({e})")

accepted_cache = {}

def accepted(obj, name, method):
    """The keyword names method accepts (None: any, it takes **kwargs), per class."""
    cache_key = (type(obj), name)
    if cache_key not in accepted_cache:
        try:
            params = inspect.signature(method).parameters.values()
        except (TypeError, ValueError):  # no signature (a builtin): pass nothing optional
            params = []
        if any(p.kind == p.VAR_KEYWORD for p in params):
            accepted_cache[cache_key] = None
        else:
            accepted_cache[cache_key] = {p.name for p in params
                                         if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return accepted_cache[cache_key]

def run(factory, objects, req):
    op, key = req["op"], req["key"]
    if op == "create":
        objects[key] = factory(**req.get("kwargs", {}))
        return None
    if op == "call":
        obj = objects[key]
        method = getattr(obj, req["method"])
        kwargs = {}
        optional = req.get("optional_kwargs")
        if optional:
            names = accepted(obj, req["method"], method)
            kwargs = {k: v for k, v in optional.items() if names is None or k in names}
        return method(*req.get("args", []), **kwargs)
    obj = objects.pop(key, None)
    close = getattr(obj, "close", None)
    if callable(close):
        close()
    return None

def main():
    global busy
    try:
        factory = load()
    except Refusal as r:
        return send(ok=False, error=r.args[0], traceback=r.args[1] if len(r.args) > 1 else "")
    send(ok=True, ready=True)
    objects = {}
    for line in requests:
        req = json.loads(line)
        try:
            busy = True
            out = run(factory, objects, req)
            busy = False
        except BaseException as e:
            busy = False
            kind = "interrupted" if isinstance(e, KeyboardInterrupt) else "raised"
            send(ok=False, kind=kind, error=f"{type(e).__name__}: {e}",
                 traceback=user_traceback(e))
            continue
        try:
            send(ok=True, result=as_json(out))
        except Refusal as r:
            send(ok=False, kind="returned", error=r.args[0])

try:
    main()
except (BrokenPipeError, ConnectionResetError):  # the pool stopped listening: nothing to tell
    os._exit(0)
)PY";

}  // namespace

PythonObjectPool::PythonObjectPool(PythonPoolConfig config, std::string file, std::string factory)
    : config_(std::move(config)), name_(file + ":" + factory) {
  if (!(config_.start_timeout_s > 0)) {
    throw InputError(name_ + ": pyhost start timeout must be > 0 s, got " +
                     std::to_string(config_.start_timeout_s));
  }
  workers_ = start_workers(config_, name_, kObjectRunner, file, factory);
  outbox_.assign(workers_.size(), std::string());

  std::vector<bool> ready(workers_.size(), false);
  size_t waiting = workers_.size();
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(config_.start_timeout_s));
  while (waiting > 0) {
    const double left = std::chrono::duration<double>(deadline - Clock::now()).count();
    if (left <= 0) {
      char limit[32];
      std::snprintf(limit, sizeof limit, "%g", config_.start_timeout_s);
      fail_and_stop(name_ + ": Python workers did not get ready within " + limit +
                    " s; every worker was killed");
    }
    for (auto& [worker, hello] :
         receive(left, [](size_t) { return std::string("while starting"); })) {
      check_ready(hello, name_);
      if (!ready[worker]) --waiting;
      ready[worker] = true;
    }
  }
}

PythonObjectPool::~PythonObjectPool() {
  stop_workers(workers_, 1.0);
}

std::vector<pid_t> PythonObjectPool::worker_pids() const {
  return live_pids(workers_);
}

void PythonObjectPool::fail_and_stop(const std::string& message, bool died) {
  stopped_because_ = message;
  stop_workers(workers_, 0);
  if (died) throw WorkerDied(message);
  throw RuntimeError(message);
}

void PythonObjectPool::send(size_t worker, const json& request) {
  if (!stopped_because_.empty()) {
    throw RuntimeError(name_ + ": the pool was stopped by an earlier failure: " + stopped_because_);
  }
  outbox_.at(worker) += request.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
}

void PythonObjectPool::interrupt(size_t worker) {
  const pid_t pid = workers_.at(worker)->pid();
  if (pid > 0 && ::kill(pid, SIGINT) != 0 && errno != ESRCH) throw_errno("kill SIGINT");
}

std::vector<std::pair<size_t, json>> PythonObjectPool::receive(
    double wait_s, const std::function<std::string(size_t)>& doing) {
  if (!stopped_because_.empty()) {
    throw RuntimeError(name_ + ": the pool was stopped by an earlier failure: " + stopped_because_);
  }
  const std::string log_hint =
      config_.log_path.empty() ? "" : " (its stderr is in " + config_.log_path + ")";
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(std::max(0.0, wait_s)));
  std::vector<std::pair<size_t, json>> out;
  auto died = [&](size_t i) {
    const pid_t pid = workers_[i]->pid();
    const int status = workers_[i]->stop(Clock::now() + std::chrono::seconds(1));
    fail_and_stop(name_ + ": Python worker pid " + std::to_string(pid) + " " +
                      describe_exit(status) + " " + doing(i) + log_hint +
                      "; every worker was killed",
                  /*died=*/true);
  };
  auto take_lines = [&](size_t i) {
    std::string& inbox = workers_[i]->inbox();
    for (size_t eol; (eol = inbox.find('\n')) != std::string::npos;) {
      const std::string line = inbox.substr(0, eol);
      inbox.erase(0, eol + 1);
      json reply = json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (!reply.is_object()) {
        fail_and_stop(name_ + ": Python worker sent a line that is not a JSON object " + doing(i) +
                      ": " + preview(line));
      }
      out.emplace_back(i, std::move(reply));
    }
  };
  std::vector<pollfd> fds(workers_.size());
  while (true) {
    for (size_t i = 0; i < workers_.size(); ++i) {
      const short write = outbox_[i].empty() ? 0 : POLLOUT;
      fds[i] = pollfd{workers_[i]->channel(), static_cast<short>(POLLIN | write), 0};
    }
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
    const int timeout_ms = out.empty() ? static_cast<int>(std::max<int64_t>(0, left.count())) : 0;
    const int ready = ::poll(fds.data(), fds.size(), timeout_ms);
    if (ready < 0) {
      if (errno == EINTR) continue;
      throw_errno("poll");
    }
    if (ready == 0) break;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents & POLLOUT) {
        const ssize_t w = ::send(fds[i].fd, outbox_[i].data(), outbox_[i].size(), MSG_NOSIGNAL);
        if (w >= 0) {
          outbox_[i].erase(0, static_cast<size_t>(w));
        } else if (errno == EPIPE || errno == ECONNRESET) {
          died(i);
        } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
          throw_errno("send to Python worker");
        }
      }
      if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buffer[1 << 16];
      const ssize_t r = ::recv(fds[i].fd, buffer, sizeof buffer, 0);
      if (r == 0 || (r < 0 && errno == ECONNRESET)) {
        // Its last words first (a refusal to start, then exit): the death shows next time.
        for (const auto& reply : out)
          if (reply.first == i) return out;
        died(i);
      }
      if (r < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
        throw_errno("recv from Python worker");
      }
      workers_[i]->inbox().append(buffer, static_cast<size_t>(r));
      take_lines(i);
    }
  }
  return out;
}

}  // namespace rlhf::pyhost
