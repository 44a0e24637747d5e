// `rlhf run` end to end (real binary, real worker processes): the smoke job succeeds; a
// kill -9 of a worker stops the job within 5 s with exit 1 and a report naming it; SIGTERM
// and a killed scheduler leave no worker process behind.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tests/support/processes.h"

namespace rlhf {
namespace {

using namespace std::chrono_literals;
using testing::pid_alive;
using testing::poll_until;
using testing::read_file;

struct RunningJob {
  std::string dir;
  std::unique_ptr<testing::RlhfProcess> run;
  std::vector<int> pids;  // workers, from workers.json
  std::vector<std::string> logs;
};

// Starts `rlhf run` on the 5-role tiny example with many smoke rounds (so it is still running
// when the test acts), and waits until every worker has logged its registration.
RunningJob start_job(const std::string& name, int rounds) {
  RunningJob job;
  job.dir = testing::fresh_run_dir(name);
  job.run = std::make_unique<testing::RlhfProcess>(
      std::vector<std::string>{"run", std::string(RLHF_SOURCE_DIR) + "/examples/ppo_tiny.json",
                               "--set", "logger.run_dir=" + job.dir, "--set", "name=job",
                               // a reward model instead of the example's rule: five roles
                               "--set", "reward.rule=", "--set", "reward.model=unused",
                               "--smoke-rounds", std::to_string(rounds)},
      job.dir);
  const std::string listing = job.dir + "/job/workers.json";
  EXPECT_TRUE(poll_until([&] { return !read_file(listing).empty(); }, 30s)) << job.run->err();
  auto workers = nlohmann::json::parse(read_file(listing), nullptr, false);
  if (workers.is_discarded()) return job;
  for (const auto& w : workers) {
    job.pids.push_back(w.at("pid").get<int>());
    job.logs.push_back(w.at("log").get<std::string>());
  }
  EXPECT_TRUE(poll_until(
      [&] {
        for (const auto& log : job.logs)
          if (read_file(log).find("registered with") == std::string::npos) return false;
        return true;
      },
      60s));
  return job;
}

void expect_all_gone(const std::vector<int>& pids) {
  for (int pid : pids) EXPECT_FALSE(pid_alive(pid)) << "worker pid " << pid << " survived the job";
}

TEST(RunCommand, SmokeJobSucceedsAndStopsItsWorkers) {
  RunningJob job = start_job("run-ok", 3);
  auto status = job.run->wait(60s);
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << job.run->err();
  EXPECT_NE(job.run->out().find("smoke driver: 5 workers registered"), std::string::npos)
      << job.run->out();
  EXPECT_NE(job.run->out().find("rollout: ping all 1 ranks"), std::string::npos);
  EXPECT_NE(job.run->out().find("smoke driver: ok"), std::string::npos);
  ASSERT_EQ(job.pids.size(), 5u);
  expect_all_gone(job.pids);
}

TEST(RunCommand, KilledWorkerStopsTheJobWithinFiveSeconds) {
  RunningJob job = start_job("run-kill-9", 1000000);
  ASSERT_EQ(job.pids.size(), 5u);
  ASSERT_EQ(::kill(job.pids[1], SIGKILL), 0);  // critic rank 0 (roles in kAllRoles order)
  const auto t0 = testing::Clock::now();
  auto status = job.run->wait(15s);
  ASSERT_TRUE(status.has_value()) << "rlhf run did not stop after a worker was killed";
  EXPECT_LT(testing::Clock::now() - t0, 5s) << "the issue's bound: detected, reported and stopped";
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 1);
  const std::string err = job.run->err();
  EXPECT_NE(err.find("job failed: worker critic[0] killed by signal 9 (SIGKILL)"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("role critic, rank 0 of 1, host 127.0.0.1 (node local), device cpu:1"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("| [critic 0] registered with"), std::string::npos) << err;
  expect_all_gone(job.pids);
}

TEST(RunCommand, SigtermLeavesNoOrphans) {
  RunningJob job = start_job("run-sigterm", 1000000);
  ASSERT_EQ(job.pids.size(), 5u);
  ASSERT_EQ(::kill(job.run->pid(), SIGTERM), 0);
  auto status = job.run->wait(20s);
  ASSERT_TRUE(status.has_value());
  // 128 + SIGTERM (15), as a shell reports a process it terminated.
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 143) << *status;
  EXPECT_NE(job.run->err().find("interrupted by SIGTERM"), std::string::npos) << job.run->err();
  expect_all_gone(job.pids);
  // Workers were stopped in order (shutdown message), not killed.
  EXPECT_NE(read_file(job.logs[0]).find("shutdown requested"), std::string::npos);
}

TEST(RunCommand, WorkersDieWithAKilledScheduler) {
  RunningJob job = start_job("run-scheduler-killed", 1000000);
  ASSERT_EQ(job.pids.size(), 5u);
  ASSERT_EQ(::kill(job.run->pid(), SIGKILL), 0);  // no chance to clean up
  ASSERT_TRUE(job.run->wait(10s).has_value());
  EXPECT_TRUE(poll_until(
      [&] {
        for (int pid : job.pids)
          if (pid_alive(pid)) return false;
        return true;
      },
      10s));
}

}  // namespace
}  // namespace rlhf
