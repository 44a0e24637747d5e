// `rlhf run` over a job's life, through the real binary with worker processes (issue 19):
// Ctrl-C (exit 130, the checkpoint --resume would use), checkpoints announced, kept to
// ckpt.max_num and written at the end, --resume writing each step's metrics and TensorBoard
// events once and refusing changed trajectory settings unless asked, and progress lines while
// phases run.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <regex>

#include "report/tensorboard.h"
#include "test_paths.h"
#include "tests/support/processes.h"
#include "tests/support/run_cli.h"

namespace rlhf::test {
namespace {

namespace fs = std::filesystem;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

std::vector<int> steps_of(const fs::path& metrics) {
  std::vector<int> steps;
  for (const auto& m : read_jsonl(metrics.string())) steps.push_back(m["step"].get<int>());
  return steps;
}

// TensorBoard's own reading of an event directory (tests/cli/read_tensorboard.py in
// RLHF_PYTHON, which scripts/setup gives the `tensorboard` package), through `scratch`:
// {"scalars": {tag: [[step, value], ...]}, "texts": {...}}. EventAccumulator's reading, or
// with `plugin` that of the reader TensorBoard's server uses without its Rust data server.
nlohmann::json read_board(const fs::path& events, const fs::path& scratch, bool plugin = false) {
  const std::string cmd = std::string("'") + RLHF_PYTHON + "' '" + RLHF_SOURCE_DIR +
                          "/tests/cli/read_tensorboard.py' '" + events.string() + "'" +
                          (plugin ? " --plugin" : "") + " > '" + scratch.string() + "'";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd << "\n(does RLHF_PYTHON have tensorboard? "
                                         << "scripts/setup installs it)";
  return nlohmann::json::parse(slurp(scratch.string()));
}

// The steps of a TensorBoard scalar series, in the order TensorBoard keeps them.
std::vector<int> board_steps(const nlohmann::json& board, const std::string& tag) {
  std::vector<int> steps;
  for (const auto& e : board["scalars"][tag]) steps.push_back(e[0].get<int>());
  return steps;
}

// TensorBoard shows reward_mean at the steps of `metrics` (1, 2, ...), with its values
// (float32: a relative 1e-6 covers the rounding), and no series has a step twice.
void expect_each_step_once(const nlohmann::json& board,
                           const std::vector<nlohmann::json>& metrics) {
  std::vector<int> want_steps;
  for (const auto& m : metrics) want_steps.push_back(m["step"].get<int>());
  ASSERT_EQ(board_steps(board, "reward_mean"), want_steps);
  for (size_t i = 0; i < metrics.size(); ++i) {
    const double want = metrics[i]["reward_mean"].get<double>();
    EXPECT_NEAR(board["scalars"]["reward_mean"][i][1].get<double>(), want,
                1e-6 * std::abs(want) + 1e-30)
        << "step " << want_steps[i];
  }
  for (const auto& [tag, points] : board["scalars"].items()) {
    const std::vector<int> steps = board_steps(board, tag);
    EXPECT_TRUE(std::adjacent_find(steps.begin(), steps.end(), std::greater_equal<int>()) ==
                steps.end())
        << tag << " has a step twice or out of order: " << points.dump();
  }
}

std::vector<std::string> driver_files(const fs::path& dir) {
  std::vector<std::string> names;
  if (fs::exists(dir))
    for (const auto& f : fs::directory_iterator(dir)) names.push_back(f.path().filename());
  std::sort(names.begin(), names.end());
  return names;
}

class RunLifecycle : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = test::tiny_models_dir("lifecycle"); }
  void TearDown() override {
    ::unsetenv("RLHF_PROGRESS_AFTER_S");
    if (!HasFailure()) fs::remove_all(dir_);
  }
  // `run SPEC` arguments with this test's models and run directory, then `extra`.
  std::vector<std::string> args(const std::string& example, std::vector<std::string> extra) const {
    std::vector<std::string> a = {"run", std::string(RLHF_SOURCE_DIR) + "/examples/" + example,
                                  "--set", "logger.run_dir=" + (dir_ / "runs").string()};
    if (example == "ppo_tiny.json")
      for (const std::string& s : {"actor.model=" + (dir_ / "tiny").string(),
                                   "critic.model=" + (dir_ / "tiny-value").string()})
        a.insert(a.end(), {"--set", s});
    else
      a.insert(a.end(), {"--set", "actor.model=" + (dir_ / "tiny").string()});
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  fs::path dir_;
};

TEST_F(RunLifecycle, InterruptResumeAndCheckpoints) {
  const fs::path run = dir_ / "runs" / "ppo_tiny";
  const std::vector<std::string> common = {
      "--set", "train.max_steps=9", "--set", "ckpt.save_steps=2", "--set", "ckpt.max_num=2"};
  {
    rlhf::testing::RlhfProcess job(args("ppo_tiny.json", common), dir_.string());
    ASSERT_TRUE(rlhf::testing::poll_until(
        [&] {
          return fs::exists(run / "metrics.jsonl") && steps_of(run / "metrics.jsonl").size() >= 5;
        },
        std::chrono::seconds(120)))
        << job.out() << job.err();
    ASSERT_EQ(::kill(job.pid(), SIGINT), 0);
    const auto status = job.wait(std::chrono::seconds(60));
    ASSERT_TRUE(status.has_value()) << "not stopped within 60 s";
    ASSERT_TRUE(WIFEXITED(*status));
    EXPECT_EQ(WEXITSTATUS(*status), 130) << job.err();  // 128 + SIGINT, as shells report
    // Checkpoints are announced as they start and when they are complete.
    EXPECT_TRUE(contains(job.out(), "ppo: saving the checkpoint of step 2 to ")) << job.out();
    EXPECT_TRUE(contains(job.out(), "ppo: checkpoint of step 2 saved in ")) << job.out();
    // The line says which checkpoint a --resume continues from, and the command.
    std::smatch m;
    const std::string err = job.err();
    ASSERT_TRUE(std::regex_search(err, m, std::regex("--resume` continues after step (\\d+)")))
        << err;
    const int saved = std::stoi(m[1]);
    EXPECT_GE(saved, 4);
    EXPECT_EQ(saved % 2, 0);
    EXPECT_TRUE(contains(err, "rlhf run " + std::string(RLHF_SOURCE_DIR) +
                                  "/examples/ppo_tiny.json --set logger.run_dir="))
        << err;
    EXPECT_TRUE(fs::exists(run / "ckpt" / "actor" / ("global_step" + std::to_string(saved))));
    // ckpt.max_num = 2 holds for the driver's files as for the trainers' shards.
    EXPECT_EQ(driver_files(run / "ckpt" / "driver"),
              (std::vector<std::string>{"global_step" + std::to_string(saved - 2) + ".json",
                                        "global_step" + std::to_string(saved) + ".json"}));
    EXPECT_FALSE(fs::exists(run / "stores")) << "rendezvous files go with the workers";
  }
  const std::vector<int> before = steps_of(run / "metrics.jsonl");

  // Changing what the trajectory depends on is refused, naming each change; nothing written
  // is touched.
  std::vector<std::string> changed = common;
  changed.insert(changed.end(), {"--set", "rollout.n_samples_per_prompt=2", "--set",
                                 "actor.adam.lr=1e-4", "--resume"});
  CliResult refused = run_cli(args("ppo_tiny.json", changed));
  EXPECT_EQ(refused.exit_code, 2) << refused.out << refused.err;
  EXPECT_TRUE(contains(refused.err, "rollout.n_samples_per_prompt: 4 -> 2")) << refused.err;
  EXPECT_TRUE(contains(refused.err, "actor.adam.lr: 0.001 -> 0.0001")) << refused.err;
  EXPECT_TRUE(contains(refused.err, "--resume-changed")) << refused.err;
  EXPECT_EQ(steps_of(run / "metrics.jsonl"), before);

  // Resumed: every step appears once, and the last step is checkpointed although 9 is not
  // a multiple of ckpt.save_steps.
  std::vector<std::string> resume = common;
  resume.push_back("--resume");
  CliResult resumed = run_cli(args("ppo_tiny.json", resume));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out << resumed.err;
  EXPECT_EQ(steps_of(run / "metrics.jsonl"), (std::vector<int>{1, 2, 3, 4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(driver_files(run / "ckpt" / "driver"),
            (std::vector<std::string>{"global_step8.json", "global_step9.json"}));
  EXPECT_TRUE(fs::exists(run / "ckpt" / "actor" / "global_step9"));

  // Asked for, a changed setting is accepted and named.
  std::vector<std::string> extend = {
      "--set", "train.max_steps=10", "--set",    "ckpt.save_steps=2", "--set", "ckpt.max_num=2",
      "--set", "actor.adam.lr=5e-4", "--resume", "--resume-changed"};
  CliResult more = run_cli(args("ppo_tiny.json", extend));
  ASSERT_EQ(more.exit_code, 0) << more.out << more.err;
  EXPECT_TRUE(contains(more.out, "--resume-changed: actor.adam.lr: 0.001 -> 0.0005")) << more.out;
  EXPECT_TRUE(contains(more.out, "resuming after step 9")) << more.out;
  EXPECT_EQ(steps_of(run / "metrics.jsonl"), (std::vector<int>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}));

  // TensorBoard, too, shows every step once (in both of its Python readers): the steps the
  // interrupted run logged after its checkpoint were replaced by the resumed run's.
  for (bool plugin : {false, true})
    expect_each_step_once(read_board(run / "tensorboard", dir_ / "board.json", plugin),
                          read_jsonl((run / "metrics.jsonl").string()));
}

// How a resume reaches TensorBoard, without a job: the interrupted run logged steps 1-5, its
// checkpoint is step 3, the resumed run logs 4-6 again in a new event file. Both of
// TensorBoard's Python readers then show steps 1-6 once each, 4 and 5 with the resumed run's
// values (float32: 1e-6).
TEST(TensorBoard, ResumedRunReplacesTheStepsAfterItsCheckpoint) {
  const fs::path dir = fs::path(RLHF_BINARY_DIR) / "test-runs" /
                       ("tensorboard-resume-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  {
    report::EventWriter interrupted((dir / "tensorboard").string());
    for (int step = 1; step <= 5; ++step) interrupted.scalar("reward_mean", step, step);
    interrupted.text("samples", "| prompt |", 5);
    interrupted.flush();
  }
  EXPECT_TRUE(report::mark_resumed_after((dir / "tensorboard").string(), 3));
  {
    report::EventWriter resumed((dir / "tensorboard").string());
    for (int step = 4; step <= 6; ++step) resumed.scalar("reward_mean", 10.0 * step, step);
    resumed.flush();
  }
  for (bool plugin : {false, true}) {
    const auto board = read_board(dir / "tensorboard", dir / "board.json", plugin);
    const auto& points = board["scalars"]["reward_mean"];
    ASSERT_EQ(board_steps(board, "reward_mean"), (std::vector<int>{1, 2, 3, 4, 5, 6}))
        << (plugin ? "plugin reader: " : "EventAccumulator: ") << points.dump();
    const std::vector<double> want = {1, 2, 3, 40, 50, 60};
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_NEAR(points[i][1].get<double>(), want[i], 1e-6 * want[i]) << "step " << i + 1;
    // The server's reader drops the text tab's samples of step 5 with the step
    // (EventAccumulator purges no text).
    if (plugin) {
      EXPECT_TRUE(board["texts"].value("samples", nlohmann::json::array()).empty())
          << board["texts"].dump();
    }
  }
  // Nothing to replace in a directory without events: no file is added.
  fs::remove_all(dir / "empty");
  fs::create_directories(dir / "empty");
  EXPECT_FALSE(report::mark_resumed_after((dir / "empty").string(), 3));
  EXPECT_TRUE(fs::is_empty(dir / "empty"));
  EXPECT_FALSE(report::mark_resumed_after((dir / "absent").string(), 3));
  fs::remove_all(dir);
}

// What a long phase prints: loading each role, generating/scoring/training with the step,
// elapsed time and ETA on each step line, saves and exports as they start. Phase lines
// appear after RLHF_PROGRESS_AFTER_S (0 here: at once).
TEST_F(RunLifecycle, ProgressOfEveryPhase) {
  ::setenv("RLHF_PROGRESS_AFTER_S", "0", 1);
  CliResult ppo = run_cli(args("ppo_tiny.json", {"--set", "train.max_steps=2"}));
  ASSERT_EQ(ppo.exit_code, 0) << ppo.out << ppo.err;
  for (const char* line :
       {"ppo: loading actor (1 worker)", "ppo: critic ready after ", "... loading models",
        "... step 1/2: generating 16 prompts x 4 samples", "... step 1/2: scoring 64 samples",
        "... step 1/2: training, epoch 1/1", "ppo: saving the checkpoint of step 2",
        "ppo: exporting the trained actor to "})
    EXPECT_TRUE(contains(ppo.out, line)) << line << "\n" << ppo.out;
  EXPECT_TRUE(std::regex_search(ppo.out, std::regex("step 1/2 \\|.* \\| elapsed \\d+:\\d\\d \\| "
                                                    "eta \\d+:\\d\\d\n")))
      << ppo.out;
  EXPECT_FALSE(fs::exists(dir_ / "runs" / "ppo_tiny" / "stores")) << "no empty stores/ left";
  // One metric name per meaning across job kinds: the trained policy's learning rate and
  // gradient norm are lr and grad_norm in ppo as in sft/dpo/rm.
  const auto ppo_metrics = read_jsonl((dir_ / "runs" / "ppo_tiny" / "metrics.jsonl").string());
  ASSERT_FALSE(ppo_metrics.empty());
  for (const char* key : {"lr", "grad_norm", "critic_grad_norm"})
    EXPECT_TRUE(ppo_metrics.back().contains(key)) << key << " in " << ppo_metrics.back().dump();
  for (const char* key : {"actor_lr", "actor_grad_norm"})
    EXPECT_FALSE(ppo_metrics.back().contains(key)) << key;

  CliResult sft = run_cli(args("sft_tiny.json", {"--set", "train.max_steps=2"}));
  ASSERT_EQ(sft.exit_code, 0) << sft.out << sft.err;
  for (const char* line : {"sft: loading actor (1 worker)", "... step 1/2: training, epoch 1/",
                           "... evaluating ", "sft: exporting the trained actor to "})
    EXPECT_TRUE(contains(sft.out, line)) << line << "\n" << sft.out;
  EXPECT_TRUE(std::regex_search(sft.out, std::regex("step 2/2 \\|.* \\| eta 0:00\n"))) << sft.out;
  const auto sft_metrics = read_jsonl((dir_ / "runs" / "sft_tiny" / "metrics.jsonl").string());
  bool logged_step = false;
  for (const auto& m : sft_metrics) {
    if (m.value("split", "") == "eval") continue;
    logged_step = true;
    for (const char* key : {"lr", "grad_norm"}) EXPECT_TRUE(m.contains(key)) << key << m.dump();
  }
  EXPECT_TRUE(logged_step);
  // docs/metrics.md names every key a record carries.
  const std::string reference = slurp(std::string(RLHF_SOURCE_DIR) + "/docs/metrics.md");
  std::vector<nlohmann::json> records = sft_metrics;
  records.insert(records.end(), ppo_metrics.begin(), ppo_metrics.end());
  for (const auto& m : records) {
    for (const auto& [key, value] : m.items())
      EXPECT_TRUE(contains(reference, "`" + key + "`")) << key << " is not in docs/metrics.md";
    if (!m.contains("memory")) continue;
    for (const auto& [role, ranks] : m["memory"].items())
      for (const auto& [key, value] : ranks[0].items())
        EXPECT_TRUE(contains(reference, "`" + key + "`")) << "memory key " << key;
  }
}

// Every logged number is a TensorBoard scalar at its step (a "histogram" array a histogram
// with those bucket counts; a "timeline" of intervals is the HTML report's), and sample
// generations are text,
// read back by TensorBoard's own reader (tests/cli/read_tensorboard.py in RLHF_PYTHON, which
// scripts/setup gives the `tensorboard` package).
TEST_F(RunLifecycle, TensorBoardHasEveryMetricAndTheSamples) {
  CliResult r = run_cli(
      args("ppo_tiny.json", {"--set", "train.max_steps=3", "--set", "logger.samples_per_step=2"}));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const fs::path run = dir_ / "runs" / "ppo_tiny";
  const auto board = read_board(run / "tensorboard", dir_ / "tensorboard.json");
  const auto metrics = read_jsonl((run / "metrics.jsonl").string());
  ASSERT_EQ(metrics.size(), 3u);
  // Every number of every record, nested ones as a/b/c tags. TensorBoard keeps scalars as
  // float32: a relative 1e-6 covers the rounding.
  size_t compared = 0;
  std::function<void(const nlohmann::json&, const std::string&, int)> check =
      [&](const nlohmann::json& v, const std::string& tag, int step) {
        if (v.is_object()) {
          for (const auto& [k, x] : v.items()) {
            if (k == "timeline") continue;  // intervals for the report's lanes, not scalars
            if (k != "histogram") {
              check(x, tag.empty() ? k : tag + "/" + k, step);
              continue;
            }
            ASSERT_TRUE(board["histograms"].contains(tag)) << tag;
            bool found = false;
            for (const auto& e : board["histograms"][tag])
              if (e[0] == step) {
                found = true;
                EXPECT_EQ(e[1].size(), x.size()) << tag << " at step " << step;
                for (size_t i = 0; i < x.size() && i < e[1].size(); ++i)
                  EXPECT_EQ(e[1][i].get<double>(), x[i].get<double>()) << tag << " bucket " << i;
              }
            EXPECT_TRUE(found) << tag << " at step " << step;
            ++compared;
          }
        } else if (v.is_array()) {
          for (size_t i = 0; i < v.size(); ++i) check(v[i], tag + "/" + std::to_string(i), step);
        } else if (v.is_number() && tag != "step") {
          ASSERT_TRUE(board["scalars"].contains(tag)) << tag;
          bool found = false;
          for (const auto& e : board["scalars"][tag])
            if (e[0] == step) {
              found = true;
              const double want = v.get<double>(), got = e[1].get<double>();
              EXPECT_NEAR(got, want, 1e-6 * std::abs(want) + 1e-30) << tag << " at step " << step;
            }
          EXPECT_TRUE(found) << tag << " at step " << step;
          ++compared;
        }
      };
  for (const auto& m : metrics) check(m, "", m["step"].get<int>());
  EXPECT_GT(compared, 3u * 30) << "reward, losses, times, memory...";
  // The samples: two per step in samples.jsonl and as a markdown table in the text tab.
  const auto samples = read_jsonl((run / "samples.jsonl").string());
  ASSERT_EQ(samples.size(), 6u);
  for (size_t i = 0; i < samples.size(); ++i) {
    EXPECT_EQ(samples[i]["step"], static_cast<int>(i / 2) + 1);
    for (const char* key : {"prompt", "response", "reward"}) EXPECT_TRUE(samples[i].contains(key));
  }
  ASSERT_TRUE(board["texts"].contains("samples")) << board["texts"].dump();
  ASSERT_EQ(board["texts"]["samples"].size(), 3u);
  const std::string table = board["texts"]["samples"][0][1];
  EXPECT_EQ(table.rfind("| prompt | response | reward |", 0), 0u) << table;
  EXPECT_TRUE(contains(table, "| " + samples[0]["prompt"].get<std::string>() + " |")) << table;

  // Off when asked.
  CliResult off = run_cli(args("ppo_tiny.json", {"--set", "train.max_steps=1", "--set",
                                                 "logger.tensorboard=false", "--set", "name=off"}));
  ASSERT_EQ(off.exit_code, 0) << off.err;
  EXPECT_FALSE(fs::exists(dir_ / "runs" / "off" / "tensorboard"));
}

}  // namespace
}  // namespace rlhf::test
