// Environments for multi-turn rollouts (issue 31): what answers the model between its turns.
// The rollout engine (rollout/) drives trajectories; an Environment only sees text: the
// model's turn as it wrote it (its end-of-turn token stripped) and, back, the observation to
// append as the next turn (the chat template's tool or user turn, rendered by the rollout).
//
// One Environment object serves every trajectory of a rollout request, by trajectory id, and
// may answer them out of order: step() returns at once and poll() hands back what is ready,
// so the engine keeps decoding other rows while one trajectory waits (continuous batching
// across waiting trajectories). Three kinds, as rewards: built-in ones (C++, for tests and
// examples), Python (`env.python: "env.py:make_env"`, a class with reset(row) and
// step(action) -> (observation, reward, done), hosted in pyhost/'s supervised processes) and
// HTTP (a documented JSON protocol, docs/agentic.md). Not thread-safe: one caller.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "core/json_fields.h"

namespace rlhf {
class JobSpec;
}

namespace rlhf::envs {

// The environment's answer to one model turn.
struct Observation {
  std::string text;           // the next turn's content ("" with done: nothing appended)
  std::string role = "tool";  // "tool" (a tool's result) or "user" (feedback, a game's move)
  double reward = 0;          // this turn's reward; a trajectory's rewards are summed
  bool done = false;          // the trajectory ends: nothing more is generated for it
  int tool_calls = 0;         // tool calls the model's turn made (parsed by the environment)
  int tool_errors = 0;        // of those, malformed or failed (the text says what, to the model)
  bool timed_out = false;     // env.timeout_s passed: the trajectory ends here (done is true)
};

class Environment {
 public:
  virtual ~Environment() = default;

  // Begins trajectory `id` for its dataset row (the prompt row's JSON: its label and other
  // columns). Ids are unique within a rollout request. Returns at once; poll_resets() hands
  // back its initial observation.
  virtual void reset(int64_t id, const nlohmann::json& row) = 0;
  // Initial observations: one (id, text) for every reset() once its call returned, in no
  // particular order; text is "" when the environment gave none (the built-ins never do; a
  // reset past env.timeout_s also gives "", and the trajectory's first step then times out).
  // Waits up to `wait_s` for one while a reset is unanswered; returns {} at once when none is.
  // Throws as poll().
  virtual std::vector<std::pair<int64_t, std::string>> poll_resets(double wait_s) = 0;
  // Hands the model's turn to the environment; returns at once. One step in flight per id.
  // Python and HTTP environments also hand on the turn's tool calls (envs/tool_calls.h, in
  // env.options.tool_format) as tool_calls_json() writes them.
  virtual void step(int64_t id, const std::string& action) = 0;
  // Observations that are ready, each with its trajectory id, in no particular order. Waits
  // up to `wait_s` for at least one when a step is in flight; returns {} at once when none is.
  // Throws RuntimeError naming the environment when it fails as a whole (a Python environment
  // that raises or dies, an HTTP environment that refuses connections); a single trajectory
  // past env.timeout_s comes back as an Observation with timed_out and done instead.
  virtual std::vector<std::pair<int64_t, Observation>> poll(double wait_s) = 0;
  // Trajectory `id` is over (done, or the engine stopped it: max_turns, the token budget).
  virtual void close(int64_t id) = 0;
  // "builtin:calculator", "env.py:make_env", "http://host:port/path": for messages.
  virtual const std::string& name() const = 0;
};

// Filled from the job spec's env.* keys.
struct EnvironmentConfig {
  std::string builtin;     // env.builtin: "calculator", "guess_number", or "" (not built-in)
  std::string python;      // env.python: "FILE:FACTORY" ("" when not Python)
  std::string url;         // env.url: an HTTP environment's endpoint ("" when not HTTP)
  double timeout_s = 30;   // env.timeout_s: one step's limit
  int python_workers = 2;  // env.python_workers
  std::string python_interpreter = "python3";         // env.python_interpreter
  nlohmann::json options = nlohmann::json::object();  // env.options: passed to the environment

  // Whether the job has an environment (multi-turn rollouts): one of builtin, python, url set.
  bool enabled() const { return !builtin.empty() || !python.empty() || !url.empty(); }
  // The env.* keys of a validated job spec.
  static EnvironmentConfig from_spec(const JobSpec& spec);
};
// How it travels to a rollout worker (load_model's "env"): every field, strictly.
RLHF_WIRE_STRUCT(EnvironmentConfig, "env", builtin, python, url, timeout_s, python_workers,
                 python_interpreter, options)

// The environment the config names (exactly one of builtin, python, url). Throws InputError
// naming the key when none or several are set, the built-in is unknown, or the Python file
// does not load.
std::unique_ptr<Environment> make_environment(const EnvironmentConfig& config);

}  // namespace rlhf::envs
