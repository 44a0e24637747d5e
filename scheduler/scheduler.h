// The scheduler: launches one worker process per placed device, accepts their registration
// (job token), routes requests and replies over one ROUTER socket, sends heartbeats,
// notices a dead or silent worker within the timeout, and stops every worker on failure,
// SIGINT/SIGTERM or shutdown. Drivers reach workers through RoleGroup handles (role_group.h).
// All socket work happens on one I/O thread; driver threads only submit and wait.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/placement.h"
#include "core/spec.h"
#include "scheduler/busy_clock.h"
#include "scheduler/launcher.h"
#include "scheduler/progress.h"
#include "transport/message.h"

namespace rlhf {

class RoleGroup;
class WorkerProcess;
namespace transport {
class StoreServer;
}

struct SchedulerConfig {
  std::string bind_host = "127.0.0.1";  // cluster.interface
  // cluster.port_range: the worker endpoint takes the first free port in it, the
  // rendezvous store the next; both 0: any free port.
  uint16_t port_low = 0, port_high = 0;
  LauncherKind launcher = LauncherKind::kLocal;  // cluster.launcher
  bool curve = false;                            // cluster.curve: encrypt the worker sockets
  std::string token;  // the job token; "" makes a fresh one (RLHF_TOKEN for hand-joined jobs)
  std::string run_dir = "runs/job";  // logs go to <run_dir>/logs/<role>-<rank>.log
  std::string worker_program;        // the rlhf binary
  // The wire version workers must state at registration (actors/wire_version.h; the
  // driver's own): a worker of another build is refused by name.
  std::string wire_version;
  std::vector<std::string> worker_args = {"worker"};
  std::chrono::milliseconds heartbeat_interval{1000};  // scheduler.heartbeat_interval_s
  std::chrono::milliseconds worker_timeout{5000};      // scheduler.worker_timeout_s (0: none)
  std::chrono::milliseconds register_timeout{60000};   // launch -> registered (join_timeout_s)
  std::chrono::milliseconds request_timeout{600000};   // scheduler.request_timeout_s (0: none)
  std::chrono::milliseconds stop_grace{3000};          // shutdown message -> SIGTERM -> SIGKILL
  int max_inflight = 2;                                // requests in flight per worker
  MessageLimits limits;
  // fault.*: a lost worker of a role given allow_restarts() is relaunched on its device, at
  // most max_restarts times per role within restart_window; past that, or for any other role,
  // the job fails as before.
  int max_restarts = 0;
  std::chrono::milliseconds restart_window{3600000};
  // Given to every worker (RLHF_COLLECTIVE_TIMEOUT_MS): how long one collective may take.
  std::chrono::milliseconds collective_timeout{300000};
  // fault.step_timeout_s: requests in flight and none answered for this long is a hang (each
  // worker's operation in hand is reported); 0: never.
  std::chrono::milliseconds progress_timeout{0};
  // Restarts before this scheduler (rlhf run restarted every worker from a checkpoint): the
  // whole job's, and each role's relaunched workers', for fault_counts().
  int job_restarts = 0;
  std::map<std::string, int> earlier_worker_restarts;

  // From a validated spec (cluster.interface, logger.run_dir + name, scheduler.*).
  static SchedulerConfig from_spec(const JobSpec& spec, std::string worker_program);
};

// One worker as drivers and tests see it.
struct WorkerInfo {
  WorkerPlacement placement;
  int pid = -1;  // the current process's (a relaunched worker's is new)
  std::string log_path;
};

// A worker the scheduler relaunched (fault.max_restarts).
struct WorkerRestart {
  Role role = Role::kActor;
  int rank = 0;
  std::string cause;         // "killed by signal 9 (SIGKILL)", "stopped answering: ..."
  double lost_at_s = 0;      // seconds since start()
  double registered_s = -1;  // loss -> the new process registered (-1: not yet)
  double ready_s = -1;       // loss -> its role group revived it (-1: not yet), any wait for
                             // the group's next call included
  double revive_s = -1;      // the revival itself: its load replayed, a rollout's weights
};

// Whether `reply` is the error a request gets when its worker was lost (RoleGroup retries it
// or fails).
bool is_worker_lost(const Message& reply);

class Scheduler {
 public:
  using Clock = std::chrono::steady_clock;

