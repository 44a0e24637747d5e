// Python environments against real interpreters (the venv's, RLHF_PYTHON): concurrency over
// several processes with each trajectory pinned to one, and the failures the job must name:
// a raising environment, a hung one that comes back after its timeout, one that does not, and
// one that does not load. Each test checks by pid (/proc) that no process is left.
#include "envs/python_env.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "core/errors.h"
#include "test_paths.h"
#include "tests/envs/process_checks.h"

namespace rlhf::envs {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::children_of_this_process;
using testing::message_of;
using testing::pid_alive;

constexpr const char* kEnvPy = R"PY(
import os, time

class Env:
    def __init__(self, delay=0.0):
        self.delay, self.turns, self.label = delay, 0, None

    def reset(self, row):
        self.label = row.get("label")
        if self.label == "hang_reset":
            time.sleep(3600)
        return None

    def step(self, action):
        self.turns += 1
        start = time.time()
        if action == "raise":
            raise ValueError("boom from " + str(self.label))
        if action == "bad_shape":
            return "oops"
        if action == "not_json":
            return object(), 0.0, False
        if action == "exit":
            os._exit(3)
        if action == "hang":
            time.sleep(3600)
        if action == "hang_hard":
            while True:
                try:
                    time.sleep(3600)
                except KeyboardInterrupt:
                    pass
        time.sleep(self.delay)
        text = (f"pid={os.getpid()} label={self.label} turn={self.turns} action={action} "
                f"start={start:.6f} end={time.time():.6f}")
        return text, 0.25 * self.turns, self.turns >= 2, {"role": "user"}

def make_env(**options):
    return Env(**options)
)PY";

// Initial observations and parsed tool calls: "new" returns reset's observation and echoes
// the tool_calls keyword it receives; "old" has the older step(self, action); "kw" takes
// **extra and echoes its keywords' names.
constexpr const char* kToolsPy = R"PY(
import json

class New:
    def reset(self, row):
        return f"The secret is {row['secret']}." if "secret" in row else None
    def step(self, action, tool_calls=None):
        return json.dumps(tool_calls), 1.0 if "The secret is 7." in action else 0.0, False

class Old:
    def reset(self, row):
        return ""
    def step(self, action):
        return "old: " + action, 0.0, False

class Kw:
    def reset(self, row):
        return None
    def step(self, action, **extra):
        return json.dumps(sorted(extra)), 0.0, False

def make_env(kind="new", tool_format="auto"):
    return {"new": New, "old": Old, "kw": Kw}[kind]()
)PY";

class PythonEnvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("rlhf-envs-" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + "-" +
            std::to_string(::getpid()));
    fs::create_directories(dir_);
    std::ofstream(dir_ / "env.py") << kEnvPy;
    std::ofstream(dir_ / "tools.py") << kToolsPy;
    children_before_ = children_of_this_process();
  }
  void TearDown() override {
    EXPECT_EQ(children_of_this_process(), children_before_) << "a Python process was left";
    fs::remove_all(dir_);
  }
  EnvironmentConfig config(int workers, double timeout_s = 30) const {
    EnvironmentConfig c;
    c.python = (dir_ / "env.py").string() + ":make_env";
    c.python_workers = workers;
    c.python_interpreter = RLHF_PYTHON;
    c.timeout_s = timeout_s;
    return c;
  }
  // Polls until `n` observations came back (or 60 s passed).
  static std::map<int64_t, Observation> collect(Environment& env, size_t n) {
    std::map<int64_t, Observation> got;
    for (int i = 0; i < 600 && got.size() < n; ++i) {
      for (auto& [id, obs] : env.poll(0.1)) {
        EXPECT_FALSE(got.count(id)) << "trajectory " << id << " answered twice";
        got[id] = obs;
      }
    }
    EXPECT_EQ(got.size(), n);
    return got;
  }
  static std::string field(const std::string& text, const std::string& key) {
    const size_t at = text.find(key + "=");
    if (at == std::string::npos) return "";
    const size_t begin = at + key.size() + 1;
    return text.substr(begin, text.find(' ', begin) - begin);
  }

  fs::path dir_;
  std::set<pid_t> children_before_;
};

