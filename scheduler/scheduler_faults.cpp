// Fault tolerance in the scheduler: a lost worker of a restartable role relaunched with its
// identity (its requests answered "worker lost", its restarts counted against
// fault.max_restarts), the restart records, and fault.step_timeout_s's hang report.
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>

#include "core/timing.h"
#include "scheduler/scheduler_io.h"

namespace rlhf {
namespace {

constexpr const char* kWorkerLost = "worker_lost";

}  // namespace

Message lost_reply(uint64_t id, const std::string& op, const std::string& why) {
  Message m = make_error(id, op, why);
  m.args = {{kWorkerLost, true}};
  return m;
}

bool is_worker_lost(const Message& reply) {
  return reply.kind == MessageKind::kError && reply.args.is_object() &&
         reply.args.value(kWorkerLost, false);
}

void Scheduler::allow_restarts(Role role) {
  std::lock_guard<std::mutex> lock(mutex_);
  restartable_.insert(role);
}

uint64_t Scheduler::incarnation(size_t index) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto r = restart_of_.find(index);
  const bool coming = r != restart_of_.end() && restarts_[r->second].registered_s < 0;
  return incarnation_.at(index) + (coming ? 1 : 0);
}

void Scheduler::await_serving(size_t index, uint64_t at_least, Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mutex_);
  while (incarnation_.at(index) < at_least) {
    if (failure_) rethrow_failure_locked();
    if (stopped_) throw RuntimeError("the scheduler has stopped");
    if (changed_.wait_until(lock, deadline) == std::cv_status::timeout && Clock::now() >= deadline)
      throw RuntimeError(infos_[index].placement.label() +
                         " did not come back before its deadline");
  }
}

void Scheduler::note_ready(size_t index, double revive_s) {
  WorkerRestart done;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto r = restart_of_.find(index);
    if (r == restart_of_.end() || restarts_[r->second].ready_s >= 0) return;
    WorkerRestart& back = restarts_[r->second];
    back.ready_s = seconds_since(started_at_) - back.lost_at_s;
    back.revive_s = revive_s;
    done = back;
    recorded_.insert(r->second);
  }
  std::cerr << "rlhf run: fault: " << infos_[index].placement.label() << " serves again, "
            << std::fixed << std::setprecision(2) << done.ready_s << " s after it was lost ("
            << done.revive_s << " s to reload it)" << std::defaultfloat << std::endl;
  append_restart_record(done);
}

std::vector<WorkerRestart> Scheduler::restarts() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return restarts_;
}

nlohmann::json Scheduler::fault_counts() const {
  std::lock_guard<std::mutex> lock(mutex_);
  nlohmann::json worker = nlohmann::json::object();
  for (const auto& [role, n] : config_.earlier_worker_restarts) worker[role] = n;
  for (const auto& r : restarts_)
    worker[role_name(r.role)] = worker.value(role_name(r.role), 0) + 1;
  return {{"job", config_.job_restarts}, {"worker", worker}};
}

void Scheduler::record_unfinished_restarts() {
  std::vector<WorkerRestart> left;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t k = 0; k < restarts_.size(); ++k)
      if (recorded_.insert(k).second) left.push_back(restarts_[k]);
  }
  for (const auto& r : left) append_restart_record(r);
}

void Scheduler::append_restart_record(const WorkerRestart& r) const {
  // lost_at_s counts from this scheduler's start: after job restart k (job_restart), from
  // that attempt's.
  const nlohmann::json line = {
      {"kind", "worker"},     {"role", role_name(r.role)}, {"rank", r.rank},
      {"cause", r.cause},     {"lost_at_s", r.lost_at_s},  {"registered_s", r.registered_s},
      {"ready_s", r.ready_s}, {"revive_s", r.revive_s},    {"job_restart", config_.job_restarts}};
  std::ofstream(std::filesystem::path(config_.run_dir) / "restarts.jsonl", std::ios::app)
      << line.dump() << '\n';
}

