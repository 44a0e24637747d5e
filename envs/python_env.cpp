// PythonEnvironment: per-process request queues over pyhost's object pool (one call in flight
// per process, so each call's env.timeout_s counts from when its process starts it), the
// trajectories' deadlines, and the reading of step() results.
#include "envs/python_env.h"

#include <algorithm>
#include <cstdio>

#include "core/errors.h"
#include "core/python_ref.h"
#include "core/text.h"
#include "pyhost/python_objects.h"

namespace rlhf::envs {
namespace {

using nlohmann::json;

std::string seconds(double s) {
  char text[32];
  std::snprintf(text, sizeof text, "%g s", s);
  return text;
}

std::string last_lines(const std::string& text, size_t n) {
  std::vector<std::string> lines = split(text, '\n');
  while (!lines.empty() && lines.back().empty()) lines.pop_back();
  if (lines.size() > n) lines.erase(lines.begin(), lines.end() - static_cast<ptrdiff_t>(n));
  return join(lines, "\n");
}

}  // namespace

PythonEnvironment::PythonEnvironment(const EnvironmentConfig& config)
    : name_(config.python),
      timeout_s_(config.timeout_s),
      grace_s_(std::min(config.timeout_s, 5.0)),
      options_(config.options),
      tool_format_(ToolCallFormat::kAuto) {
  const auto ref = parse_python_ref(config.python);
  if (!ref)
    throw InputError("env.python: expected \"FILE.py:FACTORY\", found \"" + config.python + "\"");
  if (!(timeout_s_ > 0)) throw InputError("env.timeout_s: expected a number > 0");
  if (!options_.is_object()) throw InputError("env.options: expected an object");
  tool_format_ = parse_tool_call_format(options_.value("tool_format", std::string("auto")));
  pyhost::PythonPoolConfig pc;
  pc.interpreter = config.python_interpreter;
  pc.workers = config.python_workers;
  try {
    pool_ = std::make_unique<pyhost::PythonObjectPool>(pc, ref->file, ref->name);
  } catch (const InputError& e) {
    throw InputError(std::string("env.python: ") + e.what());
  }
  workers_.resize(pool_->size());
}

PythonEnvironment::~PythonEnvironment() = default;

std::vector<pid_t> PythonEnvironment::worker_pids() const {
  return pool_->worker_pids();
}

void PythonEnvironment::fail(const std::string& message) {
  failed_ = message;
  pool_->fail_and_stop(message);
}

void PythonEnvironment::check_usable() const {
  if (!failed_.empty()) {
    throw RuntimeError(name_ + ": the environment was stopped by an earlier failure: " + failed_);
  }
}

void PythonEnvironment::enqueue(size_t worker, int64_t id, uint64_t serial, const std::string& what,
                                json message) {
  message["key"] = id;
  workers_[worker].queue.push_back(Request{id, serial, what, std::move(message)});
}

PythonEnvironment::Trajectory* PythonEnvironment::trajectory_of(const Request& request) {
  auto it = trajectories_.find(request.id);
  return it == trajectories_.end() || it->second.serial != request.serial ? nullptr : &it->second;
}

void PythonEnvironment::reset(int64_t id, const json& row) {
  check_usable();
  if (trajectories_.count(id)) close(id);
  size_t worker = 0;  // the process holding the fewest trajectories
  for (size_t w = 1; w < workers_.size(); ++w) {
    if (workers_[w].trajectories < workers_[worker].trajectories) worker = w;
  }
  ++workers_[worker].trajectories;
  const uint64_t serial = next_serial_++;
  trajectories_[id] = Trajectory{worker, serial, false, false, true};
  enqueue(worker, id, serial, "create", {{"op", "create"}, {"kwargs", options_}});
  enqueue(worker, id, serial, "reset",
          {{"op", "call"}, {"method", "reset"}, {"args", json::array({row})}});
  pump();
}

void PythonEnvironment::step(int64_t id, const std::string& action) {
  check_usable();
  auto it = trajectories_.find(id);
  if (it == trajectories_.end()) {
    throw RuntimeError(name_ + ": step for trajectory " + std::to_string(id) +
                       ", which was not reset or is closed");
  }
  if (it->second.timed_out) {  // an earlier call of it timed out: its object is not trusted
    Observation obs;
    obs.done = obs.timed_out = true;
    ready_.emplace_back(id, obs);
    return;
  }
  it->second.step_pending = true;
  // tool_calls only for a step(self, action, tool_calls=None) (the runner reads its signature).
  const json args = json::array({json(action)});
  const json calls = {{"tool_calls", tool_calls_json(parse_tool_calls(action, tool_format_))}};
  enqueue(it->second.worker, id, it->second.serial, "step",
          {{"op", "call"}, {"method", "step"}, {"args", args}, {"optional_kwargs", calls}});
  pump();
}

void PythonEnvironment::close(int64_t id) {
  auto it = trajectories_.find(id);
  if (!failed_.empty() || it == trajectories_.end()) return;
  const size_t worker = it->second.worker;
  const uint64_t serial = it->second.serial;
  --workers_[worker].trajectories;
  trajectories_.erase(it);  // a step still in flight is answered into the void
  resets_ready_.erase(std::remove_if(resets_ready_.begin(), resets_ready_.end(),
                                     [id](const auto& r) { return r.first == id; }),
                      resets_ready_.end());
  enqueue(worker, id, serial, "close", {{"op", "drop"}});
  pump();
}

void PythonEnvironment::pump() {
  for (size_t w = 0; w < workers_.size(); ++w) {
    Worker& worker = workers_[w];
    if (worker.current) continue;  // one call in flight per process
    while (!worker.current && !worker.queue.empty()) {
      Request next = std::move(worker.queue.front());
      worker.queue.pop_front();
      // A closed or timed-out trajectory's calls are dropped, but its object is always freed.
      const Trajectory* t = trajectory_of(next);
      if (next.what == "close" || (t && !t->timed_out)) worker.current = std::move(next);
    }
    if (!worker.current) continue;
    worker.deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                         std::chrono::duration<double>(timeout_s_));
    pool_->send(w, worker.current->message);
  }
}

