// `rlhf run SPEC`: check it as `rlhf validate` does (cli/preflight.h), place the workers, start
// and supervise them, run the job's driver (ppo, or dpo/sft/rm), stop everything. A worker
// failure stops the job with exit 1 and a report naming the worker; SIGINT/SIGTERM with
// 130/143 and the checkpoint --resume would use. The internal --smoke-rounds runs the
// transport smoke driver (scheduler/smoke_driver.h) instead.
#include <unistd.h>

#include <climits>
#include <filesystem>
#include <iostream>
#include <memory>

#include "actors/wire_version.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/preflight.h"
#include "cli/spec_args.h"
#include "core/placement.h"
#include "core/run_dir.h"
#include "core/spec.h"
#include "engine/driver_state.h"
#include "engine/memory_check.h"
#include "report/dashboard.h"
#include "report/metrics.h"
#include "report/tensorboard.h"
#include "scheduler/scheduler.h"
#include "scheduler/smoke_driver.h"
#include "scheduler/worker_process.h"

namespace rlhf::cli {
namespace {

namespace fs = std::filesystem;

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

// The checkpoint a `--resume` would continue from, for the line printed when a job stops.
std::string resume_hint(const JobSpec& spec, const std::vector<std::string>& sets) {
  const std::string ckpt = checkpoint_directory(spec);
  const auto state = engine::latest_driver_state(ckpt, engine::checkpointed_role(spec));
  if (!state)
    return "no complete checkpoint yet under " + ckpt +
           ": a new run starts over (ckpt.save_steps sets how often one is written)";
  // The command as given, --set values quoted for a shell where they need it.
  std::string command = "rlhf run " + spec.source();
  for (const auto& set : sets) {
    const bool plain = set.find_first_of(" \t\"'$`\\[]{}()*?;&|<>!#~") == std::string::npos;
    std::string quoted;
    for (char c : set) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
    command += " --set " + (plain ? set : "'" + quoted + "'");
  }
  return "`" + command + " --resume` continues after step " + std::to_string(state->step) +
         " (checkpoint " +
         (fs::path(ckpt) / role_name(engine::checkpointed_role(spec)) / state->tag).string() + ")";
}

// A resumed run: the settings it continues with although they changed, and the records of
// the steps after the checkpoint dropped (they run again, so each step appears once in
// metrics.jsonl, and TensorBoard is told to drop their earlier events).
void announce_resume(const JobSpec& spec, const engine::DriverState& from) {
  for (const auto& c :
       engine::changed_settings(from.data.value("settings", nlohmann::json()), spec))
    std::cout << "rlhf run: --resume-changed: " << c << '\n';
  // The steps after the checkpoint run again: their earlier records go, so each step
  // appears once in metrics.jsonl, and TensorBoard is told to drop their earlier events.
  const std::string metrics = (fs::path(run_directory(spec)) / "metrics.jsonl").string();
  const int64_t dropped = report::drop_records_after(metrics, from.step);
  report::drop_records_after((fs::path(run_directory(spec)) / "samples.jsonl").string(), from.step);
  report::mark_resumed_after((fs::path(run_directory(spec)) / "tensorboard").string(), from.step);
  std::cout << "rlhf run: resuming after step " << from.step << " from " << from.file;
  if (dropped > 0)
    std::cout << "; " << dropped << " metrics record" << (dropped == 1 ? "" : "s")
              << " of later steps dropped from " << metrics << " (those steps run again)";
  std::cout << std::endl;
}

// Starts the workers, runs the driver and stops them all, whatever happens: 0 when the job
// ended, its exit code when a worker failed (1) or a signal stopped it (128 + signal).
int supervise(Scheduler& scheduler, JobDriver& driver, const JobSpec& spec,
              const std::vector<std::string>& sets, bool smoke) {
  // Stops the progress line and every worker; the rendezvous files of the collective groups
  // (<run_dir>/stores) mean nothing once the workers are gone.
  const auto stop_all = [&] {
    scheduler.progress().end();
    scheduler.shutdown();
    std::error_code ec;
    fs::remove_all(fs::path(scheduler.config().run_dir) / "stores", ec);
  };
  const auto say_resume = [&] {
    if (!smoke) std::cerr << "rlhf run: " << resume_hint(spec, sets) << '\n';
  };
  try {
    scheduler.start();
    driver(scheduler, std::cout);
    stop_all();
  } catch (const WorkerFailure& e) {
    stop_all();
    std::cerr << "rlhf run: job failed: " << e.what() << "rlhf run: stopped every other worker\n";
    say_resume();
    return static_cast<int>(ExitCode::kRuntime);
  } catch (const JobInterrupted& e) {
    stop_all();
    std::cerr << "rlhf run: " << e.what() << "rlhf run: every worker stopped\n";
    say_resume();
    return 128 + e.signal();  // 130 for SIGINT, 143 for SIGTERM, as shells report
  } catch (...) {  // bad input found by a worker (exit 2), a driver error (exit 1): main reports
    stop_all();
    throw;
  }
  return 0;
}

}  // namespace

int cmd_run(const Argv& argv) {
  const std::vector<OptionSpec> options = {
      set_option(),
      {"--resume", false, "continue from the newest complete checkpoint under ckpt.path"},
      {"--resume-changed", false,
       "with --resume: continue although settings that change the trajectory differ from the "
       "checkpoint's (they are named)"},
      {"--smoke-rounds", true,
       "internal: run the transport smoke driver (N echo rounds) instead of the job", "N",
       /*hidden=*/true},
      {"--help", false, "show this help"}};
  Args args(argv, options);
  if (args.flag("--help")) {
    std::cout
        << "usage: rlhf run SPEC [--set PATH=VALUE]... [--resume [--resume-changed]]\n\n"
           "Checks the spec, its files and this machine as `rlhf validate` does (exit 2 on bad\n"
           "input, before any worker starts), places and starts one worker process per device,\n"
           "supervises them (a dead or silent worker stops the job within seconds, exit 1, with\n"
           "its role, rank, device, exit status and log tail), runs the job and stops every\n"
           "worker. Ctrl-C stops the job (exit 130) and says which checkpoint --resume would\n"
           "continue from. Worker logs go to <logger.run_dir>/<name>/logs/<role>-<rank>.log.\n\n"
        << format_options(options);
    return 0;
  }
  const bool smoke = args.value("--smoke-rounds").has_value();
  const int rounds = smoke ? positive_int("--smoke-rounds", *args.value("--smoke-rounds")) : 1;
  const bool resume = args.flag("--resume");
  if (args.flag("--resume-changed") && !resume)
    throw InputError("--resume-changed only goes with --resume");
  const JobSpec spec = load_spec_arg(args, "run");
  for (const auto& w : spec.warnings()) std::cerr << "rlhf run: warning: " << w << '\n';
  for (const auto& n : spec.notes()) std::cerr << "rlhf run: " << n << '\n';
  // Everything `rlhf validate` checks, and the driver built (data and tokenizer read), before
  // any worker starts: bad input is exit 2 here.
  JobDriver driver;
  if (smoke) {
    driver = smoke_driver(rounds);
  } else {
    PreflightOptions checks;
    checks.resume = resume;
    checks.resume_changed = args.flag("--resume-changed");
    Preflight ready = preflight(spec, checks);
    driver = std::move(ready.driver);
    if (ready.resume_from) announce_resume(spec, *ready.resume_from);
  }
  const Placement placement = place(spec);
  SchedulerConfig scheduler_config = SchedulerConfig::from_spec(spec, self_executable());
  scheduler_config.wire_version = wire_version();  // this binary's workers speak it
  Scheduler scheduler(std::move(scheduler_config), placement);
  // The live dashboard reads the run directory from a thread of this process until the job
  // ends (logger.dashboard_port: -1 any free port, 0 none).
  std::unique_ptr<report::Dashboard> dashboard;
  if (const int64_t port = spec.get_int("logger.dashboard_port"); !smoke && port != 0) {
    dashboard = std::make_unique<report::Dashboard>(scheduler.config().run_dir,
                                                    port < 0 ? 0 : static_cast<int>(port));
    std::cout << "rlhf run: dashboard at " << dashboard->url() << " (while the job runs; `rlhf "
              << "report " << scheduler.config().run_dir << "` writes it as a file)" << std::endl;
  }
  if (!smoke && !resume) {
    if (auto kept = set_aside_previous_run(spec))
      std::cout << "rlhf run: an earlier run's metrics, plan and checkpoints were moved to "
                << *kept << std::endl;
  }
  if (!smoke) engine::write_run_plan(spec, scheduler.config().run_dir);  // planned beside measured
  scheduler.progress().attach(std::cout);
  if (const int code = supervise(scheduler, driver, spec, args.values("--set"), smoke); code != 0)
    return code;
  std::cout << "rlhf run: done, logs in " << scheduler.config().run_dir << "/logs\n";
  return 0;
}

}  // namespace rlhf::cli
