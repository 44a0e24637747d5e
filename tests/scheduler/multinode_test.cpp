// Workers that join by hand (`rlhf worker --connect`, cluster.launcher manual) over TCP on
// loopback: they get their place from the scheduler and serve it; a wrong token is refused
// with a clear error; workers that never come are named; a joined worker that dies stops
// the job naming its host; CURVE encryption when libzmq has it. Also the Slurm launcher's
// pure parts: hostlist expansion and the srun step.
#include <gtest/gtest.h>
#include <zmq.h>

#include <algorithm>
#include <fstream>
#include <future>
#include <nlohmann/json.hpp>

#include "core/errors.h"
#include "core/spec.h"
#include "scheduler/role_group.h"
#include "scheduler/scheduler.h"
#include "scheduler/slurm_launcher.h"
#include "scheduler/worker_process.h"
#include "tests/scheduler/netns_support.h"
#include "tests/support/processes.h"
#include "tests/support/scheduler_config.h"

namespace rlhf {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;
using testing::poll_until;
using testing::RlhfProcess;

SchedulerConfig manual_config(const std::string& name) {
  SchedulerConfig c = testing::scheduler_config(name);
  c.launcher = LauncherKind::kManual;
  return c;
}

// The endpoint rlhf run published in join.json (written before it waits for workers).
nlohmann::json wait_for_join_file(const std::string& run_dir) {
  const fs::path path = fs::path(run_dir) / "join.json";
  EXPECT_TRUE(poll_until([&] { return fs::exists(path) && fs::file_size(path) > 0; }, 30s));
  return nlohmann::json::parse(testing::read_file(path.string()));
}

// `rlhf worker --connect` with its output in its own directory.
std::unique_ptr<RlhfProcess> join(const std::string& run_dir, const std::string& name,
                                  std::vector<std::string> extra) {
  const std::string dir = (fs::path(run_dir) / ("joiner-" + name)).string();
  fs::create_directories(dir);
  const auto endpoint = wait_for_join_file(run_dir).at("endpoint").get<std::string>();
  std::vector<std::string> args = {"worker", "--connect", endpoint};
  args.insert(args.end(), extra.begin(), extra.end());
  return std::make_unique<RlhfProcess>(args, dir);
}

std::string join_file(const std::string& run_dir) {
  return (fs::path(run_dir) / "join.json").string();
}

TEST(HandJoin, WorkersJoinOverTcpTakeTheirPlacesAndStopWithTheJob) {
  Scheduler s(manual_config("hand-join"),
              testing::local_placement({{Role::kActor, 2}, {Role::kCritic, 1}}));
  auto started = std::async(std::launch::async, [&] { s.start(); });
  const std::string run = s.config().run_dir;
  wait_for_join_file(run);
  EXPECT_EQ(fs::status(join_file(run)).permissions() & fs::perms::others_read, fs::perms::none)
      << "join.json holds the token: owner-only";
  // Two ask for a place, the last takes whatever is free (after them, or it could take
  // one of theirs first).
  auto a = join(run, "a", {"--join-file", join_file(run), "--role", "actor", "--rank", "1"});
  auto b = join(run, "b", {"--join-file", join_file(run), "--role", "critic"});
  ASSERT_TRUE(poll_until(
      [&] {
        return a->err().find("registered") != std::string::npos &&
               b->err().find("registered") != std::string::npos;
      },
      60s))
      << a->err() << b->err();
  auto c = join(run, "c", {"--join-file", join_file(run)});
  ASSERT_EQ(started.wait_for(60s), std::future_status::ready) << a->err() << b->err() << c->err();
  started.get();
  EXPECT_EQ(s.endpoint().rfind("tcp://127.0.0.1:", 0), 0u) << s.endpoint();
  // Each place is served once, with its own identity.
  for (Role role : {Role::kActor, Role::kCritic}) {
    const auto replies = s.group(role).call_all("info");
    for (int rank = 0; rank < s.group(role).size(); ++rank) {
      EXPECT_EQ(replies[rank].args.value("role", ""), role_name(role));
      EXPECT_EQ(replies[rank].args.value("rank", -1), rank);
    }
  }
  const auto echoed =
      s.group(Role::kActor)
          .call_all("echo", {{"tag", "tcp"}}, {{"x", at::arange(1000, at::kFloat)}});
  for (const auto& r : echoed) EXPECT_TRUE(at::equal(r.tensor("x"), at::arange(1000, at::kFloat)));
  EXPECT_NE(a->err().find("[actor 1] registered"), std::string::npos) << a->err();
  EXPECT_NE(b->err().find("[critic 0] registered"), std::string::npos) << b->err();
  EXPECT_NE(c->err().find("[actor 0] registered"), std::string::npos) << c->err();
  s.shutdown();
  for (auto* w : {a.get(), b.get(), c.get()}) {
    const auto status = w->wait(10s);
    ASSERT_TRUE(status) << "a joined worker kept running after the job stopped";
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << w->err();
  }
}

TEST(HandJoin, WrongTokenIsRefusedWithAClearError) {
  auto config = manual_config("wrong-token");
  config.register_timeout = 20s;
  Scheduler s(config, testing::local_placement({{Role::kActor, 1}}));
  auto started = std::async(std::launch::async, [&] {
    try {
      s.start();
    } catch (const std::exception&) {
    }
  });
  const std::string bad = (fs::path(config.run_dir) / "bad.json").string();
  std::ofstream(bad) << R"({"token": "0123456789abcdef0123456789abcdef"})";
  auto stray = join(config.run_dir, "stray", {"--join-file", bad});
  const auto status = stray->wait(30s);
  ASSERT_TRUE(status) << "a worker with a wrong token kept waiting";
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) != 0);
  EXPECT_NE(stray->err().find("refused registration: registration refused: wrong or missing job "
                              "token"),
            std::string::npos)
      << stray->err();
  EXPECT_EQ(s.refused_registrations(), 1);
  // The job still takes the right worker afterwards.
  auto good = join(config.run_dir, "good", {"--join-file", join_file(config.run_dir)});
  ASSERT_EQ(started.wait_for(60s), std::future_status::ready);
  EXPECT_EQ(s.group(Role::kActor).call_all("ping").size(), 1u);
}