bool PythonEnvironment::waiting_for_step() const {
  return std::any_of(trajectories_.begin(), trajectories_.end(),
                     [](const auto& t) { return t.second.step_pending; });
}

bool PythonEnvironment::waiting_for_reset() const {
  return std::any_of(trajectories_.begin(), trajectories_.end(),
                     [](const auto& t) { return t.second.reset_pending; });
}

template <typename Done>
void PythonEnvironment::receive_until(double wait_s, Done done) {
  const auto end = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                      std::chrono::duration<double>(std::max(0.0, wait_s)));
  check_usable();
  receive(0);
  while (!done()) {
    auto until = end;
    for (const Worker& w : workers_) {
      if (w.current) until = std::min(until, w.deadline);
    }
    const double wait = std::chrono::duration<double>(until - Clock::now()).count();
    receive(std::max(0.0, wait));
    if (Clock::now() >= end) break;
  }
}

std::vector<std::pair<int64_t, Observation>> PythonEnvironment::poll(double wait_s) {
  receive_until(wait_s, [this] { return !ready_.empty() || !waiting_for_step(); });
  return std::exchange(ready_, {});
}

std::vector<std::pair<int64_t, std::string>> PythonEnvironment::poll_resets(double wait_s) {
  receive_until(wait_s, [this] { return !resets_ready_.empty() || !waiting_for_reset(); });
  return std::exchange(resets_ready_, {});
}

void PythonEnvironment::receive(double wait_s) {
  auto doing = [this](size_t w) {
    const Worker& worker = workers_[w];
    return worker.current ? "while running " + worker.current->what + " of trajectory " +
                                std::to_string(worker.current->id)
                          : std::string("while idle");
  };
  std::vector<std::pair<size_t, json>> replies;
  try {
    replies = pool_->receive(wait_s, doing);
  } catch (const RuntimeError& e) {  // a process died: the pool is stopped
    failed_ = e.what();
    throw;
  }
  for (const auto& [worker, reply] : replies) handle(worker, reply);
  check_deadlines();
  pump();
}

