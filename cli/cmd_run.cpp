// `rlhf run SPEC`: validate the spec, place the workers, start and supervise them, run the
// job's driver, stop everything. A worker failure or SIGINT/SIGTERM stops the job with
// exit code 1 and a report naming the worker. The driver follows the job kind (ppo, or dpo/sft/rm);
// --smoke-rounds runs the transport smoke driver (scheduler/smoke_driver.h) instead.
#include <torch/cuda.h>
#include <unistd.h>

#include <climits>
#include <iostream>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/spec_args.h"
#include "core/placement.h"
#include "core/run_dir.h"
#include "core/spec.h"
#include "dpo/driver.h"
#include "engine/memory_check.h"
#include "ppo/driver.h"
#include "scheduler/scheduler.h"
#include "scheduler/smoke_driver.h"
#include "scheduler/worker_process.h"

namespace rlhf::cli {
namespace {

std::string self_executable() {
  char buf[PATH_MAX] = {};
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) throw RuntimeError("cannot read /proc/self/exe to start workers");
  return std::string(buf, static_cast<size_t>(n));
}

int positive_int(const std::string& option, const std::string& text) {
  try {
    size_t used = 0;
    const int v = std::stoi(text, &used);
    if (used == text.size() && v > 0) return v;
  } catch (const std::exception&) {
  }
  throw InputError(option + " " + text + ": expected a positive integer");
}

}  // namespace

int cmd_run(const Argv& argv) {
  const std::vector<OptionSpec> options = {
      set_option(),
      {"--resume", false, "continue from the newest complete checkpoint under ckpt.path"},
      {"--smoke-rounds", true,
       "run the built-in transport smoke driver (N echo rounds) instead of the job", "N"},
      {"--help", false, "show this help"}};
  Args args(argv, options);
  if (args.flag("--help")) {
    std::cout
        << "usage: rlhf run SPEC [--set PATH=VALUE]... [--resume]\n\n"
           "Places and starts one worker process per device, supervises them (a dead or silent\n"
           "worker stops the job within seconds, exit 1, with its role, rank, device, exit\n"
           "status and log tail), runs the job and stops every worker. Worker logs go to\n"
           "<logger.run_dir>/<name>/logs/<role>-<rank>.log.\n\n"
        << format_options(options);
    return 0;
  }
  const bool smoke = args.value("--smoke-rounds").has_value();
  const int rounds = smoke ? positive_int("--smoke-rounds", *args.value("--smoke-rounds")) : 1;
  const JobSpec spec = load_spec_arg(args, "run");
  for (const auto& w : spec.warnings()) std::cerr << "rlhf run: warning: " << w << '\n';
  // The job's driver reads its data and tokenizer here, so bad input fails before any
  // worker starts (exit 2).
  JobDriver driver;
  if (smoke) {
    driver = smoke_driver(rounds);
  } else {
    const auto missing = missing_inputs(spec);
    if (!missing.empty())
      throw InputError(spec.source() + ": " + missing.front().path + ": " +
                       missing.front().message);
    driver = spec.kind() == JobKind::kPpo ? ppo::ppo_driver(spec, {args.flag("--resume")})
                                          : dpo::offline_driver(spec, {args.flag("--resume")});
  }
  const Placement placement = place(spec);
  // Workers start on this machine: a cuda worker needs its GPU here (checked before any
  // worker starts; the plan still sizes GPU jobs anywhere).
  const int gpus = static_cast<int>(torch::cuda::device_count());
  for (const auto& w : placement.workers) {
    if (w.device_kind == DeviceKind::kCuda && w.device_id >= gpus)
      throw InputError(spec.source() + ": cluster.nodes: " + w.label() +
                       " is placed on cuda node '" + w.node + "' device " +
                       std::to_string(w.device_id) + ", but this machine has " +
                       std::to_string(gpus) + " CUDA device" + (gpus == 1 ? "" : "s") +
                       " (`rlhf version` says what torch sees; `rlhf plan` sizes a GPU job on any "
                       "machine)");
  }
  Scheduler scheduler(SchedulerConfig::from_spec(spec, self_executable()), placement);
  if (!smoke && !args.flag("--resume")) {
    if (auto kept = set_aside_previous_run(spec))
      std::cout << "rlhf run: an earlier run's metrics, plan and checkpoints were moved to "
                << *kept << std::endl;
  }
  if (!smoke) engine::write_run_plan(spec, scheduler.config().run_dir);  // planned beside measured
  try {
    scheduler.start();
    driver(scheduler, std::cout);
    scheduler.shutdown();
  } catch (const WorkerFailure& e) {
    scheduler.shutdown();
    std::cerr << "rlhf run: job failed: " << e.what() << "rlhf run: stopped every other worker\n";
    return static_cast<int>(ExitCode::kRuntime);
  } catch (const JobInterrupted& e) {
    scheduler.shutdown();
    std::cerr << "rlhf run: " << e.what() << "rlhf run: every worker stopped\n";
    return static_cast<int>(ExitCode::kRuntime);
  }
  std::cout << "rlhf run: done, logs in " << scheduler.config().run_dir << "/logs\n";
  return 0;
}

}  // namespace rlhf::cli