TEST(HandJoin, WorkersThatNeverCameAreNamed) {
  auto config = manual_config("never-came");
  config.register_timeout = 1500ms;
  Scheduler s(config, testing::local_placement({{Role::kActor, 1}, {Role::kRollout, 2}}));
  try {
    s.start();
    FAIL() << "started without its workers";
  } catch (const WorkerFailure& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("never joined within 1 s"), std::string::npos) << what;
    for (const char* w : {"actor[0] (node local, host 127.0.0.1)", "rollout[0]", "rollout[1]"})
      EXPECT_NE(what.find(w), std::string::npos) << w << " not named in: " << what;
  }
}

TEST(HandJoin, AJoinedWorkerThatDiesStopsTheJobNamingItsHost) {
  Scheduler s(manual_config("joined-dies"), testing::local_placement({{Role::kActor, 2}}));
  auto started = std::async(std::launch::async, [&] { s.start(); });
  const std::string run = s.config().run_dir;
  auto a = join(run, "a", {"--join-file", join_file(run), "--role", "actor", "--rank", "0"});
  auto b = join(run, "b", {"--join-file", join_file(run), "--role", "actor", "--rank", "1"});
  ASSERT_EQ(started.wait_for(60s), std::future_status::ready);
  started.get();
  ASSERT_EQ(::kill(b->pid(), SIGKILL), 0);
  const auto killed = testing::Clock::now();
  try {
    s.group(Role::kActor).call_all("echo", {{"delay_ms", 4000}});
    FAIL() << "the job went on without actor[1]";
  } catch (const WorkerFailure& e) {
    EXPECT_LT(testing::Clock::now() - killed, 5s) << "noticed too late";
    const std::string what = e.what();
    EXPECT_NE(what.find("worker actor[1] stopped answering"), std::string::npos) << what;
    EXPECT_NE(what.find("host 127.0.0.1"), std::string::npos) << what;
    EXPECT_NE(what.find("pid " + std::to_string(b->pid())), std::string::npos) << what;
  } catch (const std::exception& e) {
    FAIL() << "expected a WorkerFailure, got: " << e.what();
  }
  s.shutdown();
  const auto status = a->wait(10s);
  EXPECT_TRUE(status) << "the surviving worker kept running";
}