void PythonEnvironment::check_deadlines() {
  const auto now = Clock::now();
  for (size_t w = 0; w < workers_.size(); ++w) {
    Worker& worker = workers_[w];
    if (!worker.current || now < worker.deadline) continue;
    const Request& request = *worker.current;
    const std::string what = request.what + " of trajectory " + std::to_string(request.id);
    if (worker.interrupted) {
      const auto pids = pool_->worker_pids();
      fail(name_ + ": " + what + " did not return within env.timeout_s = " + seconds(timeout_s_) +
           " and its Python process" +
           (w < pids.size() ? " pid " + std::to_string(pids[w]) : std::string()) +
           " did not come back within " + seconds(grace_s_) +
           " of SIGINT; every process was killed and the environment is stopped");
    }
    worker.interrupted = true;
    worker.deadline =
        now + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(grace_s_));
    pool_->interrupt(w);
    Trajectory* t = trajectory_of(request);
    if (!t) continue;
    t->timed_out = true;
    if (t->reset_pending) {  // a timed-out create or reset: no observation
      t->reset_pending = false;
      resets_ready_.emplace_back(request.id, std::string());
    }
    if (t->step_pending) {
      t->step_pending = false;
      Observation obs;
      obs.done = obs.timed_out = true;
      ready_.emplace_back(request.id, obs);
    }
  }
}

void PythonEnvironment::handle(size_t w, const json& reply) {
  Worker& worker = workers_[w];
  if (!worker.current) fail(name_ + ": a Python process answered a request it was not sent");
  const Request request = std::move(*worker.current);
  worker.current.reset();
  if (std::exchange(worker.interrupted, false)) return;  // the timed-out call's late answer
  const std::string what = request.what + " of trajectory " + std::to_string(request.id);
  if (!reply.value("ok", false)) {
    const std::string kind = reply.value("kind", std::string("raised"));
    const std::string error = reply.value("error", std::string());
    std::string message =
        name_ + (kind == "returned" ? " returned " : " raised ") + error + " in " + what;
    const std::string traceback = last_lines(reply.value("traceback", std::string()), 12);
    if (!traceback.empty()) message += "\n" + traceback;
    fail(message);
  }
  const json& result = reply.contains("result") ? reply["result"] : json();
  if (request.what == "reset") {
    if (!result.is_null() && !result.is_string()) {
      fail(name_ + ": reset(row) returned " + result.dump() + " in " + what +
           ", expected a string or None");
    }
    Trajectory* t = trajectory_of(request);
    if (t && t->reset_pending) {
      t->reset_pending = false;
      resets_ready_.emplace_back(request.id, result.is_string() ? result.get<std::string>() : "");
    }
    return;
  }
  if (request.what != "step") return;
  Observation obs = read_step(request, result);
  Trajectory* t = trajectory_of(request);
  if (!t || !t->step_pending) return;  // closed meanwhile
  t->step_pending = false;
  ready_.emplace_back(request.id, std::move(obs));
}

Observation PythonEnvironment::read_step(const Request& request, const json& result) {
  const std::string expected =
      "expected (observation: str | None, reward: float, done: bool[, info: dict])";
  auto bad = [&](const std::string& why) {
    fail(name_ + ": step(action) of trajectory " + std::to_string(request.id) + " returned " +
         result.dump() + ": " + why + "; " + expected);
  };
  if (!result.is_array() || result.size() < 3 || result.size() > 4) bad("not a 3-tuple");
  Observation obs;
  const json& text = result[0];
  if (text.is_string()) {
    obs.text = text.get<std::string>();
  } else if (!text.is_null()) {
    bad("the observation is not a string");
  }
  if (!result[1].is_number()) bad("the reward is not a number");
  obs.reward = result[1].get<double>();
  if (!result[2].is_boolean() && !result[2].is_number_integer()) bad("done is not a bool");
  obs.done = result[2].is_boolean() ? result[2].get<bool>() : result[2].get<int64_t>() != 0;
  if (result.size() == 4) {
    const json& info = result[3];
    if (!info.is_object()) bad("info is not a dict");
    obs.role = info.value("role", std::string("tool"));
    if (obs.role != "tool" && obs.role != "user") bad("info[\"role\"] is not \"tool\" or \"user\"");
    obs.tool_calls = info.value("tool_calls", 0);
    obs.tool_errors = info.value("tool_errors", 0);
  }
  return obs;
}

}  // namespace rlhf::envs
