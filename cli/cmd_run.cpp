// `rlhf run SPEC`: check it as `rlhf validate` does (cli/preflight.h), place the workers, start
// and supervise them, run the job's driver (ppo, or dpo/sft/rm), stop everything. A worker
// failure the driver could not recover (docs/architecture.md, "Jobs that survive their
// workers") restarts the job from its newest checkpoint while fault.max_restarts allows, else
// stops it with exit 1 and a report naming the worker; SIGINT/SIGTERM with 130/143 and the
// checkpoint --resume would use. The internal --smoke-rounds runs the
// transport smoke driver (scheduler/smoke_driver.h) instead.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <vector>

#include "actors/wire_version.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/preflight.h"
#include "cli/spec_args.h"
#include "core/placement.h"
#include "core/run_dir.h"
#include "core/spec.h"
#include "core/timing.h"
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
// The steps after `step` run again: their earlier records go, so each step appears once in
// metrics.jsonl and samples.jsonl, and TensorBoard is told to drop their earlier events.
// Returns the metrics records dropped.
int64_t drop_records_after(const JobSpec& spec, int64_t step) {
  const fs::path dir = run_directory(spec);
  const int64_t dropped = report::drop_records_after((dir / "metrics.jsonl").string(), step);
  report::drop_records_after((dir / "samples.jsonl").string(), step);
  report::mark_resumed_after((dir / "tensorboard").string(), step);
  return dropped;
}

void announce_resume(const JobSpec& spec, const engine::DriverState& from) {
  for (const auto& c :
       engine::changed_settings(from.data.value("settings", nlohmann::json()), spec))
    std::cout << "rlhf run: --resume-changed: " << c << '\n';
  const std::string metrics = (fs::path(run_directory(spec)) / "metrics.jsonl").string();
  const int64_t dropped = drop_records_after(spec, from.step);
  std::cout << "rlhf run: resuming after step " << from.step << " from " << from.file;
  if (dropped > 0)
    std::cout << "; " << dropped << " metrics record" << (dropped == 1 ? "" : "s")
              << " of later steps dropped from " << metrics << " (those steps run again)";
  std::cout << std::endl;
}

// Starts the workers, runs the driver and stops them all, whatever happens: 0 when the job
// ended, its exit code when a worker failed (1: `failed` says so; the caller may restart the
// job) or a signal stopped it (128 + signal, with the checkpoint --resume would use).
struct Ended {
  int code = 0;
  bool failed = false;  // a worker failed (WorkerFailure)
  std::string cause;    // its report's first line
};

Ended supervise(Scheduler& scheduler, JobDriver& driver, const JobSpec& spec,
                const std::vector<std::string>& sets, bool smoke) {
  // Stops the progress line and every worker; the rendezvous files of the collective groups
  // (<run_dir>/stores) mean nothing once the workers are gone.
  const auto stop_all = [&] {
    scheduler.progress().end();
    scheduler.shutdown();
    std::error_code ec;
    fs::remove_all(fs::path(scheduler.config().run_dir) / "stores", ec);
  };
  try {
    scheduler.start();
    driver(scheduler, std::cout);
    stop_all();
  } catch (const WorkerFailure& e) {
    stop_all();
    std::cerr << "rlhf run: job failed: " << e.what() << "rlhf run: stopped every other worker\n";
    const std::string what = e.what();
    return {static_cast<int>(ExitCode::kRuntime), true, what.substr(0, what.find('\n'))};
  } catch (const JobInterrupted& e) {
    stop_all();
    std::cerr << "rlhf run: " << e.what() << "rlhf run: every worker stopped\n";
    if (!smoke) std::cerr << "rlhf run: " << resume_hint(spec, sets) << '\n';
    return {128 + e.signal(), false, {}};  // 130 for SIGINT, 143 for SIGTERM, as shells report
  } catch (...) {  // bad input found by a worker (exit 2), a driver error (exit 1): main reports
    stop_all();
    throw;
  }
  return {};
}

// fault.max_restarts for the whole job: a run whose worker failed (an actor or critic rank, or
// any worker its role could not bring back alone) starts again in this process from its newest
// complete checkpoint, while restarts are left in fault.restart_window_s.
// Before the first attempt: the live dashboard (logger.dashboard_port: -1 any free port, 0
// none; it reads the run directory from a thread of this process until the job ends), an
// earlier run's outputs set aside (unless resuming), and plan.json (planned beside measured).
std::unique_ptr<report::Dashboard> prepare_run_directory(const JobSpec& spec,
                                                         const Scheduler& scheduler, bool resume) {
  std::unique_ptr<report::Dashboard> dashboard;
  if (const int64_t port = spec.get_int("logger.dashboard_port"); port != 0) {
    dashboard = std::make_unique<report::Dashboard>(scheduler.config().run_dir,
                                                    port < 0 ? 0 : static_cast<int>(port));
    std::cout << "rlhf run: dashboard at " << dashboard->url() << " (while the job runs; `rlhf "
              << "report " << scheduler.config().run_dir << "` writes it as a file)" << std::endl;
  }
  if (!resume) {
    if (auto kept = set_aside_previous_run(spec))
      std::cout << "rlhf run: an earlier run's metrics, plan and checkpoints were moved to "
                << *kept << std::endl;
  }
  engine::write_run_plan(spec, scheduler.config().run_dir);
  return dashboard;
}