// Each reset's observation comes back once from poll_resets ("" for None and ""), and a step
// that takes tool_calls receives the turn's calls parsed in env.options.tool_format: the
// well-formed ones with name and arguments, then an {"error"} per malformed one; [] for none.
// An old step(self, action) is called as before; a step(**extra) gets the keyword.
TEST_F(PythonEnvTest, ResetObservationsAndParsedToolCalls) {
  EnvironmentConfig c = config(2);
  c.python = (dir_ / "tools.py").string() + ":make_env";
  c.options = {{"kind", "new"}, {"tool_format", "hermes"}};
  PythonEnvironment env(c);
  env.reset(0, {{"secret", 7}});
  env.reset(1, json::object());
  std::map<int64_t, std::string> resets;
  for (int i = 0; i < 600 && resets.size() < 2; ++i)
    for (auto& [id, text] : env.poll_resets(0.1)) {
      EXPECT_FALSE(resets.count(id)) << "reset " << id << " answered twice";
      resets[id] = text;
    }
  EXPECT_EQ(resets, (std::map<int64_t, std::string>{{0, "The secret is 7."}, {1, ""}}));
  EXPECT_TRUE(env.poll_resets(1).empty());  // none in flight: returns at once
  env.step(0, R"(<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>)"
              R"(<tool_call>{"name": }</tool_call>)");
  env.step(1, "The secret is 7.");
  auto got = collect(env, 2);
  const json calls = json::parse(got[0].text);
  ASSERT_EQ(calls.size(), 2u) << got[0].text;
  EXPECT_EQ(calls[0]["name"], "calculator");
  EXPECT_EQ(calls[0]["arguments"], json({{"expression", "2+3"}}));
  EXPECT_EQ(calls[1]["error"].get<std::string>().rfind("error: tool call 2 is not valid JSON", 0),
            0u)
      << got[0].text;
  EXPECT_EQ(got[0].reward, 0.0);
  EXPECT_EQ(json::parse(got[1].text), json::array());  // no call in the turn
  EXPECT_EQ(got[1].reward, 1.0);                       // the turn repeats the observation
  env.close(0);
  env.close(1);

  c.options = {{"kind", "old"}};
  PythonEnvironment old_env(c);
  old_env.reset(0, json::object());
  old_env.step(0, R"(<tool_call>{"name": "x", "arguments": {}}</tool_call>)");
  EXPECT_EQ(collect(old_env, 1)[0].text,
            R"(old: <tool_call>{"name": "x", "arguments": {}}</tool_call>)");
  const auto old_resets = old_env.poll_resets(0);
  ASSERT_EQ(old_resets.size(), 1u);
  EXPECT_EQ(old_resets[0], std::make_pair(int64_t{0}, std::string()));
  old_env.close(0);

  c.options = {{"kind", "kw"}};
  PythonEnvironment kw_env(c);
  kw_env.reset(0, json::object());
  kw_env.step(0, "no call");
  EXPECT_EQ(collect(kw_env, 1)[0].text, R"(["tool_calls"])");
  kw_env.close(0);
}

