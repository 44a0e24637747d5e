// The scheduler with real `rlhf worker` processes: bit-exact tensors through two role
// groups, in-order fan-out over three ranks, replicas of ranks that serve a micro batch
// together (tests/scheduler/replica_worker.cpp), error replies, failure reports for killed and
// silent workers within 5 s, refusal of strays without the token, and no process left over.
#include "scheduler/scheduler.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>

#include <chrono>
#include <map>
#include <set>

#include "actors/wire_version.h"
#include "scheduler/role_group.h"
#include "scheduler/worker_process.h"
#include "tests/support/processes.h"
#include "tests/support/scheduler_config.h"
#include "transport/channel.h"

namespace rlhf {
namespace {

using namespace std::chrono_literals;
using testing::pid_alive;
using testing::poll_until;

using testing::scheduler_config;

Message request(const std::string& op) {
  Message m;
  m.op = op;
  return m;
}

std::vector<int> pids_of(const Scheduler& s) {
  std::vector<int> pids;
  for (const auto& w : s.workers()) pids.push_back(w.pid);
  return pids;
}

void expect_all_gone(const std::vector<int>& pids) {
  for (int pid : pids) EXPECT_FALSE(pid_alive(pid)) << "worker pid " << pid << " survived";
}

std::vector<NamedTensor> mixed_tensors() {
  at::manual_seed(7);
  return {{"f32", at::randn({3, 17})},
          {"bf16", at::randn({2, 3, 5}).to(at::kBFloat16)},
          {"f16", at::randn({9}).to(at::kHalf)},
          {"f64", at::randn({4, 4}, at::kDouble)},
          {"i64", at::randint(-(int64_t{1} << 40), int64_t{1} << 40, {6}, at::kLong)},
          {"i32", at::randint(-1000, 1000, {2, 2, 2}, at::kInt)},
          {"u8", at::randint(0, 256, {33}, at::kByte)},
          {"mask", at::rand({5, 3}) > 0.5},
          {"scalar", at::tensor(2.5f)},
          {"big", at::randn({256, 1024})}};  // 1 MiB
}

TEST(Scheduler, TwoRoleJobExchangesTensorsBitExact) {
  Scheduler s(scheduler_config("two-role"),
              testing::local_placement({{Role::kActor, 1}, {Role::kCritic, 2}}));
  s.start();
  const auto pids = pids_of(s);
  const auto sent = mixed_tensors();
  for (Role role : {Role::kActor, Role::kCritic}) {
    auto replies = s.group(role).call_all("echo", {{"tag", "x"}}, sent);
    ASSERT_EQ(static_cast<int>(replies.size()), s.group(role).size());
    for (const auto& reply : replies) {
      EXPECT_EQ(reply.args.value("tag", ""), "x");
      for (const auto& t : sent) {
        SCOPED_TRACE(std::string(role_name(role)) + " " + t.name);
        const auto& got = reply.tensor(t.name);
        EXPECT_EQ(got.scalar_type(), t.tensor.scalar_type());
        EXPECT_EQ(got.sizes(), t.tensor.sizes());
        EXPECT_TRUE(at::equal(got, t.tensor));  // bit-exact: the bytes only travel
      }
    }
    // `info` ran in the launched processes, one per rank, with their devices.
    auto infos = s.group(role).call_all("info");
    for (size_t r = 0; r < infos.size(); ++r) {
      EXPECT_EQ(infos[r].args.at("rank").get<int>(), static_cast<int>(r));
      EXPECT_EQ(infos[r].args.at("role").get<std::string>(), role_name(role));
      EXPECT_GT(infos[r].args.at("peak_rss_bytes").get<int64_t>(), 0);
      bool launched = false;
      for (const auto& w : s.workers())
        launched |= w.pid == infos[r].args.at("pid").get<int>() && w.placement.role == role;
      EXPECT_TRUE(launched) << infos[r].args.dump();
    }
  }
  s.shutdown();
  expect_all_gone(pids);
  // Each worker's output went to its own log.
  EXPECT_NE(
      testing::read_file(s.config().run_dir + "/logs/critic-1.log").find("[critic 1] registered"),
      std::string::npos);
}

TEST(Scheduler, FanOutOverThreeRanksReturnsInBatchOrder) {
  auto config = scheduler_config("fan-out");
  config.max_inflight = 1;
  Scheduler s(config, testing::local_placement({{Role::kRef, 3}}));
  s.start();
  const auto rows = at::arange(13 * 4, at::kLong).reshape({13, 4});
  const auto values = at::randn({13});
  // delay_ms makes rank 0 answer last, so arrival order differs from batch order.
  Message out = s.group(Role::kRef)
                    .scatter("echo", {{"rows", rows}, {"values", values}}, 2, {{"delay_ms", 40}});
  EXPECT_TRUE(at::equal(out.tensor("rows"), rows));
  EXPECT_TRUE(at::equal(out.tensor("values"), values));
  const auto& micro = out.args.at("micro_batches");
  ASSERT_EQ(micro.size(), 7u);  // ceil(13 / 2)
  std::set<int> ranks;
  for (const auto& m : micro) ranks.insert(m.at("rank").get<int>());
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2}));
}

