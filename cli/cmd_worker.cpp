// `rlhf worker`: the process `rlhf run` starts for each placed device. Reads its identity
// from the environment, registers, serves operations until shutdown. Not for direct use.
#include <ATen/Parallel.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cstdlib>
#include <iostream>

#include "actors/builtin_operations.h"
#include "actors/device.h"
#include "actors/model_operations.h"
#include "actors/rollout_operations.h"
#include "actors/worker.h"
#include "cli/args.h"
#include "cli/commands.h"

namespace rlhf::cli {
namespace {

// Dies with the scheduler (SIGKILL on parent death), and leaves Ctrl-C to the scheduler,
// which stops every worker in order instead of each dying on its own.
void tie_to_parent() {
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) throw RuntimeError("prctl(PR_SET_PDEATHSIG) failed");
  if (getppid() == 1) throw RuntimeError("the scheduler exited before this worker started");
  if (signal(SIGINT, SIG_IGN) == SIG_ERR) throw RuntimeError("cannot ignore SIGINT");
}

}  // namespace

int cmd_worker(const Argv& argv) {
  const std::vector<OptionSpec> options = {{"--help", false, "show this help"}};
  Args args(argv, options);
  if (args.flag("--help")) {
    std::cout
        << "usage: rlhf worker\n\n"
           "Internal: a worker process started by `rlhf run`, one per placed device. It reads\n"
           "RLHF_ROLE, RLHF_RANK, RLHF_WORLD_SIZE, RLHF_DEVICE, RLHF_SCHEDULER, RLHF_TOKEN and\n"
           "RLHF_RUN_DIR, registers with the scheduler and serves operations until shutdown.\n\n"
        << format_options(options);
    return 0;
  }
  WorkerConfig config = WorkerConfig::from_env();
  tie_to_parent();
  bind_worker_device(config.identity);  // a cuda worker's GPU, before any tensor exists
  if (const char* threads = std::getenv("OMP_NUM_THREADS"))
    at::set_num_threads(std::max(1, std::atoi(threads)));
  OperationRegistry registry;
  add_builtin_operations(registry);
  const std::string& role = config.identity.role;
  if (role == "actor" || role == "critic" || role == "reward" || role == "ref")
    add_model_operations(registry);
  if (role == "rollout") add_rollout_operations(registry);
  return Worker(std::move(config), std::move(registry)).run();
}

}  // namespace rlhf::cli
