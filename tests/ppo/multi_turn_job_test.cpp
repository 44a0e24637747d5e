// Multi-turn jobs end to end (issue 31): examples/grpo_tools_tiny.json through real worker
// processes with the built-in guess_number environment, a Python environment and an HTTP one
// (a real http.server), and environments that fail: each stops the job with a one-line message
// naming it, and no process of the job is left.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "test_paths.h"
#include "tests/support/http_env_server.h"
#include "tests/support/process_checks.h"
#include "tests/support/run_cli.h"

namespace rlhf::ppo {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A Python environment: reset's initial observation "Guess a digit." joins the prompt; a
// right answer contains "1"; step takes the parsed tool_calls (a list, [] without a call);
// every process writes its pid to pids.txt. MODE "raise" raises in step, "hang" sleeps in step
// (SIGINT interrupts it), "deaf" sleeps with SIGINT ignored.
constexpr const char* kEnvPy = R"(import os, signal, time
MODE = os.environ.get("RLHF_TEST_ENV_MODE", "")
DIED = os.environ.get("RLHF_TEST_ENV_DIED", "")

class Game:
    def __init__(self, pids):
        with open(pids, "a") as f:
            f.write(f"{os.getpid()}\n")
        if MODE == "deaf":
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        self.turns = 0

    def reset(self, row):
        self.turns = 0
        return " Guess a digit."

    def step(self, action, tool_calls=None):
        if not isinstance(tool_calls, list):
            raise TypeError(f"tool_calls: expected a list, got {tool_calls!r}")
        if MODE == "raise":
            raise ValueError("boom in step")
        if MODE in ("hang", "deaf"):
            time.sleep(600)
        if MODE == "die_once" and not os.path.exists(DIED):
            open(DIED, "w").close()
            os._exit(3)
        self.turns += 1
        right = "1" in action
        return ("right" if right else "try again", 1.0 if right else 0.0,
                right or self.turns >= 2)

def make_env(pids=""):
    return Game(pids)
)";

// A Python calculator: it reads the parsed calls (step's tool_calls keyword) and answers
// each "A*B" with its product, as a tool turn; a turn without a call ends the trajectory.
constexpr const char* kCalculatorPy = R"(class Calculator:
    def reset(self, row):
        return None

    def step(self, action, tool_calls=None):
        if not tool_calls:
            return None, 0.0, True
        lines, errors = [], 0
        for call in tool_calls:
            if "error" in call:
                lines.append(call["error"])
                errors += 1
                continue
            try:
                a, b = call["arguments"]["expression"].split("*")
                lines.append(str(int(a) * int(b)))
            except (KeyError, ValueError) as e:
                lines.append(f"error: {e}")
                errors += 1
        return "\n".join(lines), 0.0, False, {"role": "tool", "tool_calls": len(tool_calls),
                                              "tool_errors": errors}

def make_env(**options):
    return Calculator()
)";

