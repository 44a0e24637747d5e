// A real Slurm (Debian's slurmctld, slurmd, munge) started by the test on this machine: two
// nodes n1 and n2, each a network namespace with its own address (10.77.0.1, 10.77.0.2, joined
// by a veth pair), its own host name (a UTS namespace) and an /etc/hosts naming both (a
// bind mount in a private mount namespace). `salloc` runs `rlhf run` with cluster.launcher
// slurm on n1; its workers are srun steps on both nodes. Needs root, `ip netns` and the
// Slurm and munge binaries; skips naming what is missing. Each node also declares 4 fake GPUs
// (gres.conf over character devices made in the test's directory, no driver behind them), so
// the srun steps' GPU requests meet a real Slurm. Not here: several slurmd per namespace,
// cgroups (the plugins used need none), a real GPU.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "scheduler/slurm_launcher.h"
#include "tests/scheduler/netns_support.h"
#include "tests/support/learning.h"
#include "tests/support/processes.h"
#include "tests/support/run_cli.h"

namespace rlhf {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;
using netns::command;
using netns::Process;
using nlohmann::json;
using testing::poll_until;

// The daemons that may stay in the nodes' namespaces once a job has ended.
const std::set<std::string> kDaemons = {"slurmd", "slurmctld", "slurmscriptd"};

std::string comm_of(int pid) {
  std::string comm = testing::read_file("/proc/" + std::to_string(pid) + "/comm");
  if (!comm.empty() && comm.back() == '\n') comm.pop_back();
  return comm;
}

std::string cmdline_of(int pid) {
  std::string cmd = testing::read_file("/proc/" + std::to_string(pid) + "/cmdline");
  for (char& c : cmd)
    if (c == '\0') c = ' ';
  return cmd;
}

// munged, slurmctld (on n1) and a slurmd per node, each a child of this process in the
// foreground, stopped (SIGTERM, then SIGKILL) when destroyed; the namespaces go after them.
class SlurmCluster {
 public:
  SlurmCluster() {
    for (const char* program :
         {"munged", "slurmctld", "slurmd", "salloc", "srun", "sinfo", "nsenter", "unshare"})
      if (command({"sh", "-c", std::string("command -v ") + program}).exit_code != 0) {
        missing_ = std::string("`") + program +
                   "` in PATH (Debian packages slurmd, slurmctld, munge; util-linux)";
        return;
      }
    ns_ = std::make_unique<netns::NamespacePair>();
    if (!ns_->missing().empty()) {
      missing_ = ns_->missing();
      return;
    }
    if (!ns_->failed().empty()) {
      failed_ = ns_->failed();
      return;
    }
    dir_ = testing::fresh_run_dir("slurm-cluster");
    for (const char* sub : {"munge", "state", "spool/n1", "spool/n2", "log"})
      fs::create_directories(fs::path(dir_) / sub);
    ::chmod((dir_ + "/munge").c_str(), 0700);
    {
      std::ifstream random("/dev/urandom", std::ios::binary);
      std::string key(1024, '\0');
      random.read(key.data(), key.size());
      std::ofstream(dir_ + "/munge/munge.key", std::ios::binary) << key;
    }
    ::chmod((dir_ + "/munge/munge.key").c_str(), 0400);
    // Slurm reads a GPU's device file's major and minor: character devices, NVIDIA's numbers.
    for (int gpu = 0; gpu < kGpusPerNode; ++gpu) {
      const std::string file = dir_ + "/fake-nvidia" + std::to_string(gpu);
      if (::mknod(file.c_str(), S_IFCHR | 0600, makedev(195, gpu)) != 0) {
        failed_ = "mknod " + file + ": " + std::strerror(errno);
        return;
      }
    }
    std::ofstream(dir_ + "/hosts") << "127.0.0.1 localhost\n"
                                   << netns::kFirstAddress << " n1\n"
                                   << netns::kSecondAddress << " n2\n";
    write_config();
    daemons_.push_back(std::make_unique<Process>(
        std::vector<std::string>{
            "munged", "--foreground", "--force", "--key-file=" + dir_ + "/munge/munge.key",
            "--socket=" + dir_ + "/munge/sock", "--pid-file=" + dir_ + "/munge/pid",
            "--log-file=" + dir_ + "/munge/log", "--seed-file=" + dir_ + "/munge/seed"},
        env(), dir_ + "/out-munged"));
    if (!poll_until([&] { return fs::exists(dir_ + "/munge/sock"); }, 10s)) {
      failed_ = "munged did not open its socket: " + daemons_.back()->err() +
                testing::read_file(dir_ + "/munge/log");
      return;
    }
    daemons_.push_back(std::make_unique<Process>(
        on_node("n1", {"slurmctld", "-D", "-i", "-f", conf()}), env(), dir_ + "/out-slurmctld"));
    for (const char* node : {"n1", "n2"})
      daemons_.push_back(
          std::make_unique<Process>(on_node(node, {"slurmd", "-D", "-N", node, "-f", conf()}),
                                    env(), dir_ + "/out-slurmd-" + node));
    std::string states;
    const bool idle = poll_until(
        [&] {
          states = command(on_node("n1", {"sinfo", "-h", "-N", "-o", "%N=%t"})).output;
          return states.find("n1=idle") != std::string::npos &&
                 states.find("n2=idle") != std::string::npos;
        },
        30s);
    if (!idle) {
      failed_ = "the nodes did not come up idle within 30 s (sinfo: " + states + ")\n";
      for (const char* log : {"slurmctld.log", "slurmd-n1.log", "slurmd-n2.log"})
        failed_ += std::string(log) + ":\n" + testing::read_file(dir_ + "/log/" + log);
    }
  }
  ~SlurmCluster() {
    for (auto it = daemons_.rbegin(); it != daemons_.rend(); ++it) {
      ::kill((*it)->pid(), SIGTERM);
      (*it)->wait(10s);  // else its destructor kills it
    }
    daemons_.clear();
  }
  SlurmCluster(const SlurmCluster&) = delete;
  SlurmCluster& operator=(const SlurmCluster&) = delete;

