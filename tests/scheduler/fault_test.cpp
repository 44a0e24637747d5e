// Fault tolerance in the scheduler (issue 45) with real `rlhf worker` processes: a killed or
// stopped worker of a role with a revive is relaunched with its identity (new pid in
// workers.json, its old log kept), its micro batches run again and the gathered result is
// whole and in batch order; past fault.max_restarts the job stops naming every restart; a
// request nobody answers for fault.step_timeout_s is a hang naming each operation in hand;
// nothing is left running.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "scheduler/role_group.h"
#include "scheduler/scheduler.h"
#include "scheduler/worker_process.h"
#include "tests/support/processes.h"
#include "tests/support/scheduler_config.h"

namespace rlhf {
namespace {

using namespace std::chrono_literals;
using testing::pid_alive;
using testing::poll_until;

Message request(const std::string& op, nlohmann::json args = nlohmann::json::object()) {
  Message m;
  m.op = op;
  m.args = std::move(args);
  return m;
}

// Counts each rank's revivals; a revival pings the rank (its calls go straight to it).
struct Revivals {
  std::mutex mutex;
  std::map<int, int> of_rank;
  RoleGroup::Revive on(RoleGroup& g) {
    return [this, &g](int rank) {
      EXPECT_EQ(g.call(rank, request("ping")).args.at("rank"), rank);
      std::lock_guard<std::mutex> lock(mutex);
      ++of_rank[rank];
    };
  }
};

SchedulerConfig fault_config(const std::string& name, int max_restarts) {
  auto c = testing::scheduler_config(name);
  c.max_restarts = max_restarts;
  return c;
}

// `role`'s group of started scheduler `s`, its revivals counted by `revivals`.
RoleGroup& revived_group(Scheduler& s, Role role, Revivals& revivals) {
  s.start();
  RoleGroup& g = s.group(role);
  g.set_revive(revivals.on(g));
  return g;
}

int listed_pid(const Scheduler& s, size_t index) {
  std::ifstream in(std::filesystem::path(s.config().run_dir) / "workers.json");
  return nlohmann::json::parse(in).at(index).at("pid").get<int>();
}

void wait_registered(const Scheduler& s, size_t index) {
  ASSERT_TRUE(poll_until(
      [&] {
        return testing::read_file(s.workers()[index].log_path).find("registered with") !=
               std::string::npos;
      },
      20s));
}

TEST(Faults, AKilledWorkerIsRelaunchedAndItsMicroBatchesRunAgainInBatchOrder) {
  Scheduler s(fault_config("fault-kill", 3), testing::local_placement({{Role::kRollout, 3}}));
  Revivals revivals;
  RoleGroup& g = revived_group(s, Role::kRollout, revivals);
  const int old_pid = s.workers()[1].pid;
  const std::string log = s.workers()[1].log_path;
  wait_registered(s, 1);
  const auto rows = at::arange(24 * 3, at::kLong).reshape({24, 3});
  // 24 micro batches over 3 ranks, 2 in flight each (rank 1 takes 400 ms per call, rank 0
  // 800, rank 2 none): rank 1 dies with both of its calls in hand.
  std::thread killer([&] {
    std::this_thread::sleep_for(150ms);
    ::kill(old_pid, SIGKILL);
  });
  const Message out = g.scatter("echo", {{"rows", rows}}, 1, {{"delay_ms", 400}});
  killer.join();
  EXPECT_TRUE(at::equal(out.tensor("rows"), rows)) << "every row once, in batch order";
  EXPECT_EQ(revivals.of_rank, (std::map<int, int>{{1, 1}}));
  const auto restarts = s.restarts();
  ASSERT_EQ(restarts.size(), 1u);
  EXPECT_EQ(restarts[0].role, Role::kRollout);
  EXPECT_EQ(restarts[0].rank, 1);
  EXPECT_EQ(restarts[0].cause, "killed by signal 9 (SIGKILL)");
  EXPECT_GT(restarts[0].registered_s, 0);
  EXPECT_GE(restarts[0].ready_s, restarts[0].registered_s);
  const int new_pid = s.workers()[1].pid;
  EXPECT_NE(new_pid, old_pid);
  EXPECT_TRUE(pid_alive(new_pid));
  EXPECT_EQ(listed_pid(s, 1), new_pid) << "workers.json names the relaunched process";
  EXPECT_NE(testing::read_file(log + ".1").find("[rollout 1] registered with"), std::string::npos)
      << "the first process's log is kept";
  EXPECT_EQ(s.fault_counts()["worker"]["rollout"], 1);
  // The relaunched rank serves like the others.
  const auto info = g.call_all("info");
  EXPECT_EQ(info.at(1).args.at("pid").get<int>(), new_pid);
  const auto record = testing::read_file(s.config().run_dir + "/restarts.jsonl");
  EXPECT_NE(record.find("\"cause\":\"killed by signal 9 (SIGKILL)\""), std::string::npos) << record;
  s.shutdown();
  EXPECT_FALSE(pid_alive(old_pid));
  EXPECT_FALSE(pid_alive(new_pid));
}

TEST(Faults, AStoppedWorkerIsKilledAndRelaunchedAfterTheHeartbeatTimeout) {
  auto config = fault_config("fault-stop", 3);
  config.worker_timeout = 1500ms;
  Scheduler s(config, testing::local_placement({{Role::kRef, 2}}));
  Revivals revivals;
  RoleGroup& g = revived_group(s, Role::kRef, revivals);
  const int stopped = s.workers()[0].pid;
  wait_registered(s, 0);
  ASSERT_EQ(::kill(stopped, SIGSTOP), 0);  // alive, answering nothing: a hang
  const auto rows = at::arange(8, at::kLong).reshape({8, 1});
  const Message out = g.scatter("echo", {{"rows", rows}}, 1, {{"delay_ms", 50}});
  EXPECT_TRUE(at::equal(out.tensor("rows"), rows));
  const auto restarts = s.restarts();
  ASSERT_EQ(restarts.size(), 1u);
  EXPECT_EQ(restarts[0].cause, "stopped answering: no message for 1500 ms (killed)");
  EXPECT_EQ(revivals.of_rank, (std::map<int, int>{{0, 1}}));
  EXPECT_TRUE(poll_until([&] { return !pid_alive(stopped); }, 5s)) << "the stopped one is killed";
  s.shutdown();
}

TEST(Faults, RestartsPastTheBudgetStopTheJobNamingEveryRestart) {
  Scheduler s(fault_config("fault-budget", 1), testing::local_placement({{Role::kRollout, 2}}));
  Revivals revivals;
  RoleGroup& g = revived_group(s, Role::kRollout, revivals);
  const auto pids_before = std::vector<int>{s.workers()[0].pid, s.workers()[1].pid};
  wait_registered(s, 0);
  ASSERT_EQ(::kill(s.workers()[0].pid, SIGKILL), 0);
  // A call to the group waits for the relaunched rank and revives it first.
  ASSERT_TRUE(poll_until([&] { return s.incarnation(0) >= 1; }, 10s));
  EXPECT_EQ(g.call_all("ping").size(), 2u);
  EXPECT_EQ(revivals.of_rank[0], 1);
  wait_registered(s, 0);
  const int second = s.workers()[0].pid;
  ASSERT_EQ(::kill(second, SIGKILL), 0);
  std::string report;
  try {
    const auto t0 = testing::Clock::now();
    while (testing::Clock::now() - t0 < 10s) g.call_all("ping");
  } catch (const WorkerFailure& e) {
    report = e.what();
  }
  EXPECT_NE(report.find("worker rollout[0] killed by signal 9 (SIGKILL)"), std::string::npos)
      << report;
  EXPECT_NE(report.find("no restart left: fault.max_restarts 1 for rollout"), std::string::npos)
      << report;
  EXPECT_NE(report.find("restart of rollout[0] at"), std::string::npos) << report;
  s.shutdown();
  for (int pid : {pids_before[0], pids_before[1], second}) EXPECT_FALSE(pid_alive(pid)) << pid;
}

TEST(Faults, WithoutAReviveALostWorkerStillStopsTheJob) {
  Scheduler s(fault_config("fault-no-revive", 3), testing::local_placement({{Role::kActor, 2}}));
  s.start();
  wait_registered(s, 1);
  ASSERT_EQ(::kill(s.workers()[1].pid, SIGKILL), 0);
  EXPECT_THROW(
      {
        const auto t0 = testing::Clock::now();
        while (testing::Clock::now() - t0 < 10s) s.group(Role::kActor).call_all("ping");
      },
      WorkerFailure);
  EXPECT_TRUE(s.restarts().empty());
}

TEST(Faults, NoReplyForTheStepTimeoutIsAHangNamingEachOperationInHand) {
  auto config = fault_config("fault-hang", 3);
  config.progress_timeout = 1000ms;
  Scheduler s(config, testing::local_placement({{Role::kActor, 2}}));
  s.start();
  std::string report;
  const auto t0 = testing::Clock::now();
  try {  // rank 0 busy for 20 s (rank 1 answers at once): heartbeats go on, replies do not
    s.group(Role::kActor).call_all("echo", {{"delay_ms", 20000}});
  } catch (const WorkerFailure& e) {
    report = e.what();
  }
  EXPECT_LT(testing::Clock::now() - t0, 10s);
  EXPECT_NE(report.find("no request answered for 1 s (fault.step_timeout_s)"), std::string::npos)
      << report;
  EXPECT_NE(report.find("actor[0]: \"echo\" for "), std::string::npos) << report;
  EXPECT_EQ(report.find("actor[1]: \"echo\""), std::string::npos) << "it answered: " << report;
}

}  // namespace
}  // namespace rlhf