class MultiTurnJob : public testing::Test {
 protected:
  void SetUp() override { dir_ = test::tiny_models_dir("multi_turn"); }
  test::CliResult run(const std::string& name, std::vector<std::string> extra) {
    std::vector<std::string> args = {"run",   "examples/grpo_tools_tiny.json",
                                     "--set", "actor.model=" + (dir_ / "tiny").string(),
                                     "--set", "logger.run_dir=" + (dir_ / "runs").string(),
                                     "--set", "name=" + name,
                                     "--set", "ckpt.export_hf=false"};
    args.insert(args.end(), extra.begin(), extra.end());
    return test::run_cli(args);
  }
  std::vector<json> metrics(const std::string& name) const {
    return test::read_jsonl((dir_ / "runs" / name / "metrics.jsonl").string());
  }
  // The Python environment's file and the --set options that select it in MODE.
  std::vector<std::string> python_env(const std::string& mode) {
    std::ofstream(dir_ / "env.py") << kEnvPy;
    setenv("RLHF_TEST_ENV_MODE", mode.c_str(), 1);
    fs::remove(dir_ / "pids.txt");
    return {"--set", "env.builtin=",
            "--set", "env.python=" + (dir_ / "env.py").string() + ":make_env",
            "--set", "env.python_interpreter=" + std::string(RLHF_PYTHON),
            "--set", "env.python_workers=2",
            "--set", "env.options={\"pids\": \"" + (dir_ / "pids.txt").string() + "\"}"};
  }
  // Every pid the Python environment wrote is gone (its processes were stopped and reaped).
  void expect_python_processes_gone() const {
    std::ifstream in(dir_ / "pids.txt");
    int pid = 0, seen = 0;
    while (in >> pid) {
      ++seen;
      bool gone = false;
      for (int i = 0; i < 50 && !gone; ++i) {  // up to 5 s for the kernel to reap
        gone = !test::pid_alive(pid);
        if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      EXPECT_TRUE(gone) << "Python environment process " << pid << " is still running";
    }
    EXPECT_GT(seen, 0) << "the environment wrote no pid";
  }
  fs::path dir_;
};

double mean(const std::vector<json>& m, const char* key, size_t from, size_t to) {
  double sum = 0;
  for (size_t i = from; i < to; ++i) sum += m[i][key].get<double>();
  return sum / static_cast<double>(to - from);
}

// The example as it is: 30 steps of guess-the-number (1..3) in up to 3 turns. The metrics
// show several turns per game and the environment's tokens masked; the reward (the
// environment's alone) rises; samples.jsonl shows whole conversations with the user turns.
TEST_F(MultiTurnJob, GuessTheNumberLearnsOverTheGamesTurns) {
  test::CliResult r = run("guess", {});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto m = metrics("guess");
  ASSERT_EQ(m.size(), 30u);
  double most_turns = 0, most_masked = 0;
  for (const auto& step : m) {
    most_turns = std::max(most_turns, step["turns_mean"].get<double>());
    most_masked = std::max(most_masked, step["masked_token_share"].get<double>());
    EXPECT_EQ(step["reward_mean"].get<double>(), step["env_reward_mean"].get<double>());
  }
  EXPECT_GT(most_turns, 1.1);
  EXPECT_GT(most_masked, 0.02);
  const double first = mean(m, "reward_mean", 0, 10), last = mean(m, "reward_mean", 20, 30);
  EXPECT_GT(last, first + 0.03) << "steps 1-10 " << first << ", 21-30 " << last;
  const auto samples = test::read_jsonl((dir_ / "runs" / "guess" / "samples.jsonl").string());
  ASSERT_FALSE(samples.empty());
  bool user_turn = false;
  for (const auto& s : samples)
    for (const auto& turn : s.value("conversation", json::array()))
      user_turn = user_turn || turn.value("role", "") == "user";
  EXPECT_TRUE(user_turn) << samples.back().dump();
}

// The calculator's pipeline on the tiny model: SFT on tool-use conversations from a file
// (data.multiturn; half call the calculator and answer with its result, half answer at once),
// then GRPO with env.builtin calculator on message-list prompts from a file. The SFT'd model
// writes well-formed calls (0.5 of the SFT answers call; 150 steps measured 0.6-0.85 a step,
// so >= 0.3 every step is far from chance for a model that never saw the format, which
// calls 0 times), the calculator answers each with the product of the expression the
// model wrote, and some trajectories go on to a second model turn after the tool's.
// (Learning *when* to call needs a model that copies the tool's result into its answer: the
// tiny model does after 600 SFT steps, too long for this suite; bench/RESULTS.md has that
// run and SmolLM2's.)
TEST_F(MultiTurnJob, SftOnToolTracesThenGrpoWithTheCalculator) {
  std::mt19937 rng(3);
  auto problem = [&] {
    const int a = 10 + static_cast<int>(rng() % 90), b = 10 + static_cast<int>(rng() % 90);
    return std::make_pair(std::to_string(a) + "*" + std::to_string(b), a * b);
  };
  auto call = [](const std::string& e) {
    return "<tool_call>{\"name\": \"calculator\", \"arguments\": {\"expression\": \"" + e +
           "\"}}</tool_call>";
  };
  {
    std::ofstream sft(dir_ / "calc_sft.jsonl");
    for (int i = 0; i < 4800; ++i) {
      const auto [e, answer] = problem();
      json m = json::array({{{"role", "user"}, {"content", e + "=?"}}});
      if (rng() % 2) {
        m.push_back({{"role", "assistant"}, {"content", call(e)}});
        m.push_back({{"role", "tool"}, {"content", std::to_string(answer)}});
      }
      m.push_back({{"role", "assistant"}, {"content", std::to_string(answer)}});
      sft << json{{"messages", m}}.dump() << "\n";
    }
    std::ofstream prompts(dir_ / "calc_prompts.jsonl");
    for (int i = 0; i < 256; ++i) {
      const auto [e, answer] = problem();
      prompts << json{{"prompt", json::array({{{"role", "user"}, {"content", e + "=?"}}})},
                      {"label", std::to_string(answer)}}
                     .dump()
              << "\n";
    }
  }
  // The chat template comes with the model as chat_template.jinja (as transformers saves it;
  // ChatML without a default system message), detected (data.chat_template auto) by both
  // jobs: the GRPO job reads it from the SFT export, which must carry it.
  std::ofstream(dir_ / "tiny" / "chat_template.jinja")
      << "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
         "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt "
         "%}{{ '<|im_start|>assistant\\n' }}{% endif %}";
  test::CliResult sft =
      test::run_cli({"run",   "examples/sft_tiny.json",
                     "--set", "actor.model=" + (dir_ / "tiny").string(),
                     "--set", "logger.run_dir=" + (dir_ / "runs").string(),
                     "--set", "name=calc_sft",
                     "--set", "data.dataset=" + (dir_ / "calc_sft.jsonl").string(),
                     "--set", "data.multiturn=true",
                     "--set", "data.prompt_key=messages",
                     "--set", "data.apply_chat_template=true",
                     "--set", "data.chat_template=auto",
                     "--set", "data.prompt_max_len=64",
                     "--set", "data.max_len=256",
                     "--set", "train.batch_size=32",
                     "--set", "train.micro_batch_size=32",
                     "--set", "train.max_steps=150",
                     "--set", "logger.logging_steps=50"});
  ASSERT_EQ(sft.exit_code, 0) << sft.out << sft.err;
  const fs::path model = dir_ / "runs" / "calc_sft" / "export" / "actor";
  EXPECT_TRUE(fs::exists(model / "chat_template.jinja"));
  // GRPO from the SFT export; `env` selects the environment.
  auto grpo = [&](const std::string& name, int steps, std::vector<std::string> env) {
    std::vector<std::string> args = {
        "run",   "examples/grpo_tools_tiny.json",
        "--set", "actor.model=" + model.string(),
        "--set", "logger.run_dir=" + (dir_ / "runs").string(),
        "--set", "name=" + name,
        "--set", "ckpt.export_hf=false",
        "--set", "env.builtin=",
        "--set", "env.options={}",
        "--set", "data.chat_template=auto",
        "--set", "rollout.max_turns=2",
        "--set", "rollout.temperature=0.7",
        "--set", "rollout.max_new_tokens=192",
        "--set", "data.prompt_max_len=64",
        "--set", "data.max_len=256",
        "--set", "data.prompt_dataset=" + (dir_ / "calc_prompts.jsonl").string(),
        "--set", "data.input_key=prompt",
        "--set", "data.label_key=label",
        "--set", "reward.sources=[{\"rule\": \"math\", \"name\": \"correct\"}]",
        "--set", "train.max_steps=" + std::to_string(steps),
        "--set", "logger.samples_per_step=16"};
    args.insert(args.end(), env.begin(), env.end());
    return test::run_cli(args);
  };
  // The calls are well formed, each tool turn holds the product of the expression in the
  // call before it, and some trajectories go on to the answer turn.
  auto check = [&](const std::string& name, size_t steps, int min_answered) {
    const auto m = metrics(name);
    ASSERT_EQ(m.size(), steps) << name;
    // Tool errors over the run, not per step: a step's rate swings with the prompts it draws
    // (measured 0, 0, 1, 28, 0, 4 errors of ~48 calls a step: one step's prompts made the
    // model write calls the calculator refuses); a broken calculator errs on every call.
    double errors = 0, calls = 0;
    for (const auto& step : m) {
      EXPECT_GE(step["tool_call_rate"].get<double>(), 0.3) << name << " " << step.dump();
      errors += step["tool_errors"].get<double>();
      calls += step["tool_calls"].get<double>();
      EXPECT_GT(step["masked_token_share"].get<double>(), 0.1) << name << " " << step.dump();
    }
    EXPECT_LE(errors, 0.25 * calls) << name;
    const std::regex expression(R"re("expression": "(\d+)\*(\d+)")re");
    int answered = 0, continued = 0;
    for (const auto& s : test::read_jsonl((dir_ / "runs" / name / "samples.jsonl").string())) {
      const json& turns = s.at("conversation");
      for (size_t i = 2; i < turns.size(); ++i) {
        if (turns[i]["role"] != "tool") continue;
        std::smatch match;
        const std::string previous = turns[i - 1]["content"];
        if (!std::regex_search(previous, match, expression)) continue;
        EXPECT_EQ(turns[i]["content"],
                  std::to_string(std::stoi(match[1].str()) * std::stoi(match[2].str())))
            << name << ": " << previous;
        ++answered;
        continued += i + 1 < turns.size() && turns[i + 1]["role"] == "assistant" ? 1 : 0;
      }
    }
    EXPECT_GT(answered, min_answered) << name;  // of 16 logged trajectories a step
    EXPECT_GT(continued, 0) << name;
  };
  test::CliResult r = grpo("calc", 6, {"--set", "env.builtin=calculator"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  check("calc", 6, 20);

  // The same job with a Python calculator (reading the parsed calls it is handed) and an HTTP
  // one (tests/envs/http_env_server.py with env.options calculator), 2 steps each.
  std::ofstream(dir_ / "calc_env.py") << kCalculatorPy;
  r = grpo("calc_python", 2,
           {"--set", "env.python=" + (dir_ / "calc_env.py").string() + ":make_env", "--set",
            "env.python_interpreter=" + std::string(RLHF_PYTHON)});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  check("calc_python", 2, 6);
  {
    test::HttpEnvServer server;
    ASSERT_GT(server.port(), 0) << "the test server printed no port";
    r = grpo("calc_http", 2,
             {"--set", "env.url=" + server.url(), "--set", "env.options={\"calculator\": true}"});
  }
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  check("calc_http", 2, 6);
}

// The same job with a Python environment (4 steps): it runs, its rewards and turns are in
// the metrics (the resets' time in env_time_s), samples.jsonl's conversations begin with the
// reset's observation, and its processes are gone afterwards.
TEST_F(MultiTurnJob, PythonEnvironmentRunsTheJob) {
  auto extra = python_env("");
  extra.insert(extra.end(), {"--set", "train.max_steps=4"});
  test::CliResult r = run("python", extra);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto m = metrics("python");
  ASSERT_EQ(m.size(), 4u);
  for (const auto& step : m) {
    EXPECT_GE(step["turns_mean"].get<double>(), 1.0);
    EXPECT_GT(step["env_time_s"].get<double>(), 0.0);
  }
  const auto samples = test::read_jsonl((dir_ / "runs" / "python" / "samples.jsonl").string());
  ASSERT_FALSE(samples.empty());
  int truncated = 0;
  for (const auto& s : samples) {
    const json& c = s.at("conversation");
    // The prompt, the observation, then the turns: the model's first is listed whether it
    // ended with its end-of-turn token or the token budget cut it ("truncated": the untrained
    // model rarely writes the token), and the response holds it.
    ASSERT_GE(c.size(), 3u) << s.dump();
    EXPECT_EQ(c[1], (json{{"role", "observation"}, {"content", " Guess a digit."}})) << s.dump();
    EXPECT_EQ(c[2]["role"], "assistant") << s.dump();
    if (c.back().value("truncated", false)) {
      ++truncated;
      EXPECT_EQ(c.back()["role"], "assistant");
    }
  }
  EXPECT_GT(truncated, 0);
  expect_python_processes_gone();
}

// Issue 45: the environment's interpreter dies in a step (once): its rollout worker ends
// (exit 75), is started again with a fresh environment and generates the micro batch again;
// the job ends with every step once.
TEST_F(MultiTurnJob, ADeadEnvironmentInterpreterRestartsItsRolloutWorker) {
  const fs::path died = dir_ / "died-once";
  fs::remove(died);
  setenv("RLHF_TEST_ENV_DIED", died.c_str(), 1);
  auto extra = python_env("die_once");
  extra.insert(extra.end(), {"--set", "train.max_steps=3"});
  test::CliResult r = run("env_died", extra);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(fs::exists(died)) << "the environment never died";
  const auto m = metrics("env_died");
  ASSERT_EQ(m.size(), 3u);
  for (size_t i = 0; i < m.size(); ++i) EXPECT_EQ(m[i]["step"], i + 1);
  const auto restarts = test::read_jsonl((dir_ / "runs" / "env_died" / "restarts.jsonl").string());
  ASSERT_EQ(restarts.size(), 1u) << r.err;
  EXPECT_EQ(restarts[0]["role"], "rollout");
  EXPECT_EQ(restarts[0]["cause"], "exit code 75") << restarts[0].dump();
  EXPECT_GT(restarts[0]["ready_s"].get<double>(), 0);
  EXPECT_EQ(m.back()["restarts"]["worker"]["rollout"], 1);
  expect_python_processes_gone();
}

// A hung step (SIGINT brings the process back) times out its trajectory only: the job ends
// normally and counts the timeouts.
TEST_F(MultiTurnJob, HungPythonStepTimesOutItsTrajectory) {
  auto extra = python_env("hang");
  extra.insert(extra.end(), {"--set", "train.max_steps=1", "--set", "env.timeout_s=1", "--set",
                             "rollout.batch_size=2", "--set", "rollout.micro_batch_size=2", "--set",
                             "train.batch_size=16"});
  test::CliResult r = run("hang", extra);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto m = metrics("hang");
  ASSERT_EQ(m.size(), 1u);
  EXPECT_GT(m[0]["env_timeouts"].get<double>(), 0) << m[0].dump();
  expect_python_processes_gone();
}

// Environments that fail stop the job (exit 1) with one line naming them.
TEST_F(MultiTurnJob, FailingEnvironmentsStopTheJobNamingThem) {
  const std::string env_py = (dir_ / "env.py").string() + ":make_env";
  {
    test::CliResult r = run("raise", python_env("raise"));
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find(env_py + " raised ValueError: boom in step"), std::string::npos) << r.err;
    expect_python_processes_gone();
  }
  {
    auto extra = python_env("deaf");
    extra.insert(extra.end(), {"--set", "env.timeout_s=1"});
    test::CliResult r = run("deaf", extra);
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find(env_py + ": step of trajectory"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("did not come back"), std::string::npos) << r.err;
    expect_python_processes_gone();
  }
  {
    test::CliResult r =
        run("refused", {"--set", "env.builtin=", "--set", "env.url=http://127.0.0.1:9/env"});
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("HTTP environment http://127.0.0.1:9/env"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("Connection refused"), std::string::npos) << r.err;
  }
}

// An HTTP environment (tests/envs/http_env_server.py, a real server on a free port) runs the
// job: every turn the server answered (it counts one tool call each) earned 0.5, summed per
// trajectory (a turn the token budget cut off is never sent).
TEST_F(MultiTurnJob, HttpEnvironmentRunsTheJob) {
  test::CliResult r;
  {
    test::HttpEnvServer server;
    ASSERT_GT(server.port(), 0) << "the test server printed no port";
    r = run("http", {"--set", "env.builtin=", "--set", "env.url=" + server.url(), "--set",
                     "train.max_steps=2"});
  }
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto m = metrics("http");
  ASSERT_EQ(m.size(), 2u);
  for (const auto& step : m) {
    const double samples = 8 * 8;  // rollout.batch_size x n_samples_per_prompt
    EXPECT_GT(step["tool_calls"].get<double>(), 0) << step.dump();
    EXPECT_NEAR(step["env_reward_mean"].get<double>() * samples,
                0.5 * step["tool_calls"].get<double>(), 1e-6)
        << step.dump();
  }
}

}  // namespace
}  // namespace rlhf::ppo