  const std::string& missing() const { return missing_; }
  const std::string& failed() const { return failed_; }
  const std::string& dir() const { return dir_; }
  const netns::NamespacePair& namespaces() const { return *ns_; }

  // `argv` as if on `node` with this cluster's configuration: in its network namespace, with its
  // host name and the test's /etc/hosts.
  std::vector<std::string> on_node(const std::string& node,
                                   const std::vector<std::string>& argv) const {
    const std::string& ns = node == "n1" ? ns_->first() : ns_->second();
    std::vector<std::string> out = {"env",
                                    "SLURM_CONF=" + conf(),
                                    "OMP_NUM_THREADS=1",
                                    "nsenter",
                                    "--net=/run/netns/" + ns,
                                    "unshare",
                                    "--mount",
                                    "--uts",
                                    "sh",
                                    "-c",
                                    "mount --bind " + netns::quoted(dir_ + "/hosts") +
                                        " /etc/hosts && hostname " + node + " && exec \"$@\"",
                                    "sh"};
    out.insert(out.end(), argv.begin(), argv.end());
    return out;
  }

  // The environment of every Slurm command: this cluster's configuration, one torch thread.
  std::map<std::string, std::string> env() const {
    return {{"SLURM_CONF", conf()}, {"OMP_NUM_THREADS", "1"}};
  }

  // Processes other than the daemons in either node's namespace (pid: command line).
  std::map<int, std::string> strays() const {
    std::map<int, std::string> found;
    for (const auto& ns : {ns_->first(), ns_->second()}) {
      std::istringstream pids(command({"ip", "netns", "pids", ns}).output);
      for (int pid; pids >> pid;)
        if (testing::pid_alive(pid) && !kDaemons.count(comm_of(pid))) found[pid] = cmdline_of(pid);
    }
    return found;
  }

 private:
  std::string conf() const { return dir_ + "/slurm.conf"; }

 public:
  static constexpr int kGpusPerNode = 4;

