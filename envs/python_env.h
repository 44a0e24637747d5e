// Python environments (env.python: "FILE.py:FACTORY"): FACTORY(**env.options) makes one object
// per trajectory with reset(row) -> str | None (its initial observation) and step(action) ->
// (observation, reward, done); a step(action, tool_calls=None) also gets the turn's parsed
// tool calls as a keyword (tool_calls_json, in env.options.tool_format).
// The objects live in pyhost's supervised processes (PythonObjectPool), env.python_workers of
// them; a trajectory is pinned at reset to the process with the fewest, which holds its object
// until close(). A process runs one call at a time; the calls of different processes run
// concurrently.
//
// Failures (docs/agentic.md):
// - a call that raises (the factory, reset, step or close), or a step that returns something
//   else than the tuple: RuntimeError "FILE:FACTORY raised ..." with the traceback's last
//   lines; every process is killed and later calls throw.
// - a call running past env.timeout_s: its trajectory ends with an Observation timed_out (and
//   done); its process gets SIGINT, which raises KeyboardInterrupt in the call. If the process
//   does not answer within the grace (min(env.timeout_s, 5 s)) after that, the environment
//   fails as a whole: RuntimeError naming FILE:FACTORY, the trajectory and the process.
// - a process that dies: RuntimeError naming it and its exit status.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "envs/environment.h"
#include "envs/tool_calls.h"

namespace rlhf::pyhost {
class PythonObjectPool;
}

namespace rlhf::envs {

class PythonEnvironment : public Environment {
 public:
  // Starts the processes and loads FILE (InputError naming env.python and FILE:FACTORY when it
  // does not load).
  explicit PythonEnvironment(const EnvironmentConfig& config);
  ~PythonEnvironment() override;

  void reset(int64_t id, const nlohmann::json& row) override;
  std::vector<std::pair<int64_t, std::string>> poll_resets(double wait_s) override;
  void step(int64_t id, const std::string& action) override;
  std::vector<std::pair<int64_t, Observation>> poll(double wait_s) override;
  void close(int64_t id) override;
  const std::string& name() const override { return name_; }

  std::vector<pid_t> worker_pids() const;  // live processes (for supervision and tests)

 private:
  using Clock = std::chrono::steady_clock;
  struct Request {
    int64_t id = 0;
    uint64_t serial = 0;  // which reset of `id` it belongs to (ids may be reset again)
    std::string what;     // "create", "reset", "step", "close"
    nlohmann::json message;
  };
  struct Worker {
    std::deque<Request> queue;
    std::optional<Request> current;  // sent, not yet answered
    Clock::time_point deadline;      // current's env.timeout_s, or the grace when interrupted
    bool interrupted = false;        // current timed out; its answer is dropped
    int trajectories = 0;
  };
  struct Trajectory {
    size_t worker = 0;
    uint64_t serial = 0;
    bool step_pending = false;
    bool timed_out = false;     // a call ran past env.timeout_s: every later step times out
    bool reset_pending = true;  // its reset's observation is not in resets_ready_ yet
  };

  void enqueue(size_t worker, int64_t id, uint64_t serial, const std::string& what,
               nlohmann::json message);
  // The trajectory `request` belongs to, or nullptr when it was closed or reset since.
  Trajectory* trajectory_of(const Request& request);
  void pump();
  void receive(double wait_s);
  void handle(size_t worker, const nlohmann::json& reply);
  void check_deadlines();
  bool waiting_for_step() const;
  bool waiting_for_reset() const;
  // Receives replies until `done()` or `wait_s` passed, waking for the calls' deadlines.
  template <typename Done>
  void receive_until(double wait_s, Done done);
  Observation read_step(const Request& request, const nlohmann::json& result);
  [[noreturn]] void fail(const std::string& message);
  void check_usable() const;

  std::string name_;
  double timeout_s_;
  double grace_s_;
  nlohmann::json options_;
  std::unique_ptr<pyhost::PythonObjectPool> pool_;
  std::vector<Worker> workers_;
  std::map<int64_t, Trajectory> trajectories_;
  uint64_t next_serial_ = 1;
  std::vector<std::pair<int64_t, Observation>> ready_;
  std::vector<std::pair<int64_t, std::string>> resets_ready_;
  ToolCallFormat tool_format_;  // env.options.tool_format, for step's tool_calls
  std::string failed_;          // set by fail(): later calls throw it
};

}  // namespace rlhf::envs