// kEqualPerRank (for ops with collectives, like a ZeRO-3 forward): 7 micro batches over 3
// ranks become 9 calls, 3 per rank (the last micro batch repeated twice); the gathered
// result still holds each row once, in batch order.
TEST(Scheduler, EqualPerRankDispatchGivesEveryRankTheSameNumberOfCalls) {
  Scheduler s(scheduler_config("equal-per-rank"), testing::local_placement({{Role::kActor, 3}}));
  s.start();
  const auto rows = at::arange(13 * 4, at::kLong).reshape({13, 4});
  Message out = s.group(Role::kActor)
                    .scatter("echo", {{"rows", rows}}, 2, {{"delay_ms", 20}}, std::nullopt,
                             Dispatch::kEqualPerRank);
  EXPECT_TRUE(at::equal(out.tensor("rows"), rows));
  const auto& micro = out.args.at("micro_batches");
  ASSERT_EQ(micro.size(), 7u);
  for (size_t c = 0; c < micro.size(); ++c)
    EXPECT_EQ(micro[c].at("rank").get<int>(), static_cast<int>(c % 3)) << "round robin";
  // The next echo on each rank is its 4th: 3 calls each before it.
  for (const auto& reply : s.group(Role::kActor).call_all("echo"))
    EXPECT_EQ(reply.args.at("served").get<int64_t>(), 4) << "rank " << reply.args.at("rank");
  // One micro batch over 3 ranks: each rank still gets exactly one call.
  Message one = s.group(Role::kActor)
                    .scatter("echo", {{"rows", rows}}, 64, nlohmann::json::object(), std::nullopt,
                             Dispatch::kEqualPerRank);
  EXPECT_TRUE(at::equal(one.tensor("rows"), rows));
  for (const auto& reply : s.group(Role::kActor).call_all("echo"))
    EXPECT_EQ(reply.args.at("served").get<int64_t>(), 6) << "rank " << reply.args.at("rank");
}

// Replica dispatch (a tensor-parallel rollout engine: rollout.tensor_parallel_size) with the
// helper whose "replica_sum" all-reduces over its replica's Gloo group, so it completes only
// when every rank of the replica got the same micro batch at the same time.
SchedulerConfig replica_config(const std::string& name) {
  auto c = scheduler_config(name);
  c.worker_program = std::string(RLHF_BINARY_DIR) + "/tests/scheduler/rlhf_replica_worker";
  c.worker_args = {};
  return c;
}

// A worker joined by --join-file holds the token in its config only; the collective groups it
// opens must still prove it to the job's rendezvous store (Worker::run exports it).
TEST(Scheduler, AWorkerWithTheTokenInItsConfigOnlyStillJoinsItsGroup) {
  auto config = replica_config("token-in-config");
  config.worker_args = {"--token-in-config-only"};
  Scheduler s(config, testing::local_placement({{Role::kRollout, 2}}));
  s.start();
  const nlohmann::json args = {{"store_path", s.rendezvous("token")}, {"ranks_per_replica", 2}};
  const auto rows = at::arange(8, at::kLong).reshape({2, 4});
  const auto replies = s.group(Role::kRollout).call_all("replica_sum", args, {{"rows", rows}});
  ASSERT_EQ(replies.size(), 2u);
  for (const auto& r : replies)  // both ranks held the same rows: the sum is twice their own
    EXPECT_EQ(r.tensor("sum")[0].item<double>(), 2.0 * rows.sum().item<double>());
}

