#include "runtime/job_runtime.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <future>
#include <iomanip>
#include <map>
#include <mutex>
#include <sstream>
#include <utility>

#include "core/errors.h"
#include "core/run_dir.h"
#include "core/timing.h"
#include "engine/memory_check.h"
#include "engine/worker_ops.h"
#include "models/pretrained.h"
#include "report/metrics.h"
#include "scheduler/peak_memory.h"
#include "scheduler/progress.h"
#include "scheduler/role_group.h"
#include "scheduler/scheduler.h"

namespace rlhf::runtime {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

std::string fixed(double v, int precision) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(precision) << v;
  return o.str();
}

RuntimeSettings RuntimeSettings::from_spec(const JobSpec& spec, std::string kind) {
  RuntimeSettings r;
  r.kind = std::move(kind);
  r.run_dir = run_directory(spec);
  r.ckpt_path = checkpoint_directory(spec);
  r.save_steps = spec.get_int("ckpt.save_steps");
  r.max_ckpt = spec.get_int("ckpt.max_num");
  r.save_only_model = spec.get_bool("ckpt.save_only_model");
  r.export_hf = spec.get_bool("ckpt.export_hf");
  r.logging_steps = spec.get_int("logger.logging_steps");
  r.tensorboard = spec.get_bool("logger.tensorboard");
  r.trajectory_settings = engine::trajectory_settings(spec);
  return r;
}

JobRuntime::JobRuntime(RuntimeSettings settings) : settings_(std::move(settings)) {}
JobRuntime::~JobRuntime() = default;

std::ostream& JobRuntime::say(std::ostream& out) const {
  return out << settings_.kind << ": ";
}

report::MetricsSink& JobRuntime::open_metrics() {
  planned_ = engine::planned_roles(settings_.run_dir);
  metrics_ = std::make_unique<report::MetricsSink>(
      (fs::path(settings_.run_dir) / "metrics.jsonl").string(), settings_.tensorboard);
  return *metrics_;
}

report::MetricsSink& JobRuntime::metrics() {
  if (!metrics_) throw std::logic_error("JobRuntime::metrics before open_metrics");
  return *metrics_;
}

json JobRuntime::memory(Scheduler& s) const {
  return peak_memory_by_role(s, planned_);
}

void JobRuntime::start_roles(Scheduler& s, const std::function<RoleStart(RoleGroup&)>& start,
                             std::ostream& out) const {
  const auto t0 = Clock::now();
  std::mutex out_mutex;  // roles finish on their own threads
  std::vector<std::future<void>> calls;
  for (Role role : s.roles()) {
    RoleGroup& g = s.group(role);
    RoleStart started = start(g);
    say(out) << "loading " << role_name(role) << " (" << started.workers << ")" << std::endl;
    calls.push_back(std::async(std::launch::async,
                               [this, &g, &out, &out_mutex, t0, load = std::move(started.load)] {
                                 load();
                                 std::lock_guard<std::mutex> lock(out_mutex);
                                 say(out) << role_name(g.role()) << " ready after "
                                          << fixed(seconds_since(t0), 1) << " s" << std::endl;
                               }));
  }
  for (auto& c : calls) c.get();
}

RoleStart JobRuntime::init_role(Scheduler& s, RoleGroup& g,
                                const std::map<Role, engine::ModelRoleConfig>& roles,
                                int64_t global_batch, int64_t micro_batch) const {
  auto found = roles.find(g.role());
  if (found == roles.end())
    throw RuntimeError(kind() + ": no config for the " + role_name(g.role()) + " group");
  ops::Init request{found->second, s.rendezvous(role_name(g.role()))};
  if (request.config.trainer)  // micro batches per optimizer step on each rank
    request.config.trainer->grad_accum_steps =
        std::max<int64_t>(1, global_batch / (micro_batch * g.size()));
  const bool alone = !request.config.trainer && !(request.config.shard_weights && g.size() > 1);
  std::function<void(int)> reload;
  if (alone) reload = [&g, request](int rank) { g.call(rank, request); };
  return {std::to_string(g.size()) + " worker" + (g.size() == 1 ? "" : "s"),
          [&g, request] { g.call_all(request); }, reload};
}

bool JobRuntime::logs_at(int64_t step, int64_t total_steps) const {
  return step % settings_.logging_steps == 0 || step == total_steps;
}

bool JobRuntime::saves_at(int64_t step, int64_t total_steps) const {
  return (settings_.save_steps > 0 && step % settings_.save_steps == 0) || step == total_steps;
}