TEST(HandJoin, CurveEncryptedJoin) {
  if (!zmq_has("curve")) GTEST_SKIP() << "this libzmq has no CURVE (built without libsodium)";
  auto config = manual_config("curve");
  config.curve = true;
  Scheduler s(config, testing::local_placement({{Role::kActor, 1}}));
  auto started = std::async(std::launch::async, [&] {
    try {
      s.start();
    } catch (const std::exception&) {
    }
  });
  const auto join_json = wait_for_join_file(config.run_dir);
  ASSERT_EQ(join_json.value("curve_server_key", "").size(), 40u) << join_json.dump();
  // Without the server key, the handshake never completes: no answer, and no registration.
  const std::string plain = (fs::path(config.run_dir) / "plain.json").string();
  std::ofstream(plain) << nlohmann::json{{"token", join_json.at("token")}}.dump();
  auto clear = join(config.run_dir, "clear", {"--join-file", plain, "--wait-s", "2"});
  const auto status = clear->wait(20s);
  ASSERT_TRUE(status);
  EXPECT_NE(WEXITSTATUS(*status), 0);
  EXPECT_NE(clear->err().find("no answer from the scheduler"), std::string::npos) << clear->err();
  auto good = join(config.run_dir, "good", {"--join-file", join_file(config.run_dir)});
  ASSERT_EQ(started.wait_for(60s), std::future_status::ready);
  const auto replies =
      s.group(Role::kActor).call_all("echo", {{"tag", "curve"}}, {{"x", at::ones({64})}});
  EXPECT_TRUE(at::equal(replies.at(0).tensor("x"), at::ones({64})));
}

// Every problem of `spec` (a tiny SFT job on `nodes`) with `overrides`, as "path: message".
std::string cluster_problems(const std::string& nodes, const std::vector<std::string>& overrides) {
  const std::string text = R"({"kind": "sft", "cluster": {"nodes": )" + nodes + R"(},
    "actor": {"model": "m", "devices": [0]},
    "data": {"dataset": "synthetic:letters_sft", "prompt_max_len": 16, "max_len": 32},
    "train": {"batch_size": 8, "micro_batch_size": 8}})";
  try {
    JobSpec::parse(text, "job.json", overrides);
  } catch (const SpecError& e) {
    std::string all;
    for (const auto& p : e.problems()) all += p.path + ": " + p.message + "\n";
    return all;
  }
  return "";
}

TEST(ClusterSpec, LauncherHostsAndPortsAreCheckedBeforeAnythingStarts) {
  const std::string local = R"([{"name": "a", "host": "127.0.0.1", "devices": 1}])";
  const std::string away =
      R"([{"name": "a", "host": "127.0.0.1", "devices": 1},
          {"name": "b", "host": "no-such-host.invalid", "devices": 1}])";
  EXPECT_EQ(cluster_problems(local, {}), "");
  EXPECT_EQ(cluster_problems(local, {"cluster.port_range=29500-29510"}), "");
  for (const char* range : {"29500", "29510-29500", "80-90", "29500-70000", "a-b"})
    EXPECT_NE(cluster_problems(local, {std::string("cluster.port_range=") + range})
                  .find("cluster.port_range: \"" + std::string(range) + "\""),
              std::string::npos)
        << range;
  const std::string manual = cluster_problems(away, {"cluster.launcher=manual"});
  EXPECT_NE(manual.find("cluster.nodes: [1].host: \"no-such-host.invalid\" does not resolve"),
            std::string::npos)
      << manual;
  EXPECT_NE(manual.find("cluster.interface: \"127.0.0.1\" is loopback"), std::string::npos)
      << manual;
  ::unsetenv("SLURM_JOB_NODELIST");
  const std::string slurm = cluster_problems(local, {"cluster.launcher=slurm"});
  EXPECT_NE(slurm.find("cluster.launcher: \"slurm\" needs a Slurm allocation"), std::string::npos)
      << slurm;
}

