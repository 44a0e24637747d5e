// `rlhf worker`: the process `rlhf run` starts for each placed device (identity from the
// environment), or, with --connect, a worker any launcher starts on any host: it joins the
// job's scheduler over TCP with the job token and learns its place from the answer.
#include <ATen/Parallel.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>

#include "actors/builtin_operations.h"
#include "actors/device.h"
#include "actors/model_operations.h"
#include "actors/rollout_operations.h"
#include "actors/worker.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "core/errors.h"
#include "core/placement.h"

namespace rlhf::cli {
namespace {

// Dies with the scheduler (SIGKILL on parent death), and leaves Ctrl-C to the scheduler,
// which stops every worker in order instead of each dying on its own.
void tie_to_parent() {
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) throw RuntimeError("prctl(PR_SET_PDEATHSIG) failed");
  if (getppid() == 1) throw RuntimeError("the scheduler exited before this worker started");
  if (signal(SIGINT, SIG_IGN) == SIG_ERR) throw RuntimeError("cannot ignore SIGINT");
}

// RLHF_CPU_AFFINITY ("1,3", from <role>.cpu_affinity): this process on those cores only.
void pin_to_cores(const std::string& role) {
  const char* list = std::getenv(kEnvCpuAffinity);
  if (!list || !*list) return;
  const std::string key = role + ".cpu_affinity";
  cpu_set_t set;
  CPU_ZERO(&set);
  std::stringstream in(list);
  for (std::string core; std::getline(in, core, ',');) {
    const int c = std::atoi(core.c_str());
    if (c < 0 || c >= CPU_SETSIZE) throw InputError(key + ": no CPU core " + core);
    CPU_SET(c, &set);
  }
  if (sched_setaffinity(0, sizeof set, &set) != 0)
    throw InputError(key + " [" + list + "]: this machine cannot run the worker there (" +
                     std::strerror(errno) + "); its cores are 0-" +
                     std::to_string(std::thread::hardware_concurrency() - 1));
}

// Binds the device, cores and threads of `self`, and returns the operations its role serves.
OperationRegistry prepare(const WorkerIdentity& self) {
  bind_worker_device(self);  // a cuda worker's GPU, before any tensor exists
  pin_to_cores(self.role);
  if (const char* threads = std::getenv("OMP_NUM_THREADS"))
    at::set_num_threads(std::max(1, std::atoi(threads)));
  OperationRegistry registry;
  add_builtin_operations(registry);
  const std::string& role = self.role;
  if (role == "actor" || role == "critic" || role == "reward" || role == "ref" || role == "teacher")
    add_model_operations(registry);
  if (role == "rollout" || role == "judge") add_rollout_operations(registry);
  return registry;
}

// --connect: the token and CURVE key from --join-file (the join.json `rlhf run` writes) or
// RLHF_TOKEN / RLHF_CURVE_SERVER_KEY; role, rank and node optional.
WorkerConfig connect_config(const Args& args) {
  WorkerConfig config;
  config.scheduler_endpoint = *args.value("--connect");
  if (config.scheduler_endpoint.rfind("tcp://", 0) != 0)
    throw InputError("--connect \"" + config.scheduler_endpoint + "\": expected tcp://HOST:PORT");
  if (const char* token = std::getenv("RLHF_TOKEN")) config.token = token;
  if (const char* key = std::getenv("RLHF_CURVE_SERVER_KEY")) config.curve_server_key = key;
  if (auto file = args.value("--join-file")) {
    std::ifstream in(*file);
    if (!in) throw InputError("--join-file " + *file + ": cannot read it");
    const auto join = nlohmann::json::parse(in, nullptr, false);
    if (!join.is_object() || !join.contains("token") || !join["token"].is_string())
      throw InputError("--join-file " + *file +
                       ": expected the join.json of `rlhf run` "
                       "(an object with \"token\")");
    config.token = join["token"].get<std::string>();
    config.curve_server_key = join.value("curve_server_key", config.curve_server_key);
  }
  if (config.token.empty())
    throw InputError("--connect needs the job token: --join-file RUN_DIR/join.json, or RLHF_TOKEN");
  config.identity.role = args.value("--role").value_or("");
  config.identity.rank = -1;
  if (auto rank = args.value("--rank")) {
    try {
      config.identity.rank = std::stoi(*rank);
    } catch (const std::exception&) {
      throw InputError("--rank \"" + *rank + "\": expected a non-negative integer");
    }
  }
  config.identity.node = args.value("--node").value_or("");
  if (auto wait = args.value("--wait-s"))
    config.register_timeout =
        std::chrono::milliseconds(static_cast<int64_t>(std::stod(*wait) * 1000));
  config.on_assigned = prepare;
  return config;
}

}  // namespace

int cmd_worker(const Argv& argv) {
  const std::vector<OptionSpec> options = {
      {"--connect", true, "join the job whose scheduler listens there", "tcp://HOST:PORT"},
      {"--join-file", true, "the job's join.json (token, CURVE key) from its run directory",
       "PATH"},
      {"--role", true, "take a place of this role (default: any free place)", "ROLE"},
      {"--rank", true, "take this rank of --role", "N"},
      {"--node", true, "take a place on this node of cluster.nodes", "NAME"},
      {"--wait-s", true, "seconds to wait for the scheduler's answer (default 30)", "S"},
      {"--help", false, "show this help"}};
  Args args(argv, options);
  if (args.flag("--help")) {
    std::cout
        << "usage: rlhf worker [--connect tcp://HOST:PORT --join-file PATH [--role R --rank N]]\n\n"
           "Without --connect: a worker process started by `rlhf run`, one per placed device.\n"
           "It reads RLHF_ROLE, RLHF_RANK, RLHF_WORLD_SIZE, RLHF_DEVICE, RLHF_SCHEDULER,\n"
           "RLHF_TOKEN and RLHF_RUN_DIR, registers and serves operations until shutdown.\n"
           "With --connect (cluster.launcher manual or slurm): joins the job at that endpoint\n"
           "with its token (--join-file, or RLHF_TOKEN) and serves the place it is given.\n\n"
        << format_options(options);
    return 0;
  }
  if (args.value("--connect")) {
    // Not tied to a parent: its launcher may be anything. It exits on shutdown, or when
    // the scheduler falls silent for the job's worker timeout.
    if (signal(SIGINT, SIG_IGN) == SIG_ERR) throw RuntimeError("cannot ignore SIGINT");
    return Worker(connect_config(args), OperationRegistry()).run();
  }
  WorkerConfig config = WorkerConfig::from_env();
  tie_to_parent();
  OperationRegistry registry = prepare(config.identity);
  return Worker(std::move(config), std::move(registry)).run();
}

}  // namespace rlhf::cli