// 4 ranks in replicas of 2: 7 micro batches go to the least-loaded replica, each to both of
// its ranks; the gathered rows are the batch in order, each micro batch's reply is its
// replica's first rank's (0 or 2), and both ranks of a replica served the same calls.
TEST(Scheduler, ReplicasOfTwoRanksServeEachMicroBatchTogether) {
  auto config = replica_config("replicas");
  config.max_inflight = 1;
  Scheduler s(config, testing::local_placement({{Role::kRollout, 4}}));
  s.start();
  RoleGroup& g = s.group(Role::kRollout);
  EXPECT_THROW(g.set_ranks_per_replica(3), InputError);
  g.set_ranks_per_replica(2);
  EXPECT_EQ(g.replicas(), 2);
  const auto rows = at::arange(13 * 4, at::kLong).reshape({13, 4});
  const nlohmann::json args = {{"store_path", s.rendezvous("replicas")}, {"ranks_per_replica", 2}};
  Message out = g.scatter("replica_sum", {{"rows", rows}}, 2, args);
  EXPECT_TRUE(at::equal(out.tensor("rows"), rows));
  // Each micro batch's all-reduced sum is twice its own: both ranks held the same rows.
  const auto sum = out.tensor("sum");
  for (int64_t c = 0; c < 7; ++c) {
    const int64_t begin = 2 * c, len = std::min<int64_t>(2, 13 - begin);
    EXPECT_EQ(sum[begin].item<double>(), 2.0 * rows.narrow(0, begin, len).sum().item<double>())
        << "micro batch " << c;
  }
  const auto& micro = out.args.at("micro_batches");
  ASSERT_EQ(micro.size(), 7u);  // ceil(13 / 2)
  std::map<int, int> calls_of_replica;
  for (const auto& m : micro) {
    const int rank = m.at("rank").get<int>();
    EXPECT_TRUE(rank == 0 || rank == 2) << "kept reply from rank " << rank;
    ++calls_of_replica[m.at("replica").get<int>()];
  }
  EXPECT_EQ(calls_of_replica.size(), 2u) << "both replicas served";
  // kEqualPerRank counts calls per replica: 3 micro batches over 2 replicas make 4 calls.
  Message even =
      g.scatter("replica_sum", {{"rows", rows}}, 5, args, std::nullopt, Dispatch::kEqualPerRank);
  EXPECT_TRUE(at::equal(even.tensor("rows"), rows));
  EXPECT_EQ(even.args.at("micro_batches").size(), 3u);
  // Every rank once more (call_all): each rank of replica u has served the 7 micro batches'
  // share of u, 2 equal calls and this one; both ranks of a replica served alike.
  const auto replies = g.call_all("replica_sum", args, {{"rows", rows}});
  ASSERT_EQ(replies.size(), 4u);
  std::vector<int64_t> served;
  for (const auto& r : replies) served.push_back(r.args.at("served").get<int64_t>());
  for (int u = 0; u < 2; ++u) {
    EXPECT_EQ(served[2 * u], calls_of_replica[u] + 2 + 1) << "replica " << u;
    EXPECT_EQ(served[2 * u + 1], served[2 * u]) << "replica " << u;
  }
}

// An error from the replica's second rank is reported naming that rank (its first rank
// answered fine); a rank whose integer outputs differ from its first rank's is named too.
TEST(Scheduler, ReplicaErrorsAndDivergenceNameTheRank) {
  Scheduler s(replica_config("replica-errors"), testing::local_placement({{Role::kRollout, 4}}));
  s.start();
  RoleGroup& g = s.group(Role::kRollout);
  g.set_ranks_per_replica(2);
  const auto rows = at::arange(8, at::kLong).reshape({4, 2});
  nlohmann::json args = {
      {"store_path", s.rendezvous("replica-errors")}, {"ranks_per_replica", 2}, {"fail_rank", 3}};
  try {
    g.scatter("replica_sum", {{"rows", rows}}, 1, args, std::nullopt, Dispatch::kEqualPerRank);
    FAIL() << "expected an error";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "rollout[3] operation \"replica_sum\" failed: failing on purpose (fail_rank)"),
              std::string::npos)
        << e.what();
  }
  args.erase("fail_rank");
  args["diverge_rank"] = 1;
  try {
    g.scatter("replica_sum", {{"rows", rows}}, 1, args, std::nullopt, Dispatch::kEqualPerRank);
    FAIL() << "expected an error";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("rollout[1] operation \"replica_sum\": replied a "
                                         "different \"rows\" than rollout[0]"),
              std::string::npos)
        << e.what();
  }
}