class JobRestarts {
 public:
  explicit JobRestarts(const JobSpec& spec)
      : max_(spec.get_int("fault.max_restarts")),
        window_(spec.get_float("fault.restart_window_s")),
        saves_(spec.get_int("ckpt.save_steps") > 0),
        started_(std::chrono::steady_clock::now()) {}

  // Whether to start again after `ended`; says why not on stderr. On yes, the run's records of
  // steps after the checkpoint go (as --resume drops them) and `resume` says whether there is
  // a checkpoint to continue from (none yet: from the start).
  bool again(const JobSpec& spec, const Ended& ended, bool& resume) {
    if (!ended.failed || max_ <= 0) return false;
    const double now = seconds_since(started_);
    at_.erase(std::remove_if(at_.begin(), at_.end(), [&](double t) { return t < now - window_; }),
              at_.end());
    if (!saves_) {
      std::cerr << "rlhf run: fault: not restarting: ckpt.save_steps is not set, so there is no "
                   "checkpoint to resume from\n";
      return false;
    }
    if (static_cast<int64_t>(at_.size()) >= max_) {
      std::cerr << "rlhf run: fault: not restarting: fault.max_restarts " << max_
                << " restarts of the job within fault.restart_window_s " << window_ << " s\n";
      return false;
    }
    at_.push_back(now);
    ++count_;
    // The workers' logs of this attempt stay beside the next one's.
    const fs::path run = run_directory(spec);
    const fs::path logs = run / "logs";
    std::error_code ec;
    fs::rename(logs, logs.string() + ".before-restart-" + std::to_string(count_), ec);
    const auto state =
        engine::latest_driver_state(checkpoint_directory(spec), engine::checkpointed_role(spec));
    resume = state.has_value();
    if (!resume) {  // no checkpoint yet: from the start, each step once in the records
      drop_records_after(spec, 0);
    }
    std::cout << "rlhf run: fault: restarting every worker (job restart " << at_.size() << " of "
              << max_ << " within " << window_ << " s) "
              << (resume ? "from checkpoint step " + std::to_string(state->step)
                         : std::string("from the start (no checkpoint yet)"))
              << "; the logs so far are in " << logs.string() << ".before-restart-" << count_
              << std::endl;
    const nlohmann::json line = {{"kind", "job"},
                                 {"cause", ended.cause},
                                 {"lost_at_s", now},
                                 {"resume_step", resume ? state->step : 0}};
    std::ofstream(run / "restarts.jsonl", std::ios::app) << line.dump() << '\n';
    return true;
  }
  int count() const { return count_; }

 private:
  int64_t max_;
  double window_;
  bool saves_;
  std::chrono::steady_clock::time_point started_;
  std::vector<double> at_;  // seconds since rlhf run started, within the window
  int count_ = 0;
};

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
           "supervises them, runs the job and stops every worker. A dead or silent worker is\n"
           "noticed within seconds: a rollout, ref, reward, teacher or judge worker is started\n"
           "again and catches up; a lost actor or critic rank restarts the job here from its\n"
           "newest checkpoint (fault.max_restarts per role, default 3; restarts.jsonl lists\n"
           "them); past that the job stops (exit 1) with the worker's role, rank, device, exit\n"
           "status and log tail. Ctrl-C stops the job (exit 130) and says which checkpoint\n"
           "--resume would continue from. Worker logs go to\n"
           "<logger.run_dir>/<name>/logs/<role>-<rank>.log.\n\n"
        << format_options(options);
    return 0;
  }
  const bool smoke = args.value("--smoke-rounds").has_value();
  const int rounds = smoke ? positive_int("--smoke-rounds", *args.value("--smoke-rounds")) : 1;
  bool resume = args.flag("--resume");
  if (args.flag("--resume-changed") && !resume)
    throw InputError("--resume-changed only goes with --resume");
  const JobSpec spec = load_spec_arg(args, "run");
  for (const auto& w : spec.warnings()) std::cerr << "rlhf run: warning: " << w << '\n';
  for (const auto& n : spec.notes()) std::cerr << "rlhf run: " << n << '\n';
  JobRestarts restarts(spec);
  std::map<std::string, int> worker_restarts;  // relaunched workers of earlier attempts, by role
  std::unique_ptr<report::Dashboard> dashboard;
  for (bool first = true;; first = false) {
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
    scheduler_config.job_restarts = restarts.count();
    scheduler_config.earlier_worker_restarts = worker_restarts;
    Scheduler scheduler(std::move(scheduler_config), placement);
    if (first && !smoke) dashboard = prepare_run_directory(spec, scheduler, resume);
    scheduler.progress().attach(std::cout);
    const Ended ended = supervise(scheduler, driver, spec, args.values("--set"), smoke);
    for (const auto& r : scheduler.restarts()) ++worker_restarts[role_name(r.role)];
    if (ended.code == 0) {
      std::cout << "rlhf run: done, logs in " << scheduler.config().run_dir << "/logs\n";
      return 0;
    }
    if (!smoke && restarts.again(spec, ended, resume)) continue;
    if (ended.failed && !smoke)
      std::cerr << "rlhf run: " << resume_hint(spec, args.values("--set")) << '\n';
    return ended.code;
  }
}

}  // namespace rlhf::cli