TEST(Slurm, HostlistsExpandAsSlurmWritesThem) {
  using V = std::vector<std::string>;
  EXPECT_EQ(expand_hostlist("node[01-03,7]"), (V{"node01", "node02", "node03", "node7"}));
  EXPECT_EQ(expand_hostlist("gpu-a"), (V{"gpu-a"}));
  EXPECT_EQ(expand_hostlist("a,b[1-2],c"), (V{"a", "b1", "b2", "c"}));
  EXPECT_EQ(expand_hostlist("rack[1-2]-n[0-1]"),
            (V{"rack1-n0", "rack1-n1", "rack2-n0", "rack2-n1"}));
  EXPECT_EQ(expand_hostlist("n[008-010]"), (V{"n008", "n009", "n010"}));
  for (const char* bad : {"node[01-03", "node[3-1]", "node[a-b]", "a,,b", "node]1["}) {
    try {
      expand_hostlist(bad);
      ADD_FAILURE() << bad << " expanded";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  }
}

TEST(Slurm, StepRunsOneWorkerOnItsHostAndKeepsTheTokenOffTheCommandLine) {
  WorkerPlacement w;
  w.role = Role::kCritic;
  w.rank = 3;
  w.host = "node02";
  const SlurmStep step = slurm_step(w, 0, "/opt/rlhf/bin/rlhf", "tcp://node01:29500");
  EXPECT_EQ(step.program, "srun");
  // A cpu worker asks for no GPU: without --gres a step gets every GPU of the job.
  EXPECT_EQ(step.args,
            (std::vector<std::string>{
                "--nodes=1", "--ntasks=1", "-w", "node02", "--overlap", "--kill-on-bad-exit=1",
                "--job-name=rlhf-critic-3", "--gres=none", "--export=ALL", "/opt/rlhf/bin/rlhf",
                "worker", "--connect", "tcp://node01:29500", "--role", "critic", "--rank", "3"}));
}

WorkerPlacement cuda_worker(Role role, int rank, int device_id) {
  WorkerPlacement w;
  w.role = role;
  w.rank = rank;
  w.node = "b";
  w.host = "node02";
  w.device_kind = DeviceKind::kCuda;
  w.device_id = device_id;
  return w;
}

// The srun arguments up to the worker command (whatever wraps it comes after).
std::vector<std::string> srun_options(const SlurmStep& step) {
  const auto exported = std::find(step.args.begin(), step.args.end(), "--export=ALL");
  return {step.args.begin(), exported + 1};
}

// Runs the step's command (what srun starts on the node) here, as if Slurm had set
// CUDA_VISIBLE_DEVICES to `slurm_visible` for the step; `rlhf_program` is a script that
// prints the CUDA_VISIBLE_DEVICES it gets and its arguments.
netns::CommandResult run_step_command(const SlurmStep& step, const std::string& slurm_visible) {
  std::vector<std::string> argv = {"env", "CUDA_VISIBLE_DEVICES=" + slurm_visible};
  argv.insert(argv.end(), std::find(step.args.begin(), step.args.end(), "--export=ALL") + 1,
              step.args.end());
  return netns::command(argv);
}

std::string visible_printer() {
  const std::string path = testing::fresh_run_dir("slurm-gpu-select") + "/print-visible";
  std::ofstream(path) << "#!/bin/sh\necho \"visible=$CUDA_VISIBLE_DEVICES args=$*\"\n";
  fs::permissions(path, fs::perms::owner_all);
  return path;
}

TEST(Slurm, CudaStepAsksForItsNodesGpusAndTheWorkerSeesOnlyItsOwn) {
  const SlurmStep step =
      slurm_step(cuda_worker(Role::kRollout, 1, 2), 8, "/opt/rlhf/bin/rlhf", "tcp://node01:29500");
  EXPECT_EQ(step.program, "srun");
  EXPECT_EQ(srun_options(step),
            (std::vector<std::string>{"--nodes=1", "--ntasks=1", "-w", "node02", "--overlap",
                                      "--kill-on-bad-exit=1", "--job-name=rlhf-rollout-1",
                                      "--gres=gpu:8", "--export=ALL"}));
  const std::vector<std::string> command(step.args.begin() + srun_options(step).size(),
                                         step.args.end());
  EXPECT_EQ(command,
            (std::vector<std::string>{"sh", "-c", kSlurmGpuSelectScript, "rlhf-gpu-select", "2",
                                      "/opt/rlhf/bin/rlhf", "worker", "--connect",
                                      "tcp://node01:29500", "--role", "rollout", "--rank", "1"}));
  // The step's list as Slurm writes it: global ids without cgroup device constraint (here
  // the job holds GPUs 8-15 of a 16-GPU host), 0..N-1 with it. Entry 2 either way.
  const std::string printer = visible_printer();
  const SlurmStep local = slurm_step(cuda_worker(Role::kRollout, 1, 2), 8, printer, "tcp://x:1");
  for (const auto& [slurm, expected] : std::vector<std::pair<std::string, std::string>>{
           {"8,9,10,11,12,13,14,15", "10"}, {"0,1,2,3,4,5,6,7", "2"}}) {
    const auto r = run_step_command(local, slurm);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(r.output,
              "visible=" + expected + " args=worker --connect tcp://x:1 --role rollout --rank 1\n");
  }
  // A job that holds fewer GPUs on the node than the spec lists: the step fails saying so.
  const auto short_list = run_step_command(local, "0,1");
  EXPECT_EQ(short_list.exit_code, 1);
  EXPECT_NE(short_list.output.find("placed on GPU 2 of its node, but its Slurm step sees "
                                   "CUDA_VISIBLE_DEVICES=0,1"),
            std::string::npos)
      << short_list.output;
  EXPECT_THROW(slurm_step(cuda_worker(Role::kRollout, 1, 8), 8, printer, "tcp://x:1"),
               RuntimeError);
}

TEST(Slurm, ColocatedRolesShareTheirGpuInsideTheirSteps) {
  const std::string printer = visible_printer();
  WorkerPlacement actor = cuda_worker(Role::kActor, 0, 3);
  WorkerPlacement ref = cuda_worker(Role::kRef, 0, 3);
  ref.colocated_with = "actor";
  const SlurmStep a = slurm_step(actor, 4, printer, "tcp://x:1");
  const SlurmStep r = slurm_step(ref, 4, printer, "tcp://x:1");
  // Both steps hold the node's 4 GPUs and overlap (share them); each worker keeps GPU 3.
  for (const SlurmStep* step : {&a, &r}) {
    const auto options = srun_options(*step);
    EXPECT_NE(std::find(options.begin(), options.end(), "--gres=gpu:4"), options.end());
    EXPECT_NE(std::find(options.begin(), options.end(), "--overlap"), options.end());
  }
  const auto ra = run_step_command(a, "0,1,2,3");
  const auto rr = run_step_command(r, "0,1,2,3");
  EXPECT_EQ(ra.output, "visible=3 args=worker --connect tcp://x:1 --role actor --rank 0\n");
  EXPECT_EQ(rr.output, "visible=3 args=worker --connect tcp://x:1 --role ref --rank 0\n");
}

TEST(Slurm, OutsideAnAllocationTheLauncherSaysSo) {
  ::unsetenv("SLURM_JOB_NODELIST");
  try {
    slurm_allocation_hosts();
    FAIL() << "found an allocation";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("SLURM_JOB_NODELIST is not set"), std::string::npos);
  }
}

}  // namespace
}  // namespace rlhf