// On the I/O thread. The old process is gone (exited, or killed for its silence): its requests
// in flight are answered "worker lost", its log is kept as <log>.<n>, and the same command
// starts again with the same identity and environment; it must register within
// register_timeout like any worker, or the job stops.
std::optional<std::string> Scheduler::relaunch(size_t i, const std::string& cause) {
  const WorkerPlacement& p = infos_[i].placement;
  auto& slot = io_->slots[i];
  if (!io_->processes[i] || !slot.routing_id) return "";  // started by hand, or never served
  const auto now = Clock::now();
  std::string history;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!restartable_.count(p.role) || config_.max_restarts <= 0) return "";
    const double at = seconds_since(started_at_);
    const double window = std::chrono::duration<double>(config_.restart_window).count();
    int recent = 0;
    for (const auto& r : restarts_) {
      if (r.role != p.role) continue;
      recent += r.lost_at_s >= at - window;
      history += "  restart of " + std::string(role_name(r.role)) + "[" + std::to_string(r.rank) +
                 "] at " + std::to_string(static_cast<int64_t>(r.lost_at_s)) + " s: " + r.cause +
                 "\n";
    }
    if (recent >= config_.max_restarts)
      return "  no restart left: fault.max_restarts " + std::to_string(config_.max_restarts) +
             " for " + role_name(p.role) + " within fault.restart_window_s " +
             std::to_string(static_cast<int64_t>(window)) + ", after:\n" + history;
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->second != i) {
        ++it;
        continue;
      }
      replies_[it->first] = lost_reply(it->first, pending_op_[it->first], p.label() + " " + cause);
      pending_since_.erase(it->first);
      busy_.finished(i, now);
      it = pending_.erase(it);
    }
    restarts_.push_back({p.role, p.rank, cause, at, -1, -1, -1});
    restart_of_[i] = restarts_.size() - 1;
    changed_.notify_all();
  }
  io_->by_routing_id.erase(*slot.routing_id);
  slot.routing_id.reset();
  io_->processes[i].reset();  // reaps it (SIGKILL first if it still runs)
  const std::string& log = infos_[i].log_path;
  const std::string kept = log + "." + std::to_string(++slot.relaunches);
  std::error_code ec;
  std::filesystem::rename(log, kept, ec);
  std::cerr << "rlhf run: fault: " << p.label() << " " << cause << ": restarting it on "
            << (p.env.count(kEnvDevice) ? p.env.at(kEnvDevice) : p.host)
            << " (its log so far: " << kept << ")" << std::endl;
  io_->processes[i] = std::make_unique<WorkerProcess>(p, slot.program, slot.args, slot.env, log);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    infos_[i].pid = io_->processes[i]->pid();
  }
  step_pids_.erase(i);
  slot.exited = false;
  slot.launched = slot.last_seen = Clock::now();
  write_worker_listing();
  return std::nullopt;
}

// fault.step_timeout_s: requests in flight and none answered for that long. Every worker's
// operation in hand goes to the console and into the failure.
bool Scheduler::hung(Clock::time_point now) {
  if (config_.progress_timeout.count() <= 0) return false;
  std::string in_hand;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (pending_.empty() || now - last_progress_ < config_.progress_timeout) return false;
    for (const auto& [id, index] : pending_)
      in_hand += "  " + infos_[index].placement.label() + ": \"" + pending_op_[id] + "\" for " +
                 std::to_string(static_cast<int64_t>(
                     std::chrono::duration<double>(now - pending_since_[id]).count())) +
                 " s (pid " + std::to_string(infos_[index].pid) + ")\n";
  }
  const std::string text =
      "no request answered for " +
      std::to_string(
          static_cast<int64_t>(std::chrono::duration<double>(config_.progress_timeout).count())) +
      " s (fault.step_timeout_s): the job is hung; operations in hand:\n" + in_hand;
  std::cerr << "rlhf run: " << text << std::flush;
  fail(text, false);
  return true;
}

}  // namespace rlhf