void JobRuntime::save(Scheduler& s, int64_t step, const std::vector<Role>& trained,
                      const json& state, std::ostream& out) const {
  const std::string tag = "global_step" + std::to_string(step);
  const auto t0 = Clock::now();
  say(out) << "saving the checkpoint of step " << step << " to " << settings_.ckpt_path
           << std::endl;
  s.progress().begin("saving the checkpoint of step " + std::to_string(step));
  std::vector<std::future<void>> calls;
  for (Role role : trained) {
    const ops::Save request{(fs::path(settings_.ckpt_path) / role_name(role) / tag).string(),
                            settings_.save_only_model, static_cast<int>(settings_.max_ckpt)};
    calls.push_back(
        std::async(std::launch::async, [&s, role, request] { s.group(role).call_all(request); }));
  }
  for (auto& c : calls) c.get();
  // The driver's own state last: its presence marks the whole step's checkpoint complete.
  const std::string file = engine::write_driver_state(
      settings_.ckpt_path, step, state, settings_.trajectory_settings, settings_.max_ckpt);
  s.progress().end();
  say(out) << "checkpoint of step " << step << " saved in " << fixed(seconds_since(t0), 1) << " s ("
           << file << ")" << std::endl;
}

engine::DriverState JobRuntime::resume(Scheduler& s, const std::vector<Role>& trained,
                                       std::ostream& out) const {
  const auto state = engine::latest_driver_state(settings_.ckpt_path, trained.at(0));
  if (!state) throw InputError("--resume: no complete checkpoint under " + settings_.ckpt_path);
  s.progress().begin("loading the checkpoint");
  std::vector<std::future<void>> calls;
  for (Role role : trained) {
    const ops::Load request{
        (fs::path(settings_.ckpt_path) / role_name(role) / state->tag).string()};
    calls.push_back(
        std::async(std::launch::async, [&s, role, request] { s.group(role).call_all(request); }));
  }
  for (auto& c : calls) c.get();
  say(out) << "resumed after step " << state->step << " from " << settings_.ckpt_path << std::endl;
  return *state;
}

std::string JobRuntime::export_model(Scheduler& s, Role role, const std::string& tokenizer_from,
                                     std::ostream& out) const {
  const std::string dir = (fs::path(settings_.run_dir) / "export" / role_name(role)).string();
  say(out) << "exporting the trained " << role_name(role) << " to " << dir << std::endl;
  s.progress().begin(std::string("exporting the ") + role_name(role));
  s.group(role).call_all(ops::ExportHf{dir});
  s.progress().end();
  // The chat template comes along too (chat_template.jinja): a conversation-trained export
  // is the next job's model.
  models::copy_tokenizer_files(tokenizer_from, dir);
  say(out) << "trained " << role_name(role) << " exported to " << dir << std::endl;
  return dir;
}

StepClock::StepClock(int64_t first_step, int64_t total_steps)
    : start_(Clock::now()), first_(first_step), total_(total_steps) {}

std::string StepClock::after(int64_t step) const {
  return elapsed_and_eta(seconds_since(start_), step - first_ + 1, total_ - first_ + 1);
}

BusyWindow::BusyWindow(const Scheduler& s)
    : start_(s.busy_seconds()), started_(std::chrono::steady_clock::now()) {}

namespace {

// The union of intervals, sorted and merged, each end rounded to 0.1 ms.
nlohmann::json lane(std::vector<std::pair<double, double>> intervals, double seconds) {
  std::sort(intervals.begin(), intervals.end());
  std::vector<std::pair<double, double>> merged;
  for (auto [from, to] : intervals) {
    to = std::min(to, seconds);
    if (to <= from) continue;
    if (!merged.empty() && from <= merged.back().second)
      merged.back().second = std::max(merged.back().second, to);
    else
      merged.emplace_back(from, to);
  }
  nlohmann::json out = nlohmann::json::array();
  auto round = [](double x) { return std::round(x * 1e4) / 1e4; };
  for (const auto& [from, to] : merged)
    if (round(to) > round(from)) out.push_back({round(from), round(to)});
  return out;
}

}  // namespace

nlohmann::json BusyWindow::since(Scheduler& s, double seconds) const {
  const auto intervals = s.busy_intervals(started_);
  std::map<std::string, std::vector<std::pair<double, double>>> by_lane;
  for (size_t i = 0; i < intervals.size(); ++i) {
    auto& l = by_lane[role_name(s.workers()[i].placement.role)];
    l.insert(l.end(), intervals[i].begin(), intervals[i].end());
  }
  nlohmann::json timeline = nlohmann::json::object();
  for (auto& [role, l] : by_lane) timeline[role] = lane(std::move(l), seconds);
  const std::vector<double> now = s.busy_seconds();
  std::map<std::string, std::pair<double, int>> by_role;  // busy seconds summed, workers
  double busy = 0;
  for (size_t i = 0; i < now.size() && i < start_.size(); ++i) {
    const double d = std::clamp(now[i] - start_[i], 0.0, seconds);
    auto& [sum, n] = by_role[role_name(s.workers()[i].placement.role)];
    sum += d;
    ++n;
    busy += d;
  }
  nlohmann::json busy_s = nlohmann::json::object(), idle_s = nlohmann::json::object();
  for (const auto& [role, v] : by_role) {
    busy_s[role] = v.first / v.second;
    idle_s[role] = std::max(0.0, seconds - v.first / v.second);
  }
  const double capacity = seconds * static_cast<double>(now.size());
  return {{"busy_s", busy_s},
          {"idle_s", idle_s},
          {"devices_busy", capacity > 0 ? busy / capacity : 0.0},
          {"timeline", std::move(timeline)}};
}

}  // namespace rlhf::runtime