  Scheduler(SchedulerConfig config, Placement placement);
  ~Scheduler();  // shutdown(); never throws
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Binds, launches every worker, writes <run_dir>/workers.json, and waits until all have
  // registered. Throws WorkerFailure (a worker died or did not register in time),
  // JobInterrupted (SIGINT/SIGTERM) or RuntimeError (bind/launch failed).
  void start();
  // Stops every worker (shutdown message, then SIGTERM and SIGKILL after the grace period)
  // and reaps them all. Idempotent; also what a failure or a signal triggers.
  void shutdown();

  RoleGroup& group(Role role);  // throws std::logic_error for a role without workers
  std::vector<Role> roles() const;
  const std::vector<WorkerInfo>& workers() const { return infos_; }
  // The tcp endpoint (for workers on other nodes); local workers get an ipc endpoint.
  const std::string& endpoint() const { return tcp_endpoint_; }
  const std::string& token() const { return token_; }
  // The scheduler's CURVE public key (Z85) when cluster.curve is on, else "".
  const std::string& curve_public_key() const { return curve_public_; }
  // Where collective group `group` ("actor", "weight_sync") meets: a prefix of the job's
  // rendezvous store (served here; it admits only clients that prove the job token), as a store
  // path for the workers' CollectiveConfig. Valid once start() has bound; the same group name gives
  // the same place.
  std::string rendezvous(const std::string& group) const;
  // The host name or address workers on other nodes connect to.
  const std::string& connect_host() const { return connect_host_; }
  const SchedulerConfig& config() const { return config_; }
  // The console progress of the job's long phases: drivers name phases, role groups count
  // finished calls; silent until attached (rlhf run attaches it to stdout).
  PhaseProgress& progress() { return progress_; }
  // Each worker's busy seconds so far (into workers()): the time it had a request in hand
  // (busy_clock.h). A step's share is the difference of two readings.
  std::vector<double> busy_seconds() const;
  // Each worker's busy intervals since `since` (BusyClock::intervals): seconds from `since`.
  std::vector<std::vector<std::pair<double, double>>> busy_intervals(Clock::time_point since);
  // Registration attempts refused so far (wrong token, unknown role/rank, duplicate).
  int refused_registrations() const { return refused_.load(); }

  // Fault tolerance. From now on a worker of `role` that dies or falls silent is relaunched
  // (SchedulerConfig::max_restarts): its requests in flight are answered with a "worker lost"
  // error (is_worker_lost), a new process starts with the same identity and device, and its
  // incarnation() goes up once it has registered. Its role group must bring it back to its
  // state before sending it work (RoleGroup::set_revive, which calls this).
  void allow_restarts(Role role);
  // How many times worker `index` was relaunched and registered again so far; +1 while a
  // relaunch has not registered yet (the incarnation to wait for).
  uint64_t incarnation(size_t index) const;
  // Waits until worker `index` serves in incarnation `at_least` or later. Throws as await_any.
  void await_serving(size_t index, uint64_t at_least, Clock::time_point deadline);
  // Worker `index`'s relaunch is done: its role group brought it back after a loss, the
  // revival (reload, weights) taking `revive_s`.
  void note_ready(size_t index, double revive_s);
  std::vector<WorkerRestart> restarts() const;
  // {"job": restarts of the whole job, "worker": {role: relaunched workers}} since rlhf run
  // started, for the step records.
  nlohmann::json fault_counts() const;

  // For RoleGroup: sends `request` (its id is assigned here and returned) to worker `index`
  // (into workers()). Throws when the job has failed or stopped.
  uint64_t submit(size_t index, Message request);
  // Waits for the reply to any of `ids`; returns which and the reply (kReply or kError).
  // Throws WorkerFailure / JobInterrupted when the job fails meanwhile, RuntimeError on the
  // deadline (naming the operation and worker).
  std::pair<uint64_t, Message> await_any(const std::vector<uint64_t>& ids,
                                         Clock::time_point deadline);
  // What await_any returns, or a partial reply (kPartial: part of a request's result sent
  // ahead of its reply, in the order sent) to one of `ids`, first when one is there.
  struct Progress {
    uint64_t id = 0;
    Message message;
    bool partial = false;
  };
  Progress await_progress(const std::vector<uint64_t>& ids, Clock::time_point deadline);
  // await_progress, but nullopt instead of an error at the deadline.
  std::optional<Progress> poll_progress(const std::vector<uint64_t>& ids,
                                        Clock::time_point deadline);