 private:
  // Ports are Slurm's defaults: each test's nodes have namespaces of their own, so runs
  // side by side do not meet.
  void write_config() const {
    std::ofstream out(conf());
    out << "ClusterName=rlhftest\n"
        << "SlurmctldHost=n1(" << netns::kFirstAddress << ")\n"
        << "SlurmctldPort=6817\nSlurmdPort=6818\n"
        << "SlurmUser=root\nSlurmdUser=root\n"
        << "AuthType=auth/munge\nCredType=cred/munge\n"
        << "AuthInfo=socket=" << dir_ << "/munge/sock\n"
        << "StateSaveLocation=" << dir_ << "/state\n"
        << "SlurmdSpoolDir=" << dir_ << "/spool/%n\n"
        << "SlurmctldPidFile=" << dir_ << "/slurmctld.pid\n"
        << "SlurmdPidFile=" << dir_ << "/slurmd-%n.pid\n"
        << "SlurmctldLogFile=" << dir_ << "/log/slurmctld.log\n"
        << "SlurmdLogFile=" << dir_
        << "/log/slurmd-%n.log\n"
        // No cgroups: processes tracked by their parentage, no task binding.
        << "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
        << "JobAcctGatherType=jobacct_gather/none\n"
        << "AccountingStorageType=accounting_storage/none\nJobCompType=jobcomp/none\n"
        << "SelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\n"
        << "SchedulerType=sched/builtin\nMpiDefault=none\nReturnToService=2\n"
        << "MailProg=/bin/true\nPlugStackConfig=/dev/null\n"
        // The nodes' CPUs as declared, whatever this machine has.
        << "SlurmdParameters=config_overrides\n"
        << "GresTypes=gpu\n"
        << "NodeName=n1 NodeAddr=" << netns::kFirstAddress
        << " NodeHostname=n1 CPUs=8 RealMemory=1000 Gres=gpu:" << kGpusPerNode << " State=UNKNOWN\n"
        << "NodeName=n2 NodeAddr=" << netns::kSecondAddress
        << " NodeHostname=n2 CPUs=8 RealMemory=1000 Gres=gpu:" << kGpusPerNode << " State=UNKNOWN\n"
        << "PartitionName=test Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP\n";
    // Slurm reads gres.conf beside slurm.conf.
    std::ofstream(dir_ + "/gres.conf") << "NodeName=n[1-2] Name=gpu File=" << dir_
                                       << "/fake-nvidia[0-" << kGpusPerNode - 1 << "]\n";
  }

  std::string missing_, failed_, dir_;
  std::unique_ptr<netns::NamespacePair> ns_;       // deleted after the daemons
  std::vector<std::unique_ptr<Process>> daemons_;  // munged, slurmctld, slurmd n1, slurmd n2
};

class SlurmJob : public ::testing::Test {
 protected:
  void SetUp() override {
    cluster_ = std::make_unique<SlurmCluster>();
    if (!cluster_->missing().empty()) GTEST_SKIP() << "needs " << cluster_->missing();
    ASSERT_EQ(cluster_->failed(), "");
    models_ = test::tiny_models_dir("slurm-job");
  }

