// End-to-end PPO jobs through the real `rlhf` binary with the rollout drawing ahead
// (algo.max_staleness > 0, issue 42): the staleness bound under in-flight updates and uneven
// response lengths, and nothing lost when a worker dies while later steps' samples are in
// flight. (The one-step schedule is ppo_algorithm_job_test.cpp's.)
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>

#include "test_paths.h"
#include "tests/ppo/ppo_job.h"
#include "tests/support/learning.h"
#include "tests/support/processes.h"
#include "tests/support/run_cli.h"

namespace rlhf::ppo {
namespace {

using namespace job_test;
using namespace std::chrono_literals;
using test::expect_learned;
using test::slurp;

// Bounded staleness with in-flight updates (issue 42): GRPO's example at algo.max_staleness
// 4 with partial rollouts, the rollout slowed to 8 sequences at a time (so it generates
// through the trainers' updates and syncs land between its decode steps) and sampling at
// T = 1.5 (uneven response lengths: the long tail), streaming (the reference scores each
// group as it ends, while the actor trains: the pipeline's calls and the step's side by
// side). Every step: no sample is more than 4 versions behind the policy it trains, no token
// more than the stalest sample, the samples with tokens of two versions or more are at most
// all of them, the histogram counts every sample once, and the rollout's newest version
// never passes the policy's. The letters task is still learned (expect_learned's margin).
TEST_F(PpoJob, BoundedStalenessHoldsWithInFlightUpdatesAndUnevenLengths) {
  const int64_t k = 4;
  Result r =
      run("stale4",
          {"--set", "algo.max_staleness=" + std::to_string(k), "--set", "rollout.max_num_seqs=8",
           "--set", "rollout.temperature=1.5", "--set", "rollout.streaming=true"},
          "examples/grpo_tiny.json");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  auto m = read_metrics(run_dir("stale4") / "metrics.jsonl");
  ASSERT_EQ(m.size(), 30u);
  expect_learned(m);
  int64_t most = 0;
  for (size_t i = 0; i < m.size(); ++i) {
    const json& stale = m[i]["staleness"];
    const int64_t max = stale["max"].get<int64_t>();
    EXPECT_LE(max, std::min<int64_t>(k, static_cast<int64_t>(i))) << "step " << i + 1;
    // A token lags no more than its sample's oldest token. (Not "token mean <= sample mean":
    // the token mean weighs long samples more, and a long sample may be the stalest.)
    EXPECT_LE(stale["token_mean"].get<double>(), static_cast<double>(max) + 1e-12)
        << "step " << i + 1;
    EXPECT_LE(stale["mixed"].get<int64_t>(), 64) << "step " << i + 1;
    int64_t counted = 0;
    for (const auto& c : stale["histogram"]) counted += c.get<int64_t>();
    EXPECT_EQ(counted, 64) << "step " << i + 1;
    EXPECT_EQ(static_cast<int64_t>(stale["histogram"].size()), max + 1) << "step " << i + 1;
    // The policy of step i + 1 is version i + 1 (the start-up sync is version 1).
    EXPECT_LE(m[i]["weight_version"].get<int64_t>(), static_cast<int64_t>(i) + 1)
        << "step " << i + 1;
    most = std::max(most, max);
  }
  EXPECT_GT(most, 0) << "the rollout never ran ahead of the trainers";
}

// Issue 42.1: streaming. ppo_tiny (actor, critic, reference, reward model, rollout) on-policy
// with rollout.streaming: every scoring group scores each prompt group as the rollout sends it
// back, in calls that take what arrived meanwhile, instead of the whole batch after
// generation. Generation is untouched (same seeds): samples and response lengths equal the
// unstreamed run's to the bit; what the scorers computed in other batches may differ by FP32
// rounding only: rewards (the reward model's), KL, losses and values within 1e-5.
TEST_F(PpoJob, StreamingScoresGroupsAsTheyComeAndMatchesTheUnstreamedRun) {
  const std::vector<std::string> common = {
      "--set", "train.max_steps=2", "--set", "actor.dtype=fp32", "--set", "ref.dtype=fp32",
      "--set", "critic.dtype=fp32", "--set", "reward.dtype=fp32"};
  Result plain = run("unstreamed", common);
  ASSERT_EQ(plain.exit_code, 0) << plain.out << plain.err;
  Result streamed = run("streamed", concat(common, {"--set", "rollout.streaming=true"}));
  ASSERT_EQ(streamed.exit_code, 0) << streamed.out << streamed.err;
  const auto a = read_metrics(run_dir("unstreamed") / "metrics.jsonl");
  const auto b = read_metrics(run_dir("streamed") / "metrics.jsonl");
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(b[i]["response_length"].get<double>(), a[i]["response_length"].get<double>());
    for (const char* key : {"reward_mean", "kl", "policy_loss", "value_loss", "entropy"})
      EXPECT_NEAR(b[i][key].get<double>(), a[i][key].get<double>(), 1e-5)
          << key << " at step " << i + 1;
  }
}

// Issue 42.6: nothing lost with the rollout drawing ahead. GRPO's example at max_staleness 4
// with partial rollouts and a checkpoint every 2 steps; once step 3 is logged the rollout
// worker is killed (SIGKILL) while it generates later steps' samples. Without restarts
// (fault.max_restarts 0) the job stops naming the rollout and its rank (exit 1, within 15 s);
// --resume continues from the newest
// checkpoint and draws again the samples that were drawn ahead (they are not in it):
// metrics.jsonl then holds every step 1..14 once, and step s has consumed 8 s prompts (none
// skipped, none taken twice).
TEST_F(PpoJob, AKilledRolloutStopsTheStaleJobAndResumeRedrawsTheSamplesInFlight) {
  const std::vector<std::string> args = {
      "run",   std::string(RLHF_SOURCE_DIR) + "/examples/grpo_tiny.json",
      "--set", "actor.model=" + (dir_ / "tiny").string(),
      "--set", "logger.run_dir=" + (dir_ / "runs").string(),
      "--set", "name=killed",
      "--set", "algo.max_staleness=4",
      "--set", "rollout.max_num_seqs=8",
      "--set", "ckpt.save_steps=2",
      "--set", "ckpt.export_hf=false",
      "--set", "train.max_steps=14",
      "--set", "fault.max_restarts=0"};
  const fs::path metrics = run_dir("killed") / "metrics.jsonl";
  {
    testing::RlhfProcess job(args, (dir_ / "killed-process").string());
    ASSERT_TRUE(testing::poll_until(
        [&] {  // whole lines only: the job may be writing the next one
          const std::string text = fs::exists(metrics) ? slurp(metrics) : std::string();
          return std::count(text.begin(), text.end(), '\n') >= 3;
        },
        120s))
        << job.err();
    int rollout_pid = -1;
    for (const auto& w : json::parse(slurp(run_dir("killed") / "workers.json")))
      if (w["role"] == "rollout") rollout_pid = w["pid"].get<int>();
    ASSERT_GT(rollout_pid, 0);
    ASSERT_EQ(::kill(rollout_pid, SIGKILL), 0);
    const auto status = job.wait(15s);
    ASSERT_TRUE(status.has_value()) << "the job did not stop after its rollout was killed";
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 1) << job.err();
    EXPECT_NE(job.err().find("worker rollout[0] killed by signal 9"), std::string::npos)
        << job.err();
  }
  std::vector<std::string> resume(args.begin(), args.end());
  resume.push_back("--resume");
  Result resumed = rlhf(resume);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out << resumed.err;
  std::smatch at;
  ASSERT_TRUE(std::regex_search(resumed.out, at, std::regex("resumed after step ([0-9]+)")))
      << resumed.out;
  EXPECT_GE(std::stoi(at[1]), 2);
  EXPECT_LT(std::stoi(at[1]), 14);
  const auto m = read_metrics(metrics);
  ASSERT_EQ(m.size(), 14u);
  for (size_t i = 0; i < m.size(); ++i) {
    EXPECT_EQ(m[i]["step"].get<int64_t>(), static_cast<int64_t>(i) + 1);
    EXPECT_EQ(m[i]["prompts_consumed"].get<int64_t>(), 8 * (static_cast<int64_t>(i) + 1))
        << "step " << i + 1;
    EXPECT_LE(m[i]["staleness"]["max"].get<int64_t>(), 4) << "step " << i + 1;
  }
}

}  // namespace
}  // namespace rlhf::ppo