TEST_F(PythonEnvTest, EightTrajectoriesConcurrentlyEachPinnedToOneProcess) {
  EnvironmentConfig c = config(4);
  c.options = {{"delay", 0.3}};
  std::set<pid_t> pids;
  {
    PythonEnvironment env(c);
    EXPECT_EQ(env.name(), c.python);
    const auto started = env.worker_pids();
    ASSERT_EQ(started.size(), 4u);
    pids.insert(started.begin(), started.end());
    for (int64_t id = 0; id < 8; ++id) env.reset(id, {{"label", "L" + std::to_string(id)}});
    for (int64_t id = 0; id < 8; ++id) env.step(id, "go");
    auto first = collect(env, 8);
    std::map<int64_t, std::string> pid_of;
    std::map<std::string, int> per_pid;
    std::vector<std::pair<double, double>> spans;
    for (auto& [id, obs] : first) {
      EXPECT_EQ(field(obs.text, "label"), "L" + std::to_string(id)) << obs.text;
      EXPECT_EQ(field(obs.text, "turn"), "1");
      EXPECT_EQ(obs.reward, 0.25);
      EXPECT_FALSE(obs.done);
      EXPECT_EQ(obs.role, "user");
      pid_of[id] = field(obs.text, "pid");
      ++per_pid[pid_of[id]];
      EXPECT_TRUE(pids.count(std::stoi(pid_of[id]))) << obs.text;
      spans.emplace_back(std::stod(field(obs.text, "start")), std::stod(field(obs.text, "end")));
    }
    EXPECT_EQ(per_pid.size(), 4u);  // the fewest-first placement: two per process
    for (const auto& [pid, n] : per_pid) EXPECT_EQ(n, 2) << pid;
    // Concurrent: some two steps (of different processes) ran at the same time.
    int overlapping = 0;
    for (size_t i = 0; i < spans.size(); ++i)
      for (size_t j = i + 1; j < spans.size(); ++j)
        overlapping += spans[i].first < spans[j].second && spans[j].first < spans[i].second;
    EXPECT_GE(overlapping, 1);

    for (int64_t id = 0; id < 8; ++id) env.step(id, "again");
    for (auto& [id, obs] : collect(env, 8)) {
      EXPECT_EQ(field(obs.text, "pid"), pid_of[id]) << "trajectory " << id << " moved";
      EXPECT_EQ(field(obs.text, "turn"), "2");  // its own object kept its state
      EXPECT_EQ(obs.reward, 0.5);
      EXPECT_TRUE(obs.done);
    }
    for (int64_t id = 0; id < 8; ++id) env.close(id);
    EXPECT_TRUE(env.poll(1).empty());  // nothing in flight: returns at once
  }
  for (pid_t pid : pids) EXPECT_FALSE(pid_alive(pid)) << pid;
}

TEST_F(PythonEnvTest, RaisingEnvironmentIsNamedAndStopsEveryProcess) {
  PythonEnvironment env(config(2));
  const auto pids = env.worker_pids();
  env.reset(0, {{"label", "A"}});
  env.reset(1, {{"label", "B"}});
  env.step(0, "go");
  env.step(1, "raise");
  const std::string m = message_of<RuntimeError>([&] {
    for (int i = 0; i < 600; ++i) env.poll(0.1);
  });
  EXPECT_EQ(
      m.rfind(config(2).python + " raised ValueError: boom from B in step of trajectory 1", 0), 0u)
      << m;
  EXPECT_NE(m.find("\nValueError: boom from B"), std::string::npos) << m;  // traceback's last
  for (pid_t pid : pids) EXPECT_FALSE(pid_alive(pid)) << pid;
  EXPECT_NE(message_of<RuntimeError>([&] { env.step(0, "go"); }).find("stopped by an earlier"),
            std::string::npos);
}

TEST_F(PythonEnvTest, StepResultsOfTheWrongShapeAreNamed) {
  {
    PythonEnvironment env(config(1));
    env.reset(0, {{"label", "A"}});
    env.step(0, "bad_shape");
    const std::string m = message_of<RuntimeError>([&] { env.poll(30); });
    EXPECT_EQ(m, config(1).python +
                     ": step(action) of trajectory 0 returned \"oops\": not a 3-tuple; expected "
                     "(observation: str | None, reward: float, done: bool[, info: dict])");
  }
  PythonEnvironment env(config(1));
  env.reset(0, {{"label", "A"}});
  env.step(0, "not_json");
  const std::string m = message_of<RuntimeError>([&] { env.poll(30); });
  EXPECT_EQ(m.rfind(config(1).python + " returned tuple (<object objec", 0), 0u) << m;
  EXPECT_NE(m.find("which is not JSON"), std::string::npos) << m;
  EXPECT_NE(m.find("in step of trajectory 0"), std::string::npos) << m;
}

TEST_F(PythonEnvTest, DyingProcessIsNamedWithItsExitStatus) {
  PythonEnvironment env(config(2));
  const auto pids = env.worker_pids();
  env.reset(0, {{"label", "A"}});
  env.step(0, "exit");
  const std::string m = message_of<RuntimeError>([&] {
    for (int i = 0; i < 600; ++i) env.poll(0.1);
  });
  EXPECT_EQ(m, config(2).python + ": Python worker pid " + std::to_string(pids.at(0)) +
                   " exited with status 3 while running step of trajectory 0; every worker was "
                   "killed");
  for (pid_t pid : pids) EXPECT_FALSE(pid_alive(pid)) << pid;
  EXPECT_NE(message_of<RuntimeError>([&] { env.poll(1); }).find("stopped by an earlier"),
            std::string::npos);
}