  // `salloc -N2 rlhf run` of ppo_tiny from n1: the actor on n1 (with the driver), the
  // critic, reference and rollout on n2.
  std::unique_ptr<Process> salloc_run(const std::string& name,
                                      const std::vector<std::string>& extra = {}) {
    const json nodes = json::array(
        {{{"name", "a"}, {"host", "n1"}, {"kind", "cpu"}, {"devices", 1}, {"memory_gb", 4}},
         {{"name", "b"}, {"host", "n2"}, {"kind", "cpu"}, {"devices", 3}, {"memory_gb", 4}}});
    std::vector<std::string> argv = {
        "salloc",    "-N2",
        "--time=10", RLHF_CLI_PATH,
        "run",       std::string(RLHF_SOURCE_DIR) + "/examples/ppo_tiny.json",
        "--set",     "actor.model=" + models_ + "/tiny",
        "--set",     "critic.model=" + models_ + "/tiny-value",
        "--set",     "logger.run_dir=" + models_ + "/runs",
        "--set",     "name=" + name,
        "--set",     "cluster.launcher=slurm",
        "--set",     "cluster.interface=n1",
        "--set",     "cluster.nodes=" + nodes.dump(),
        "--set",     R"(actor.devices={"a":[0]})",
        "--set",     R"(critic.devices={"b":[0]})",
        "--set",     R"(ref.devices={"b":[1]})",
        "--set",     R"(rollout.devices={"b":[2]})"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return std::make_unique<Process>(cluster_->on_node("n1", argv), cluster_->env(),
                                     models_ + "/salloc-" + name);
  }

  // The rollout worker's own pid in n2's namespace (-1: none).
  int rollout_worker() const {
    for (const auto& [pid, cmd] : cluster_->strays())
      if (comm_of(pid) == "rlhf" && cmd.find("--role rollout") != std::string::npos) return pid;
    return -1;
  }

  // Waits up to 15 s for every process but the daemons to leave the nodes' namespaces.
  void expect_nothing_left() {
    std::map<int, std::string> left;
    poll_until(
        [&] {
          left = cluster_->strays();
          return left.empty();
        },
        15s);
    for (const auto& [pid, cmd] : left) ADD_FAILURE() << "left running: pid " << pid << ": " << cmd;
  }

  std::unique_ptr<SlurmCluster> cluster_;
  std::string models_;
};

TEST_F(SlurmJob, PpoJobWithRolesOnTwoNodesLearns) {
  auto run = salloc_run("learns");
  const auto status = run->wait(180s);
  ASSERT_TRUE(status) << "salloc rlhf run did not end in 180 s: " << run->err();
  ASSERT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << run->out() << run->err();
  const auto metrics = test::read_jsonl(models_ + "/runs/learns/metrics.jsonl");
  EXPECT_EQ(metrics.size(), 30u);
  test::expect_learned(metrics);  // ppo_tiny's margin, as in tests/ppo
  const auto listing =
      json::parse(testing::read_file(models_ + "/runs/learns/workers.json"), nullptr, false);
  ASSERT_TRUE(listing.is_array() && listing.size() == 4u) << listing.dump();
  for (const auto& w : listing)
    EXPECT_EQ(w.at("host"), w.at("role") == "actor" ? "n1" : "n2") << w.dump();
  // The rollout on n2 got the actor's weights from n1 every step: across the veth.
  EXPECT_GT(cluster_->namespaces().bytes_into_second(), 30 * 200'000);
  expect_nothing_left();
}

// The rollout worker on n2 (an srun step) killed: it is started again on n2 by the same step
// command, catches up with the actor's weights over the veth, and the job ends with every step
// once (issue 45).
TEST_F(SlurmJob, AWorkerKilledOnTheSecondNodeIsStartedAgainThereAndTheJobEnds) {
  auto run = salloc_run("relaunched");
  const std::string dir = models_ + "/runs/relaunched";
  ASSERT_TRUE(
      poll_until([&] { return test::read_jsonl(dir + "/metrics.jsonl").size() >= 2; }, 120s))
      << run->err();
  const int rollout = rollout_worker();
  ASSERT_GT(rollout, 0) << "no rollout worker in n2's namespace";
  ASSERT_EQ(::kill(rollout, SIGKILL), 0);
  const auto status = run->wait(180s);
  ASSERT_TRUE(status) << "salloc rlhf run did not end: " << run->err();
  ASSERT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << run->out() << run->err();
  const auto metrics = test::read_jsonl(dir + "/metrics.jsonl");
  ASSERT_EQ(metrics.size(), 30u);
  for (size_t i = 0; i < metrics.size(); ++i) EXPECT_EQ(metrics[i]["step"], i + 1);
  const auto restarts = test::read_jsonl(dir + "/restarts.jsonl");
  ASSERT_FALSE(restarts.empty()) << run->err();
  EXPECT_EQ(restarts[0]["role"], "rollout") << restarts[0].dump();
  EXPECT_EQ(restarts[0]["cause"].get<std::string>().rfind("(its srun step) ", 0), 0u)
      << restarts[0].dump();
  EXPECT_GT(restarts[0]["ready_s"].get<double>(), 0) << "it served again";
  const auto listing = json::parse(testing::read_file(dir + "/workers.json"), nullptr, false);
  ASSERT_TRUE(listing.is_array()) << listing.dump();
  for (const auto& w : listing)
    if (w.at("role") == "rollout") EXPECT_EQ(w.at("host"), "n2") << "started again on its node";
  EXPECT_NE(run->err().find("rlhf run: fault: rollout[0]"), std::string::npos) << run->err();
  expect_nothing_left();
}

TEST_F(SlurmJob, AWorkerKilledOnTheSecondNodeStopsTheJobNamingItsHost) {
  auto run = salloc_run("killed", {"--set", "fault.max_restarts=0"});
  const std::string metrics = models_ + "/runs/killed/metrics.jsonl";
  ASSERT_TRUE(poll_until([&] { return test::read_jsonl(metrics).size() >= 2; }, 120s))
      << run->err();
  const int rollout = rollout_worker();
  ASSERT_GT(rollout, 0) << "no rollout worker in n2's namespace";
  ASSERT_EQ(::kill(rollout, SIGKILL), 0);
  const auto killed = testing::Clock::now();
  const auto status = run->wait(30s);
  ASSERT_TRUE(status) << "the job went on without its rollout worker: " << run->err();
  EXPECT_LT(testing::Clock::now() - killed, 5s) << "noticed too late";
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) != 0) << run->err();
  const std::string err = run->err();
  EXPECT_NE(err.find("rollout[0]"), std::string::npos) << err;
  EXPECT_NE(err.find("host n2"), std::string::npos) << err;
  // The worker's own pid on n2, not srun's on n1.
  EXPECT_NE(err.find("pid " + std::to_string(rollout) + " there"), std::string::npos) << err;
  EXPECT_LT(test::read_jsonl(metrics).size(), 30u);
  expect_nothing_left();
}

// The pids whose parent is `parent`.
std::vector<int> children_of(int parent) {
  std::vector<int> found;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    // /proc/PID/stat: "pid (comm) state ppid ..."; comm may hold spaces, so after the last ')'.
    const std::string stat = testing::read_file(entry.path().string() + "/stat");
    std::istringstream rest(stat.substr(stat.rfind(')') + 1));
    std::string state;
    int ppid = 0;
    if (rest >> state >> ppid && ppid == parent) found.push_back(std::stoi(name));
  }
  return found;
}

