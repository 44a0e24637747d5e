// PythonFunctionPool: the embedded runner script and one poll()
// loop that feeds every worker its chunk and reads the replies before the deadline. No threads:
// the workers run concurrently as processes; this side only moves bytes.
#include "pyhost/python_pool.h"

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <iostream>
#include <optional>
#include <utility>

#include "core/errors.h"
#include "core/text.h"
#include "pyhost/python_process.h"

namespace rlhf::pyhost {
namespace {

using nlohmann::json;

// Runs inside each worker after python_runner's prelude, as `python -u -c RUNNER FILE FUNCTION`.
// Replies, one JSON line each:
// {"ok":true,"ready":true} once the function is loaded (or {"ok":false,"error","traceback"},
// then exit), then per request {"ok":true,"rewards":[float|null]} or
// {"ok":false,"kind":"raised"|"returned","error":...,"traceback":...}.
constexpr const char* kRunner = R"PY(
import inspect, math, numbers

def load():
    fn = load_attribute("function")
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

}  // namespace

PythonFunctionPool::PythonFunctionPool(PythonPoolConfig config, std::string file,
                                       std::string function)
    : config_(std::move(config)),
      file_(std::move(file)),
      function_(std::move(function)),
      name_(file_ + ":" + function_) {
  if (!(config_.timeout_s > 0) || !(config_.start_timeout_s > 0)) {
    throw InputError(name_ + ": pyhost timeouts must be > 0 s, got " +
                     std::to_string(config_.timeout_s) + " and " +
                     std::to_string(config_.start_timeout_s));
  }
  start();
}

void PythonFunctionPool::start() {
  workers_ = start_workers(config_, name_, kRunner, file_, function_);
  const auto hellos = exchange(std::vector<std::string>(workers_.size()), config_.start_timeout_s,
                               [](size_t) { return std::string("while starting"); });
  for (const auto& hello : hellos) check_ready(hello, name_);
}

std::vector<double> PythonFunctionPool::call(const std::vector<std::string>& prompts,
                                             const std::vector<std::string>& completions,
                                             const std::vector<std::string>& labels,
                                             const std::vector<json>& extra) {
  while (true) {
    try {
      return call_once(prompts, completions, labels, extra);
    } catch (const WorkerDied& e) {
      if (restarts_ >= config_.max_restarts) throw;
      ++restarts_;
      std::cerr << "rlhf: fault: " << e.what() << "; starting the pool again and scoring the "
                << "batch again (restart " << restarts_ << " of " << config_.max_restarts << ")"
                << std::endl;
      stopped_because_.clear();
      start();
    }
  }
}

PythonFunctionPool::~PythonFunctionPool() {
  stop_workers(workers_, 1.0);
}

std::vector<pid_t> PythonFunctionPool::worker_pids() const {
  return live_pids(workers_);
}

void PythonFunctionPool::fail_and_stop(const std::string& message, bool died) {
  stopped_because_ = message;
  stop_workers(workers_, 0);
  if (died) throw WorkerDied(message);
  throw RuntimeError(message);
}

// What worker i sent on `fd`: its reply once a whole line arrived (a JSON object, or the pool
// stops naming what it was doing); `died` when the worker is gone.
std::optional<json> PythonFunctionPool::read_reply(
    size_t i, int fd, const std::function<void(size_t)>& died,
    const std::function<std::string(size_t)>& doing) {
  char buffer[1 << 16];
  const ssize_t r = ::recv(fd, buffer, sizeof buffer, 0);
  if (r == 0 || (r < 0 && errno == ECONNRESET)) died(i);
  if (r < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return std::nullopt;
    throw_errno("recv from Python worker");
  }
  std::string& inbox = workers_[i]->inbox();
  inbox.append(buffer, static_cast<size_t>(r));
  const size_t eol = inbox.find('\n');
  if (eol == std::string::npos) return std::nullopt;
  const std::string line = inbox.substr(0, eol);
  inbox.erase(0, eol + 1);
  json reply = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!reply.is_object()) {
    fail_and_stop(name_ + ": Python worker sent a line that is not a JSON object " + doing(i) +
                  ": " + preview(line));
  }
  return reply;
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
                      describe_exit(status) + " " + doing(i) + log_hint + "; the pool is stopped",
                  /*died=*/true);
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
      std::optional<json> reply = read_reply(i, fd, died, doing);
      if (!reply) continue;
      replies[i] = std::move(*reply);
      ++answered;
    }
  }
  std::vector<json> out;
  for (auto& r : replies) out.push_back(std::move(*r));
  return out;
}

namespace {

// The extra columns of a call, in first-seen order; each row an object, no reserved name.
std::vector<std::string> extra_columns(const std::string& name, const std::vector<json>& extra) {
  std::vector<std::string> columns;  // in first-seen order
  for (size_t r = 0; r < extra.size(); ++r) {
    if (!extra[r].is_object()) {
      throw InputError(name + ": extra columns of row " + std::to_string(r) +
                       " must be a JSON object, got " + extra[r].type_name());
    }
    for (const auto& [key, value] : extra[r].items()) {
      for (const char* reserved : kReserved) {
        if (key == reserved) {
          throw InputError(name + ": a column may not be named '" + key +
                           "' (the function already gets it)");
        }
      }
      if (std::find(columns.begin(), columns.end(), key) == columns.end()) columns.push_back(key);
    }
  }

  return columns;
}

// One worker's request: rows [b, e) as the function's arguments, one JSON line.
std::string chunk_request(const std::vector<std::string>& prompts,
                          const std::vector<std::string>& completions,
                          const std::vector<std::string>& labels, const std::vector<json>& extra,
                          const std::vector<std::string>& columns, size_t b, size_t e) {
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
  return request.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
}

}  // namespace

std::vector<double> PythonFunctionPool::call_once(const std::vector<std::string>& prompts,
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

  const std::vector<std::string> columns = extra_columns(name_, extra);

  // Contiguous chunks, the first rows % chunks of them one row longer.
  const size_t chunks = std::min(rows, static_cast<size_t>(workers_.size()));
  std::vector<size_t> begin(chunks + 1, 0);
  for (size_t c = 0; c < chunks; ++c) begin[c + 1] = begin[c] + rows / chunks + (c < rows % chunks);

  std::vector<std::string> requests(chunks);
  for (size_t c = 0; c < chunks; ++c)
    requests[c] =
        chunk_request(prompts, completions, labels, extra, columns, begin[c], begin[c + 1]);
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