 private:
  std::optional<Progress> await(const std::vector<uint64_t>& ids, Clock::time_point deadline,
                                bool partials, bool throw_at_deadline);
  struct Io;  // sockets, processes and registration state: I/O thread only
  void io_loop();
  // start()'s parts, in order.
  void bind_endpoints();
  void launch_workers(const std::filesystem::path& logs);
  void write_worker_listing() const;
  void accept_registration(size_t i, const std::string& routing_id, int64_t pid,
                           const std::string& host);
  void on_incoming(Frames&& frames);
  void on_registration(const std::string& routing_id, Frames&& frames);
  void forward_request(Frames&& frames);
  bool supervise();  // false once the job has failed or been interrupted
  // Worker `index` was lost (`cause`): relaunches it (nullopt) when its role may restart;
  // otherwise returns why not, for the failure report ("" when the role is not restartable).
  std::optional<std::string> relaunch(size_t index, const std::string& cause);
  bool hung(Clock::time_point now);  // fault.step_timeout_s passed with nothing answered
  void append_restart_record(const WorkerRestart& r) const;  // <run_dir>/restarts.jsonl
  // When the job stops: the records of relaunches that never served again (ready_s -1).
  void record_unfinished_restarts();
  void credit_stall(std::chrono::steady_clock::time_point now);
  void stop_workers();
  void write_join_file() const;  // <run_dir>/join.json: endpoint, token, CURVE key (0600)
  // The failure text for worker `index`: its process's report, or for a worker this
  // scheduler did not start, its identity (role, rank, host).
  std::string report(size_t index, const std::string& what) const;
  void fail(std::string report, bool interrupted);
  [[noreturn]] void rethrow_failure_locked();

  SchedulerConfig config_;
  Placement placement_;
  std::string token_;
  std::string tcp_endpoint_;
  std::string connect_host_;
  std::string curve_public_;
  std::unique_ptr<transport::StoreServer> store_server_;
  std::map<size_t, std::string> remote_hosts_;  // worker index -> host it registered from
  std::map<size_t, int> step_pids_;  // srun-launched worker index -> pid it registered with
  std::string ipc_endpoint_;
  std::vector<WorkerInfo> infos_;
  std::map<Role, std::unique_ptr<RoleGroup>> groups_;
  std::unique_ptr<Io> io_;
  std::thread io_thread_;
  std::atomic<int> refused_{0};
  PhaseProgress progress_;
  std::atomic<bool> stop_requested_{false};

  std::mutex send_mutex_;     // guards the driver-side socket in io_
  mutable std::mutex mutex_;  // guards everything below
  std::condition_variable changed_;
  uint64_t next_id_ = 1;
  std::map<uint64_t, size_t> pending_;  // request id -> worker index
  std::map<uint64_t, std::string> pending_op_;
  std::map<uint64_t, Message> replies_;
  std::map<uint64_t, std::deque<Message>> partials_;  // kPartial messages not yet awaited
  std::map<uint64_t, Clock::time_point> pending_since_;
  Clock::time_point last_progress_;  // the last reply or partial (or first request in flight)
  Clock::time_point started_at_;
  std::set<Role> restartable_;
  std::vector<uint64_t> incarnation_;  // per worker: relaunches that registered
  std::vector<WorkerRestart> restarts_;
  std::map<size_t, size_t> restart_of_;  // worker index -> its latest entry in restarts_
  std::set<size_t> recorded_;            // entries of restarts_ in restarts.jsonl
  BusyClock busy_;                       // per worker: requests outstanding and busy seconds
  size_t registered_ = 0;
  std::optional<std::string> failure_;  // first failure report
  bool interrupted_ = false;
  int interrupt_signal_ = 0;  // SIGINT or SIGTERM when interrupted_
  bool stopped_ = false;      // every worker has been stopped and reaped
};

}  // namespace rlhf