// Ctrl-C at the terminal where `salloc rlhf run` runs: the terminal sends SIGINT to its
// foreground process group. salloc puts the command it starts in a process group of its own
// (and makes that the terminal's foreground group); salloc itself ignores SIGINT once the
// command runs and exits with the command's status.
TEST_F(SlurmJob, CtrlCStopsTheJobAndNothingRunsOnEitherNode) {
  auto run =
      salloc_run("interrupted", {"--set", "train.max_steps=200", "--set", "ckpt.save_steps=1"});
  const std::string metrics = models_ + "/runs/interrupted/metrics.jsonl";
  ASSERT_TRUE(poll_until([&] { return test::read_jsonl(metrics).size() >= 2; }, 120s))
      << run->err();
  int rlhf_run = -1;
  for (int pid : children_of(run->pid()))
    if (comm_of(pid) == "rlhf") rlhf_run = pid;
  ASSERT_GT(rlhf_run, 0) << "no rlhf run under salloc (pid " << run->pid() << ")";
  const int group = ::getpgid(rlhf_run);
  ASSERT_EQ(group, rlhf_run) << "salloc starts its command as a process group leader";
  ASSERT_NE(group, ::getpgrp()) << "the signal would reach this test";
  ASSERT_EQ(::kill(-group, SIGINT), 0);
  const auto interrupted = testing::Clock::now();
  const auto status = run->wait(30s);
  ASSERT_TRUE(status) << "salloc rlhf run went on after Ctrl-C: " << run->err();
  EXPECT_LT(testing::Clock::now() - interrupted, 10s) << "stopped too late";
  ASSERT_TRUE(WIFEXITED(*status)) << run->err();
  // salloc exits with its command's status: rlhf run's 128 + SIGINT, as shells report.
  EXPECT_EQ(WEXITSTATUS(*status), 130) << run->out() << run->err();
  const std::string err = run->err();
  std::smatch m;
  ASSERT_TRUE(std::regex_search(err, m, std::regex("--resume` continues after step (\\d+)")))
      << err;
  EXPECT_GE(std::stoi(m[1]), 1);
  EXPECT_LT(test::read_jsonl(metrics).size(), 200u);
  expect_nothing_left();
}