TEST_F(PythonEnvTest, HungStepTimesOutItsTrajectoryAndTheProcessComesBack) {
  PythonEnvironment env(config(1, /*timeout_s=*/1));
  const auto pids = env.worker_pids();
  env.reset(0, {{"label", "A"}});
  env.reset(1, {{"label", "B"}});  // the same process: queued behind trajectory 0
  env.step(0, "hang");
  env.step(1, "go");
  const auto got = collect(env, 2);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_TRUE(got.at(0).timed_out);
  EXPECT_TRUE(got.at(0).done);
  EXPECT_EQ(got.at(0).text, "");
  EXPECT_FALSE(got.at(1).timed_out);  // served after SIGINT freed the process
  EXPECT_EQ(field(got.at(1).text, "label"), "B");
  env.step(0, "go");  // a timed-out trajectory stays timed out
  const auto again = env.poll(0);
  ASSERT_EQ(again.size(), 1u);
  EXPECT_TRUE(again[0].second.timed_out);
  for (pid_t pid : pids) EXPECT_TRUE(pid_alive(pid)) << pid;
}

TEST_F(PythonEnvTest, HungResetTimesOutTheStepQueuedBehindIt) {
  PythonEnvironment env(config(1, /*timeout_s=*/1));
  env.reset(0, {{"label", "hang_reset"}});
  env.step(0, "go");  // queued behind the reset: never sent
  env.reset(1, {{"label", "B"}});
  env.step(1, "go");
  const auto got = collect(env, 2);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_TRUE(got.at(0).timed_out);
  EXPECT_TRUE(got.at(0).done);
  EXPECT_FALSE(got.at(1).timed_out);
  EXPECT_EQ(field(got.at(1).text, "turn"), "1");
  env.close(0);
  env.close(1);
}

TEST_F(PythonEnvTest, HungProcessThatDoesNotComeBackStopsTheEnvironment) {
  std::vector<pid_t> pids;
  {
    PythonEnvironment env(config(1, /*timeout_s=*/1));
    pids = env.worker_pids();
    env.reset(0, {{"label", "A"}});
    env.reset(1, {{"label", "B"}});
    env.step(0, "hang_hard");  // catches KeyboardInterrupt and sleeps on
    env.step(1, "go");
    std::vector<std::pair<int64_t, Observation>> first;
    for (int i = 0; i < 100 && first.empty(); ++i) first = env.poll(0.1);
    ASSERT_EQ(first.size(), 1u);
    EXPECT_EQ(first[0].first, 0);
    EXPECT_TRUE(first[0].second.timed_out);
    const std::string m = message_of<RuntimeError>([&] {
      for (int i = 0; i < 600; ++i) env.poll(0.1);
    });
    EXPECT_EQ(m, config(1).python +
                     ": step of trajectory 0 did not return within env.timeout_s = "
                     "1 s and its Python process pid " +
                     std::to_string(pids.at(0)) +
                     " did not come back within 1 s of SIGINT; every process was killed and the "
                     "environment is stopped");
    for (pid_t pid : pids) EXPECT_FALSE(pid_alive(pid)) << pid;
  }
}

TEST_F(PythonEnvTest, EnvironmentThatDoesNotLoadIsAnInputErrorNamingTheKey) {
  EnvironmentConfig c = config(1);
  c.python = (dir_ / "env.py").string() + ":no_such_factory";
  std::string m = message_of<InputError>([&] { PythonEnvironment env(c); });
  EXPECT_EQ(m, "env.python: " + c.python + ": env.py has no attribute 'no_such_factory'");
  c.python = (dir_ / "missing.py").string() + ":make_env";
  m = message_of<InputError>([&] { PythonEnvironment env(c); });
  EXPECT_EQ(m, "env.python: " + c.python + ": no such file");
  std::ofstream(dir_ / "broken.py") << "import no_such_module_rlhf\n";
  c.python = (dir_ / "broken.py").string() + ":make_env";
  m = message_of<InputError>([&] { PythonEnvironment env(c); });
  EXPECT_NE(m.find("does not import"), std::string::npos) << m;
  EXPECT_NE(m.find("ModuleNotFoundError"), std::string::npos) << m;
}

}  // namespace
}  // namespace rlhf::envs
