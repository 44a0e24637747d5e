// HTTP environments (env.url): the JSON protocol of docs/agentic.md, each call a POST on its
// own connection, several in flight at once (one per trajectory) on a Boost.Asio thread:
//   POST {url}/reset {"id", "row", "options"} -> {"observation"?: str | null} (the initial
//                                        observation; an empty or non-object reply: none)
//   POST {url}/step  {"id", "action", "tool_calls"} -> {"observation": str | null,
//                                        "role"?: "tool" | "user",
//                                        "reward"?: number (0), "done": bool,
//                                        "tool_calls"?: int, "tool_errors"?: int}
//   POST {url}/close {"id"} -> anything (the body is ignored)
// A trajectory's calls are sent in order, one at a time; different trajectories' calls
// overlap (at most 64 connections at once, the rest wait their turn, FIFO) and may be answered
// in any order; env.timeout_s counts from when a call's connection starts. Failures: a call past
// env.timeout_s (connect, send and receive together) ends its trajectory with an Observation
// timed_out; a refused connection, an HTTP status other than 200 or a reply that is not the JSON
// above throws RuntimeError naming the URL, the call and the trajectory from poll(), and the
// environment refuses later calls.
#pragma once

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "envs/environment.h"
#include "envs/tool_calls.h"

namespace rlhf::envs {

class HttpEnvironment : public Environment {
 public:
  // Throws InputError naming env.url when it is not http://host[:port][/path].
  explicit HttpEnvironment(const EnvironmentConfig& config);
  ~HttpEnvironment() override;  // stops the I/O thread; calls in flight are abandoned

  void reset(int64_t id, const nlohmann::json& row) override;
  std::vector<std::pair<int64_t, std::string>> poll_resets(double wait_s) override;
  void step(int64_t id, const std::string& action) override;
  std::vector<std::pair<int64_t, Observation>> poll(double wait_s) override;
  void close(int64_t id) override;
  const std::string& name() const override { return url_; }

 private:
  struct Call {
    int64_t id = 0;
    uint64_t serial = 0;  // which reset of `id` it belongs to (ids may be reset again)
    std::string what;     // "reset", "step", "close"
    std::string body;     // JSON
  };
  struct Outcome {  // written by the I/O thread
    Call call;
    bool timed_out = false;
    std::string error;  // "connect: Connection refused"
    int status = 0;
    std::string body;
  };
  struct Lane {  // one trajectory's calls: one in flight, the rest waiting
    bool busy = false;
    std::deque<Call> waiting;
  };
  struct Trajectory {
    uint64_t serial = 0;
    bool step_pending = false;
    bool timed_out = false;
    bool reset_pending = true;  // its reset's observation is not in resets_ready_ yet
  };
  class Io;

  void enqueue(Call call);
  void start(Call call);   // now, or when one of the kMaxConnections is free
  void launch(Call call);  // hands it to the I/O thread
  // The trajectory `call` belongs to, or nullptr when it was closed or reset since.
  Trajectory* trajectory_of(const Call& call);
  void settle(Outcome outcome);
  Observation read_step(const Outcome& outcome);
  std::string read_reset(const Outcome& outcome);
  // Settles arrived calls until `done()` or `wait_s` passed.
  template <typename Done>
  void settle_until(double wait_s, Done done);
  [[noreturn]] void fail(const std::string& message);
  void check_usable() const;

  std::string url_, host_, port_, base_path_;
  double timeout_s_;
  nlohmann::json options_;
  static constexpr size_t kMaxConnections = 64;  // calls in flight at once, the rest wait
  std::map<int64_t, Lane> lanes_;
  size_t in_flight_ = 0;
  std::deque<Call> backlog_;  // started, waiting for a connection
  std::map<int64_t, Trajectory> trajectories_;
  uint64_t next_serial_ = 1;
  std::vector<std::pair<int64_t, Observation>> ready_;
  std::vector<std::pair<int64_t, std::string>> resets_ready_;
  ToolCallFormat tool_format_;  // env.options.tool_format, for step's tool_calls
  std::string failed_;

  std::mutex mutex_;  // guards outcomes_
  std::condition_variable arrived_;
  std::deque<Outcome> outcomes_;
  std::unique_ptr<Io> io_;  // last: destroyed first, so its thread stops before the rest
};

}  // namespace rlhf::envs