// The steps rlhf run starts, with the program replaced by a script that writes down what the
// worker would see, run in `salloc -N2 --gres=gpu:4`: a cuda worker on n2's GPU 2, an actor and
// a reference colocated on n1's GPU 3, and a cpu worker on n2, all at once. Without cgroups
// Slurm writes global GPU ids, which here are the placement's ids.
TEST(SlurmGpus, EachCudaStepSeesItsOwnGpuAndACpuStepNone) {
  SlurmCluster cluster;
  if (!cluster.missing().empty()) GTEST_SKIP() << "needs " << cluster.missing();
  ASSERT_EQ(cluster.failed(), "");
  const std::string dir = cluster.dir();
  const std::string printer = dir + "/print-visible";
  // Arguments: worker --connect ENDPOINT --role ROLE --rank RANK.
  std::ofstream(printer) << "#!/bin/sh\necho \"$(hostname) visible=$CUDA_VISIBLE_DEVICES\" > "
                         << netns::quoted(dir) << "/seen-$5\n";
  fs::permissions(printer, fs::perms::owner_all);
  auto worker = [](Role role, const std::string& host, DeviceKind kind, int device) {
    WorkerPlacement w;
    w.role = role;
    w.host = host;
    w.node = host;
    w.device_kind = kind;
    w.device_id = device;
    return w;
  };
  const int gpus = SlurmCluster::kGpusPerNode;
  const std::vector<SlurmStep> steps = {
      slurm_step(worker(Role::kRollout, "n2", DeviceKind::kCuda, 2), gpus, printer, "tcp://n1:1"),
      slurm_step(worker(Role::kActor, "n1", DeviceKind::kCuda, 3), gpus, printer, "tcp://n1:1"),
      slurm_step(worker(Role::kRef, "n1", DeviceKind::kCuda, 3), gpus, printer, "tcp://n1:1"),
      slurm_step(worker(Role::kCritic, "n2", DeviceKind::kCpu, 0), 0, printer, "tcp://n1:1")};
  std::string job = "#!/bin/sh\n";
  for (const auto& step : steps) {
    job += step.program;
    for (const auto& a : step.args) job += " " + netns::quoted(a);
    job += " &\n";
  }
  job += "wait\n";
  std::ofstream(dir + "/job.sh") << job;
  fs::permissions(dir + "/job.sh", fs::perms::owner_all);
  // As in an sbatch script with --gpus-per-node: the driver's own list, exported to each step.
  auto env = cluster.env();
  env["CUDA_VISIBLE_DEVICES"] = "0,1,2,3";
  Process run(cluster.on_node("n1", {"salloc", "-N2", "--gres=gpu:4", "--time=5", dir + "/job.sh"}),
              env, dir + "/salloc-gpus");
  const auto status = run.wait(60s);
  ASSERT_TRUE(status) << "salloc did not end in 60 s: " << run.err();
  ASSERT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << run.out() << run.err();
  EXPECT_EQ(testing::read_file(dir + "/seen-rollout"), "n2 visible=2\n") << run.err();
  EXPECT_EQ(testing::read_file(dir + "/seen-actor"), "n1 visible=3\n") << run.err();
  EXPECT_EQ(testing::read_file(dir + "/seen-ref"), "n1 visible=3\n") << run.err();
  // A step without --gres would get all 4 (the default): the cpu worker asks for none, and
  // Slurm empties the list it exported.
  EXPECT_EQ(testing::read_file(dir + "/seen-critic"), "n2 visible=\n") << run.err();
}

}  // namespace
}  // namespace rlhf