TEST(Scheduler, ErrorReplyNamesTheRankAndTheWorkerKeepsServing) {
  Scheduler s(scheduler_config("error-reply"), testing::local_placement({{Role::kReward, 2}}));
  s.start();
  try {
    s.group(Role::kReward).call(1, request("no_such_op"));
    FAIL() << "expected an error";
  } catch (const RuntimeError& e) {
    EXPECT_NE(
        std::string(e.what()).find("reward[1] operation \"no_such_op\" failed: unknown operation"),
        std::string::npos)
        << e.what();
  }
  EXPECT_EQ(s.group(Role::kReward).call_all("ping").size(), 2u);
}

TEST(Scheduler, RequestPastItsDeadlineFailsWithoutStoppingTheJob) {
  Scheduler s(scheduler_config("timeout"), testing::local_placement({{Role::kActor, 2}}));
  s.start();
  Message slow = request("echo");
  slow.args = {{"delay_ms", 3000}};  // rank 0 of 2 sleeps 3 s
  try {
    s.group(Role::kActor).call(0, slow, 300ms);
    FAIL() << "expected a timeout";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("operation \"echo\" on actor[0]"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("no reply before its deadline"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(s.group(Role::kActor).call(1, request("ping")).args.at("rank"), 1);
}

// Issue 42.4: a worker is busy while it has a request in hand. By hand: two overlapping
// requests count their union once; a gap between requests is idle; an open one counts up to
// the reading.
TEST(BusyClock, CountsTheUnionOfEachWorkersRequests) {
  using C = BusyClock::Clock;
  const C::time_point t0 = C::now();
  auto at = [&](double s) {
    return t0 + std::chrono::duration_cast<C::duration>(std::chrono::duration<double>(s));
  };
  BusyClock clock(2);
  clock.started(0, at(0));
  clock.started(0, at(1));  // queued behind the first
  clock.finished(0, at(2));
  clock.finished(0, at(3));  // busy 0..3
  clock.started(0, at(5));
  clock.finished(0, at(6));  // + 5..6
  clock.started(1, at(4));   // still open
  clock.finished(1, at(4));  // then answered at once, then a stray answer: ignored
  clock.finished(1, at(9));
  clock.started(1, at(7));
  const auto s = clock.seconds(at(10));
  EXPECT_NEAR(s[0], 4.0, 1e-9);
  EXPECT_NEAR(s[1], 3.0, 1e-9);
}

// The scheduler's reading on real workers: rank 0 of the actor sleeps 0.5 s in its request
// (echo's delay_ms), rank 1 answers at once, the rollout gets nothing. Rank 0's busy time is
// at least the sleep and at most the sleep plus the round trip (2 s of slack for a loaded
// 2-core machine); the rollout's is exactly 0.
TEST(Scheduler, BusySecondsCountEachWorkersRequestsInHand) {
  Scheduler s(scheduler_config("busy"),
              testing::local_placement({{Role::kActor, 2}, {Role::kRollout, 1}}));
  s.start();
  const std::vector<double> before = s.busy_seconds();
  ASSERT_EQ(before.size(), 3u);
  Message slow = request("echo");
  slow.args = {{"delay_ms", 500}};
  const auto t0 = std::chrono::steady_clock::now();
  s.group(Role::kActor).call_all(slow.op, slow.args);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::vector<double> after = s.busy_seconds();
  double actor0 = -1, actor1 = -1, rollout = -1;
  for (size_t i = 0; i < after.size(); ++i) {
    const auto& p = s.workers()[i].placement;
    (p.role == Role::kRollout ? rollout : p.rank == 0 ? actor0 : actor1) = after[i] - before[i];
  }
  EXPECT_GE(actor0, 0.5);
  EXPECT_LE(actor0, wall + 1e-3);
  EXPECT_LT(actor0, 2.5);
  EXPECT_LT(actor1, actor0 - 0.4);
  EXPECT_EQ(rollout, 0.0);
}

TEST(Scheduler, KilledWorkerIsReportedWithinFiveSeconds) {
  Scheduler s(scheduler_config("kill-9"),
              testing::local_placement({{Role::kActor, 2}, {Role::kCritic, 1}}));
  s.start();
  const auto pids = pids_of(s);
  const int victim = s.workers()[1].pid;  // actor rank 1
  // Its registration line is in the log once it has processed the scheduler's answer.
  ASSERT_TRUE(poll_until(
      [&] {
        return testing::read_file(s.workers()[1].log_path).find("registered with") !=
               std::string::npos;
      },
      10s));
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  const auto t0 = testing::Clock::now();
  std::string report;
  try {
    while (testing::Clock::now() - t0 < 10s) s.group(Role::kCritic).call_all("ping");
  } catch (const WorkerFailure& e) {
    report = e.what();
  }
  const auto elapsed = testing::Clock::now() - t0;
  EXPECT_LT(elapsed, 5s) << "the issue's bound on detection";
  EXPECT_NE(report.find("worker actor[1] killed by signal 9 (SIGKILL)"), std::string::npos)
      << report;
  EXPECT_NE(report.find("role actor, rank 1 of 2, host 127.0.0.1 (node local), device cpu:1"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("| [actor 1] registered with"), std::string::npos) << report;  // log tail
  s.shutdown();
  expect_all_gone(pids);
}

TEST(Scheduler, SilentWorkerIsDetectedAndKilled) {
  auto config = scheduler_config("silent");
  config.worker_timeout = 1500ms;
  Scheduler s(config, testing::local_placement({{Role::kRollout, 2}}));
  s.start();
  const auto pids = pids_of(s);
  ASSERT_EQ(::kill(s.workers()[0].pid, SIGSTOP), 0);  // alive but answering nothing
  const auto t0 = testing::Clock::now();
  std::string report;
  try {
    s.group(Role::kRollout).call(0, request("ping"));
  } catch (const WorkerFailure& e) {
    report = e.what();
  }
  EXPECT_LT(testing::Clock::now() - t0, 5s);
  EXPECT_NE(report.find("worker rollout[0] stopped answering: no message for 1500 ms (killed)"),
            std::string::npos)
      << report;
  s.shutdown();
  expect_all_gone(pids);
}

// The whole machine stalls (a VM's vCPUs descheduled, a suspend, a swap storm): this process
// and both workers stop for 3 s, twice worker_timeout. Nobody was silent on their own account,
// so both sides credit the gap and the job goes on; a worker silent while the scheduler runs is
// still caught (SilentWorkerIsDetectedAndKilled).
TEST(Scheduler, AStallOfTheWholeMachineIsNotReportedAsSilentWorkers) {
  auto config = scheduler_config("stall");
  config.worker_timeout = 1500ms;
  Scheduler s(config, testing::local_placement({{Role::kRollout, 2}}));
  s.start();
  const auto pids = pids_of(s);
  std::string everyone = std::to_string(::getpid());
  for (int pid : pids) everyone += " " + std::to_string(pid);
  // A shell outside the stall stops everyone, this process included, and continues them.
  const std::string script = "kill -STOP " + everyone + "; sleep 3; kill -CONT " + everyone;
  const char* argv[] = {"/bin/sh", "-c", script.c_str(), nullptr};
  const auto t0 = testing::Clock::now();
  pid_t stopper = 0;
  ASSERT_EQ(::posix_spawn(&stopper, "/bin/sh", nullptr, nullptr, const_cast<char**>(argv), environ),
            0);
  int status = 0;
  ASSERT_EQ(::waitpid(stopper, &status, 0), stopper);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  ASSERT_GE(testing::Clock::now() - t0, 3s) << "the stall did not happen";
  for (const auto& reply : s.group(Role::kRollout).call_all("ping"))
    EXPECT_EQ(reply.kind, MessageKind::kReply);
  s.shutdown();
  expect_all_gone(pids);
}

Message registration(const std::string& token, const std::string& role, int rank, int64_t pid,
                     const std::string& wire = wire_version()) {
  Message m;
  m.kind = MessageKind::kRegister;
  m.args = {{"token", token}, {"role", role}, {"rank", rank}, {"pid", pid}, {"wire", wire}};
  return m;
}

std::string refusal(Channel& stray, const Message& hello) {
  stray.send(hello);
  auto frames = stray.recv(10000ms);
  if (!frames) return "no answer";
  Message answer = decode(std::move(*frames), MessageLimits{});
  return answer.kind == MessageKind::kError ? answer.error : "accepted";
}

TEST(Scheduler, ProcessWithoutTheTokenIsRefused) {
  Scheduler s(scheduler_config("token"), testing::local_placement({{Role::kActor, 1}}));
  s.start();
  zmq::context_t ctx(1);
  Channel stray(ctx, zmq::socket_type::dealer, 0ms);
  stray.connect(s.endpoint());
  EXPECT_NE(refusal(stray, registration("not-the-token", "actor", 0, getpid()))
                .find("wrong or missing job token"),
            std::string::npos);
  EXPECT_NE(refusal(stray, request("echo")).find("a request from a peer that has not registered"),
            std::string::npos);
  // Even with the token, a process other than the launched worker cannot take its place.
  EXPECT_NE(
      refusal(stray, registration(s.token(), "actor", 0, getpid())).find("already registered"),
      std::string::npos);
  EXPECT_NE(
      refusal(stray, registration(s.token(), "critic", 0, getpid())).find("no worker critic[0]"),
      std::string::npos);
  // A worker of another build (another wire version, or none) is refused by name.
  EXPECT_NE(refusal(stray, registration(s.token(), "actor", 0, getpid(), "1-00000000deadbeef"))
                .find("actor rank 0 on ? speaks wire version 1-00000000deadbeef, this driver " +
                      wire_version() + ": a worker from another build of rlhf"),
            std::string::npos);
  Message unversioned = registration(s.token(), "actor", 0, getpid());
  unversioned.args.erase("wire");
  EXPECT_NE(refusal(stray, unversioned).find("speaks wire version (none)"), std::string::npos);
  EXPECT_EQ(s.refused_registrations(), 6);

  // A real worker process started with a wrong token is refused and exits 1.
  auto placement = testing::local_placement({{Role::kActor, 1}}).workers[0];
  WorkerProcess impostor(
      placement, RLHF_CLI_PATH, {"worker"},
      {{kEnvScheduler, s.endpoint()}, {kEnvToken, "0123"}, {kEnvRunDir, s.config().run_dir}},
      s.config().run_dir + "/impostor.log");
  std::optional<int> status;
  ASSERT_TRUE(poll_until([&] { return (status = impostor.poll_exit()).has_value(); }, 30s));
  EXPECT_EQ(describe_wait_status(*status), "exit code 1");
  EXPECT_NE(testing::read_file(impostor.log_path())
                .find("refused registration: registration refused: wrong"),
            std::string::npos)
      << testing::read_file(impostor.log_path());
  EXPECT_EQ(s.refused_registrations(), 7);
  EXPECT_EQ(s.group(Role::kActor).call_all("ping").size(), 1u);  // the job is unaffected
}

// A driver whose contract differs from its workers' (here: the scheduler expects another
// wire version than the `rlhf` binary states) never gets a worker that would misread its
// requests: the real worker is refused at registration, exits 1, and says why in its log.
TEST(Scheduler, AWorkerOfAnotherWireVersionIsRefusedByName) {
  auto config = scheduler_config("wire-version");
  config.wire_version = std::to_string(kWireVersion) + "-0123456789abcdef";
  config.register_timeout = 30s;
  Scheduler s(config, testing::local_placement({{Role::kActor, 1}}));
  try {
    s.start();
    FAIL() << "a worker of another wire version registered";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("actor"), std::string::npos) << e.what();
  }
  const std::string log = testing::read_file(config.run_dir + "/logs/actor-0.log");
  EXPECT_NE(log.find("registration refused: actor rank 0 on "), std::string::npos) << log;
  EXPECT_NE(log.find("speaks wire version " + wire_version() + ", this driver " +
                     config.wire_version + ": a worker from another build of rlhf"),
            std::string::npos)
      << log;
  EXPECT_EQ(s.refused_registrations(), 1);
}

}  // namespace
}  // namespace rlhf
