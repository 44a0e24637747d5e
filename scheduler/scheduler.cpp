// Scheduler: launch, registration handshake, request routing, heartbeats, supervision and
// stopping, all on the I/O thread; drivers talk to it through submit() and await_any().
#include "scheduler/scheduler.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "core/host.h"
#include "core/timing.h"
#include "scheduler/role_group.h"
#include "scheduler/scheduler_io.h"
#include "scheduler/slurm_launcher.h"
#include "scheduler/worker_process.h"
#include "transport/channel.h"
#include "transport/job_token.h"
#include "transport/store.h"

namespace rlhf {
namespace {

using std::chrono::milliseconds;
using Clock = Scheduler::Clock;
constexpr const char* kOutbox = "inproc://rlhf-scheduler-outbox";

bool is_local_host(const std::string& host) {
  if (host.empty() || host == "127.0.0.1" || host == "localhost" || host == "::1") return true;
  return host_name() == host;
}

bool is_wildcard(const std::string& host) {
  return host == "0.0.0.0" || host == "*" || host == "::";
}

std::string this_host_name() {
  const auto name = host_name();
  if (!name) throw RuntimeError("gethostname failed");
  return *name;
}

// `host` as a numeric IPv4 address: ZeroMQ binds only to addresses and interface names, while
// cluster.interface may be a host name (a Slurm node name). Throws naming the key when it
// does not resolve here.
std::string numeric_address(const std::string& host) {
  if (is_wildcard(host)) return host;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (rc != 0)
    throw RuntimeError("cluster.interface \"" + host +
                       "\" does not resolve to an IPv4 address on this host: " + gai_strerror(rc));
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> owned(found, &::freeaddrinfo);
  char text[INET_ADDRSTRLEN] = {};
  const auto* in = reinterpret_cast<const sockaddr_in*>(found->ai_addr);
  if (!::inet_ntop(AF_INET, &in->sin_addr, text, sizeof text))
    throw RuntimeError("cluster.interface \"" + host + "\": inet_ntop: " + std::strerror(errno));
  return text;
}

// Binds `socket` to `host` at the first free port of [low, high] (both 0: any free port).
std::string bind_in_range(Channel& socket, const std::string& host, uint16_t low, uint16_t high) {
  if (low == 0 && high == 0) return socket.bind(tcp_wildcard(is_wildcard(host) ? "*" : host));
  std::string last;
  for (uint32_t p = low; p <= high; ++p) {
    try {
      return socket.bind("tcp://" + (is_wildcard(host) ? std::string("*") : host) + ":" +
                         std::to_string(p));
    } catch (const std::exception& e) {
      last = e.what();
    }
  }
  throw RuntimeError("cluster.port_range " + std::to_string(low) + "-" + std::to_string(high) +
                     ": no free port on " + host + " (" + last + ")");
}

zmq::message_t index_frame(size_t index) {
  uint64_t v = index;
  return zmq::message_t(&v, sizeof v);
}

std::string as_string(const zmq::message_t& m) {
  return std::string(static_cast<const char*>(m.data()), m.size());
}

}  // namespace

Scheduler::Scheduler(SchedulerConfig config, Placement placement)
    : config_(std::move(config)), placement_(std::move(placement)) {}

std::string Scheduler::rendezvous(const std::string& group) const {
  if (!store_server_) throw std::logic_error("Scheduler::rendezvous before start()");
  return store_server_->url(connect_host_, group).text();
}

Scheduler::~Scheduler() {
  try {
    shutdown();
  } catch (const std::exception& e) {
    std::cerr << "rlhf scheduler: error while stopping workers: " << e.what() << std::endl;
  }
}

std::vector<Role> Scheduler::roles() const {
  std::vector<Role> out;
  for (const auto& [role, g] : groups_) out.push_back(role);
  return out;
}

RoleGroup& Scheduler::group(Role role) {
  auto it = groups_.find(role);
  if (it == groups_.end())
    throw std::logic_error(std::string("this job has no ") + role_name(role) + " workers");
  return *it->second;
}

// The worker endpoint (TCP and IPC, with CURVE when asked), the rendezvous store, the
// driver's own channels and the signal handler.
void Scheduler::bind_endpoints() {
  namespace fs = std::filesystem;
  io_ = std::make_unique<Io>();
  io_->router = std::make_unique<Channel>(io_->context, zmq::socket_type::router, milliseconds(0));
  if (config_.curve) {
    if (!zmq_has("curve"))
      throw RuntimeError(
          "cluster.curve is on but this libzmq has no CURVE (built without "
          "libsodium)");
    char public_key[41] = {}, secret_key[41] = {};
    if (zmq_curve_keypair(public_key, secret_key) != 0)
      throw RuntimeError(std::string("zmq_curve_keypair: ") + zmq_strerror(zmq_errno()));
    curve_public_ = public_key;
    io_->router->socket().set(zmq::sockopt::curve_server, 1);
    io_->router->socket().set(zmq::sockopt::curve_secretkey, std::string(secret_key));
  }
  io_->router->set_max_message_size(config_.limits.max_total_bytes +
                                    config_.limits.max_header_bytes);
  // Workers and collective groups reach the driver at the address it bound, the same on
  // every node whichever way the name resolves there.
  const std::string bind_address = numeric_address(config_.bind_host);
  tcp_endpoint_ = bind_in_range(*io_->router, bind_address, config_.port_low, config_.port_high);
  connect_host_ = is_wildcard(bind_address) ? this_host_name() : bind_address;
  if (is_wildcard(bind_address))
    tcp_endpoint_ = "tcp://" + connect_host_ + tcp_endpoint_.substr(tcp_endpoint_.rfind(':'));
  // The rendezvous store: in the range after the worker endpoint's port.
  const auto zmq_port =
      static_cast<uint16_t>(std::stoi(tcp_endpoint_.substr(tcp_endpoint_.rfind(':') + 1)));
  const bool ranged = config_.port_low != 0 || config_.port_high != 0;
  if (ranged && zmq_port >= config_.port_high)
    throw RuntimeError("cluster.port_range " + std::to_string(config_.port_low) + "-" +
                       std::to_string(config_.port_high) +
                       ": no port left for the rendezvous store after the worker endpoint's " +
                       std::to_string(zmq_port));
  store_server_ = std::make_unique<transport::StoreServer>(
      is_wildcard(bind_address) ? "0.0.0.0" : bind_address,
      ranged ? static_cast<uint16_t>(zmq_port + 1) : 0, ranged ? config_.port_high : 0, token_);
  io_->ipc_path = (fs::temp_directory_path() /
                   ("rlhf-" + std::to_string(getpid()) + "-" + token_.substr(0, 12) + ".sock"))
                      .string();
  ipc_endpoint_ = io_->router->bind("ipc://" + io_->ipc_path);
  io_->inbox = std::make_unique<Channel>(io_->context, zmq::socket_type::pull, milliseconds(0));
  io_->inbox->bind(kOutbox);
  io_->outbox = std::make_unique<Channel>(io_->context, zmq::socket_type::push, milliseconds(0));
  io_->outbox->connect(kOutbox);
  io_->signals = std::make_unique<boost::asio::signal_set>(io_->asio, SIGINT, SIGTERM);
  io_->signals->async_wait([this](const boost::system::error_code& error, int signo) {
    if (!error) io_->signal_received = signo;
  });
}

// One worker process per placed worker (or a slot for one started by hand), and the role
// groups over them.
void Scheduler::launch_workers(const std::filesystem::path& logs) {
  namespace fs = std::filesystem;
  std::map<Role, std::vector<size_t>> members;
  std::vector<std::string> allocation;
  if (config_.launcher == LauncherKind::kSlurm) allocation = slurm_allocation_hosts();
  if (config_.launcher != LauncherKind::kLocal) write_join_file();
  for (const auto& w : placement_.workers) {
    const std::string log =
        (logs / (std::string(role_name(w.role)) + "-" + std::to_string(w.rank) + ".log")).string();
    std::vector<std::pair<std::string, std::string>> env = {
        {kEnvScheduler, ipc_endpoint_},
        {kEnvToken, token_},
        {kEnvRunDir, config_.run_dir},
        {transport::kEnvCollectiveHost, w.host},
        {transport::kEnvCollectiveTimeout, std::to_string(config_.collective_timeout.count())}};
    if (config_.curve) env.emplace_back("RLHF_CURVE_SERVER_KEY", curve_public_);
    Io::Slot slot{std::nullopt, Clock::now(), Clock::now(), false, {}, {}, env};
    if (config_.launcher == LauncherKind::kLocal) {
      if (!is_local_host(w.host))
        throw RuntimeError("worker " + w.label() + " is placed on host " + w.host +
                           ": cluster.launcher \"local\" starts workers on this host only "
                           "(use \"slurm\" or \"manual\")");
      slot.program = config_.worker_program;
      slot.args = config_.worker_args;
      io_->processes.push_back(
          std::make_unique<WorkerProcess>(w, slot.program, slot.args, env, log));
    } else if (config_.launcher == LauncherKind::kSlurm) {
      if (std::find(allocation.begin(), allocation.end(), w.host) == allocation.end())
        throw InputError("worker " + w.label() + " is placed on host " + w.host +
                         ", which is not in this Slurm allocation (SLURM_JOB_NODELIST)");
      env[0].second = tcp_endpoint_;
      int node_gpus = 0;
      for (const auto& node : placement_.nodes)
        if (node.name == w.node) node_gpus = node.devices;
      const SlurmStep step = slurm_step(w, node_gpus, config_.worker_program, tcp_endpoint_);
      slot.env = env;
      slot.program = step.program;
      slot.args = step.args;
      io_->processes.push_back(
          std::make_unique<WorkerProcess>(w, step.program, step.args, env, log));
    } else {
      io_->processes.push_back(nullptr);  // started by hand: only heartbeats tell it lives
    }
    io_->slots.push_back(std::move(slot));
    infos_.push_back({w, io_->processes.back() ? io_->processes.back()->pid() : -1, log});
    members[w.role].push_back(infos_.size() - 1);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      busy_.resize(infos_.size());
      incarnation_.resize(infos_.size(), 0);
    }
  }
  if (config_.launcher == LauncherKind::kManual)
    std::cerr << "rlhf run: waiting up to " << config_.register_timeout.count() / 1000 << " s for "
              << infos_.size() << " workers: start each with `" << config_.worker_program
              << " worker --connect " << tcp_endpoint_ << " --join-file "
              << (fs::path(config_.run_dir) / "join.json").string()
              << "` (or RLHF_TOKEN in its environment)" << std::endl;
  for (auto& [role, indices] : members)
    groups_[role] = std::make_unique<RoleGroup>(*this, role, indices);
}

// <run_dir>/workers.json: each worker's role, rank, pid, host, device and log.
void Scheduler::write_worker_listing() const {
  namespace fs = std::filesystem;
  nlohmann::json listing = nlohmann::json::array();
  for (const auto& info : infos_)
    listing.push_back(
        {{"role", role_name(info.placement.role)},
         {"rank", info.placement.rank},
         {"pid", info.pid},
         {"host", info.placement.host},
         {"device", info.placement.env.count(kEnvDevice) ? info.placement.env.at(kEnvDevice) : ""},
         {"log", info.log_path}});
  std::ofstream(fs::path(config_.run_dir) / "workers.json") << listing.dump(2) << '\n';
}

void Scheduler::start() {
  namespace fs = std::filesystem;
  if (config_.worker_program.empty())
    throw std::logic_error("SchedulerConfig.worker_program is empty");
  if (config_.wire_version.empty())
    throw std::logic_error("SchedulerConfig.wire_version is empty (actors/wire_version.h)");
  const fs::path logs = fs::path(config_.run_dir) / "logs";
  std::error_code ec;
  fs::create_directories(logs, ec);
  if (ec) throw RuntimeError("cannot create " + logs.string() + ": " + ec.message());
  token_ = config_.token.empty() ? make_job_token() : config_.token;
  bind_endpoints();
  launch_workers(logs);
  write_worker_listing();
  io_->next_heartbeat = Clock::now() + config_.heartbeat_interval;
  io_->last_pass = Clock::now();
  started_at_ = last_progress_ = Clock::now();
  io_thread_ = std::thread([this] { io_loop(); });
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return registered_ == infos_.size() || failure_ || stopped_; });
  if (failure_) rethrow_failure_locked();
  if (stopped_) throw RuntimeError("the scheduler stopped before every worker registered");
}

void Scheduler::write_join_file() const {
  namespace fs = std::filesystem;
  const fs::path path = fs::path(config_.run_dir) / "join.json";
  nlohmann::json join = {{"endpoint", tcp_endpoint_}, {"token", token_}};
  if (config_.curve) join["curve_server_key"] = curve_public_;
  // Owner-only: the token is what admits a worker.
  const mode_t old_mask = ::umask(077);
  std::ofstream out(path);
  ::umask(old_mask);
  out << join.dump(2) << '\n';
  if (!out) throw RuntimeError("cannot write " + path.string());
  ::chmod(path.c_str(), 0600);
}

void Scheduler::shutdown() {
  stop_requested_ = true;
  if (io_thread_.joinable()) io_thread_.join();
  if (io_) {
    io_->processes.clear();  // kills and reaps anything still running (launch failed midway)
    if (!io_->ipc_path.empty()) ::unlink(io_->ipc_path.c_str());
    io_->ipc_path.clear();
  }
  store_server_.reset();  // after the workers: nobody is left to meet there
  std::lock_guard<std::mutex> lock(mutex_);
  stopped_ = true;
  changed_.notify_all();
}

void Scheduler::fail(std::string report, bool interrupted) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!failure_) {
    failure_ = std::move(report);
    interrupted_ = interrupted;
  }
  changed_.notify_all();
}

void Scheduler::rethrow_failure_locked() {
  if (interrupted_) throw JobInterrupted(*failure_, interrupt_signal_);
  throw WorkerFailure(*failure_);
}

std::vector<double> Scheduler::busy_seconds() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return busy_.seconds(Clock::now());
}

std::vector<std::vector<std::pair<double, double>>> Scheduler::busy_intervals(
    Clock::time_point since) {
  std::lock_guard<std::mutex> lock(mutex_);
  return busy_.intervals(since, Clock::now());
}

uint64_t Scheduler::submit(size_t index, Message request) {
  uint64_t id;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failure_) rethrow_failure_locked();
    if (stopped_ || !io_) throw RuntimeError("the scheduler is not running");
    id = next_id_++;
    const auto now = Clock::now();
    if (pending_.empty()) last_progress_ = now;  // idle time is not a hang
    pending_[id] = index;
    pending_op_[id] = request.op;
    pending_since_[id] = now;
    busy_.started(index, now);
  }
  request.kind = MessageKind::kRequest;
  request.id = id;
  Frames frames = encode(request);
  frames.insert(frames.begin(), index_frame(index));
  std::lock_guard<std::mutex> lock(send_mutex_);
  io_->outbox->send(std::move(frames));
  return id;
}

std::pair<uint64_t, Message> Scheduler::await_any(const std::vector<uint64_t>& ids,
                                                  Clock::time_point deadline) {
  Progress p = *await(ids, deadline, false, true);
  return {p.id, std::move(p.message)};
}

Scheduler::Progress Scheduler::await_progress(const std::vector<uint64_t>& ids,
                                              Clock::time_point deadline) {
  return *await(ids, deadline, true, true);
}

std::optional<Scheduler::Progress> Scheduler::poll_progress(const std::vector<uint64_t>& ids,
                                                            Clock::time_point deadline) {
  return await(ids, deadline, true, false);
}

std::optional<Scheduler::Progress> Scheduler::await(const std::vector<uint64_t>& ids,
                                                    Clock::time_point deadline, bool partials,
                                                    bool throw_at_deadline) {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    if (partials)
      for (uint64_t id : ids) {
        auto it = partials_.find(id);
        if (it == partials_.end() || it->second.empty()) continue;
        Progress out{id, std::move(it->second.front()), true};
        it->second.pop_front();
        return out;
      }
    for (uint64_t id : ids) {
      auto it = replies_.find(id);
      if (it == replies_.end()) continue;
      Progress out{id, std::move(it->second), false};
      replies_.erase(it);
      pending_op_.erase(id);
      partials_.erase(id);  // parts nobody asked for (await_any) go with the reply
      return out;
    }
    if (failure_) rethrow_failure_locked();
    if (stopped_) throw RuntimeError("the scheduler has stopped");
    if (deadline == Clock::time_point::max()) {
      changed_.wait(lock);
    } else if (changed_.wait_until(lock, deadline) == std::cv_status::timeout &&
               Clock::now() >= deadline) {
      if (!throw_at_deadline) return std::nullopt;
      const uint64_t id = ids.empty() ? 0 : ids.front();
      std::string who = pending_.count(id) ? infos_[pending_[id]].placement.label() : "?";
      throw RuntimeError("operation \"" + pending_op_[id] + "\" on " + who + " (request " +
                         std::to_string(id) + ") got no reply before its deadline");
    }
  }
}

}  // namespace rlhf

namespace rlhf {

void Scheduler::io_loop() {
  try {
    while (!stop_requested_) {
      zmq::pollitem_t items[] = {{io_->router->socket().handle(), 0, ZMQ_POLLIN, 0},
                                 {io_->inbox->socket().handle(), 0, ZMQ_POLLIN, 0}};
      zmq::poll(items, 2, milliseconds(20));
      if (items[0].revents & ZMQ_POLLIN)
        while (auto frames = io_->router->recv(milliseconds(0))) on_incoming(std::move(*frames));
      if (items[1].revents & ZMQ_POLLIN)
        while (auto frames = io_->inbox->recv(milliseconds(0))) forward_request(std::move(*frames));
      if (!supervise()) break;
    }
  } catch (const std::exception& e) {
    fail(std::string("scheduler I/O failed: ") + e.what() + "\n", false);
  }
  try {
    stop_workers();
    record_unfinished_restarts();
  } catch (const std::exception& e) {
    std::cerr << "rlhf scheduler: while stopping workers: " << e.what() << std::endl;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  stopped_ = true;
  changed_.notify_all();
}

void Scheduler::on_incoming(Frames&& frames) {
  if (frames.size() < 2) return;
  const std::string routing_id = as_string(frames[0]);
  frames.erase(frames.begin());
  auto it = io_->by_routing_id.find(routing_id);
  if (it == io_->by_routing_id.end()) return on_registration(routing_id, std::move(frames));
  const size_t index = it->second;
  io_->slots[index].last_seen = Clock::now();
  const uint64_t peeked = peek_request_id(frames[0]);
  Message m;
  try {
    m = decode(std::move(frames), config_.limits);
  } catch (const MessageError& e) {
    std::cerr << "rlhf scheduler: malformed message from " << infos_[index].placement.label()
              << ": " << e.what() << std::endl;
    m = make_error(peeked, "", std::string("malformed reply: ") + e.what());
  }
  if (m.kind == MessageKind::kPartial) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (pending_.count(m.id)) {
      last_progress_ = Clock::now();
      partials_[m.id].push_back(std::move(m));
      changed_.notify_all();
    }
    return;
  }
  if (m.kind != MessageKind::kReply && m.kind != MessageKind::kError) return;  // heartbeat
  std::lock_guard<std::mutex> lock(mutex_);
  if (pending_.erase(m.id)) {
    pending_since_.erase(m.id);
    last_progress_ = Clock::now();
    busy_.finished(index, Clock::now());
    replies_[m.id] = std::move(m);
    changed_.notify_all();
  }
}

// Worker slot i is now the peer `routing_id`: its identity, heartbeat settings and
// environment go back to it, and start() learns one more worker is in.
void Scheduler::accept_registration(size_t i, const std::string& routing_id, int64_t pid,
                                    const std::string& host) {
  const auto& p = infos_[i].placement;
  io_->slots[i].routing_id = routing_id;
  io_->slots[i].last_seen = Clock::now();
  io_->by_routing_id[routing_id] = i;
  if (pid > 0 && !io_->processes[i]) infos_[i].pid = static_cast<int>(pid);
  // An srun step: the process here is srun; the worker's own pid is on its node.
  if (pid > 0 && io_->processes[i] && config_.launcher == LauncherKind::kSlurm)
    step_pids_[i] = static_cast<int>(pid);
  remote_hosts_[i] = host;
  Message ok;
  ok.kind = MessageKind::kRegistered;
  ok.args = {{"heartbeat_interval_ms", config_.heartbeat_interval.count()},
             {"timeout_ms", config_.worker_timeout.count()},
             {"run_dir", config_.run_dir},
             {"identity",
              {{"role", role_name(p.role)},
               {"rank", p.rank},
               {"world_size", p.group_size},
               {"device", p.env.count(kEnvDevice) ? p.env.at(kEnvDevice) : "cpu:0"},
               {"node", p.node}}}};
  nlohmann::json env = nlohmann::json::object();
  for (const auto& [name, value] : p.env) env[name] = value;
  env[transport::kEnvCollectiveHost] = p.host;
  env[transport::kEnvCollectiveTimeout] = std::to_string(config_.collective_timeout.count());
  env[kEnvRunDir] = config_.run_dir;
  ok.args["env"] = env;
  Frames out = encode(ok);
  out.insert(out.begin(), zmq::message_t(routing_id.data(), routing_id.size()));
  io_->router->send(std::move(out));
  std::lock_guard<std::mutex> lock(mutex_);
  ++registered_;
  if (auto r = restart_of_.find(i);
      r != restart_of_.end() && restarts_[r->second].registered_s < 0) {
    WorkerRestart& back = restarts_[r->second];
    back.registered_s = seconds_since(started_at_) - back.lost_at_s;
    ++incarnation_[i];
    std::cerr << "rlhf run: fault: " << p.label() << " registered again after " << std::fixed
              << std::setprecision(2) << back.registered_s << " s (pid " << infos_[i].pid << ")"
              << std::defaultfloat << std::endl;
  }
  changed_.notify_all();
}

void Scheduler::on_registration(const std::string& routing_id, Frames&& frames) {
  auto refuse = [&](const std::string& why) {
    ++refused_;
    std::cerr << "rlhf scheduler: refused a registration: " << why << std::endl;
    Frames out = encode(make_error(0, "register", "registration refused: " + why));
    out.insert(out.begin(), zmq::message_t(routing_id.data(), routing_id.size()));
    io_->router->send(std::move(out));
  };
  Message m;
  try {
    m = decode(std::move(frames), config_.limits);
  } catch (const MessageError& e) {
    return refuse(std::string("malformed message: ") + e.what());
  }
  if (m.kind != MessageKind::kRegister)
    return refuse(std::string("a ") + message_kind_name(m.kind) +
                  " from a peer that has not registered");
  const auto token = m.args.find("token");
  if (token == m.args.end() || !token->is_string() ||
      !token_matches(token_, token->get<std::string>()))
    return refuse("wrong or missing job token");
  const std::string role = m.args.value("role", std::string());
  const int rank = m.args.value("rank", -1);
  if (const std::string wire = m.args.value("wire", std::string()); wire != config_.wire_version)
    return refuse(
        (role.empty() ? std::string("a worker") : role + " rank " + std::to_string(rank)) + " on " +
        m.args.value("host", std::string("?")) + " speaks wire version " +
        (wire.empty() ? "(none)" : wire) + ", this driver " + config_.wire_version +
        ": a worker from another build of rlhf");
  const int64_t pid = m.args.value("pid", int64_t{-1});
  const std::string node = m.args.value("node", std::string());
  const std::string host = m.args.value("host", std::string("?"));
  // A hand-joined worker (rlhf worker --connect) may leave role, rank and node open: it
  // takes the first free place that fits what it named.
  const bool join = m.args.value("join", false);
  if (join && config_.launcher == LauncherKind::kLocal)
    return refuse("this job starts its own workers (cluster.launcher \"local\"); worker on " +
                  host + " cannot join");
  std::optional<size_t> taken;
  for (size_t i = 0; i < infos_.size(); ++i) {
    const auto& p = infos_[i].placement;
    if (join) {
      if ((!role.empty() && role != role_name(p.role)) || (rank >= 0 && rank != p.rank) ||
          (!node.empty() && node != p.node))
        continue;
      if (io_->slots[i].routing_id) {
        if (!role.empty() && rank >= 0) taken = i;
        continue;
      }
    } else {
      if (role != role_name(p.role) || rank != p.rank) continue;
      if (io_->slots[i].routing_id) return refuse(p.label() + " is already registered");
      // Only a process started here has a pid to compare; a Slurm step's task has its own.
      if (config_.launcher == LauncherKind::kLocal && pid != infos_[i].pid)
        return refuse("pid " + std::to_string(pid) + " is not the launched " + p.label() +
                      " (pid " + std::to_string(infos_[i].pid) + ")");
    }
    accept_registration(i, routing_id, pid, host);
    return;
  }
  if (taken) return refuse(infos_[*taken].placement.label() + " has already joined");
  if (join)
    return refuse("no free place for a worker" + (role.empty() ? "" : " of role " + role) +
                  (rank >= 0 ? " rank " + std::to_string(rank) : "") +
                  (node.empty() ? "" : " on node " + node) + " in this job");
  refuse("no worker " + role + "[" + std::to_string(rank) + "] in this job");
}

std::string Scheduler::report(size_t index, const std::string& what) const {
  if (io_->processes[index]) {
    const auto step = step_pids_.find(index);
    return io_->processes[index]->report(what, 20, step == step_pids_.end() ? -1 : step->second);
  }
  const auto& p = infos_[index].placement;
  const auto seen = remote_hosts_.find(index);
  std::ostringstream out;
  out << "worker " << p.label() << " " << what << "\n"
      << "  role " << role_name(p.role) << ", rank " << p.rank << " of " << p.group_size
      << ", host " << p.host << " (node " << p.node << ")";
  if (seen != remote_hosts_.end()) out << ", joined from " << seen->second;
  out << ", pid " << infos_[index].pid << " there; its log is where its launcher put it\n";
  return out.str();
}

void Scheduler::forward_request(Frames&& frames) {
  uint64_t index = 0;
  std::memcpy(&index, frames[0].data(), sizeof index);
  const auto& slot = io_->slots.at(index);
  if (!slot.routing_id || slot.exited) {
    const uint64_t id = peek_request_id(frames[1]);
    std::lock_guard<std::mutex> lock(mutex_);
    if (pending_.erase(id)) {
      pending_since_.erase(id);
      busy_.finished(index, Clock::now());
      replies_[id] =
          lost_reply(id, pending_op_[id],
                     infos_[index].placement.label() + " is not serving (being restarted)");
      changed_.notify_all();
    }
    return;
  }
  frames[0] = zmq::message_t(slot.routing_id->data(), slot.routing_id->size());
  io_->router->send(std::move(frames));
}

// A pass of the I/O loop comes every 20 ms or so. A longer gap is time this process did not
// run: the machine stalled (VM steal, suspend, SIGSTOP, swapping) and its workers with it, or
// one big message took that long to move. The workers were not silent on their own account
// through it, so the gap is added to every worker's last contact and launch time: a stall of
// the whole machine is not reported as dead workers, and a worker that stays silent once the
// scheduler runs again is still caught after worker_timeout.
void Scheduler::credit_stall(Clock::time_point now) {
  constexpr auto kStall = std::chrono::milliseconds(500);
  const auto gap = now - io_->last_pass;
  io_->last_pass = now;
  if (gap <= kStall) return;
  for (auto& slot : io_->slots) {
    slot.last_seen = std::min(now, slot.last_seen + gap);
    slot.launched = std::min(now, slot.launched + gap);
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    last_progress_ = std::min(now, last_progress_ + gap);
  }
  if (gap >= std::chrono::seconds(1))
    std::cerr << "rlhf scheduler: did not run for "
              << std::chrono::duration_cast<std::chrono::milliseconds>(gap).count()
              << " ms (a stalled machine?); that time is not counted against the workers"
              << std::endl;
}

bool Scheduler::supervise() {
  io_->asio.poll();
  if (io_->signal_received) {
    const char* abbrev = sigabbrev_np(io_->signal_received);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!failure_) interrupt_signal_ = io_->signal_received;
    }
    fail(std::string("interrupted by SIG") + (abbrev ? abbrev : "?") + ": stopping every worker\n",
         true);
    return false;
  }
  const auto now = Clock::now();
  credit_stall(now);
  const bool beat = now >= io_->next_heartbeat;
  if (beat) io_->next_heartbeat = now + config_.heartbeat_interval;
  for (size_t i = 0; i < io_->processes.size(); ++i) {
    auto& slot = io_->slots[i];
    WorkerProcess* process = io_->processes[i].get();  // null: started by hand
    if (slot.exited) continue;
    if (auto status = process ? process->poll_exit() : std::nullopt) {
      slot.exited = true;
      const bool step = config_.launcher == LauncherKind::kSlurm;
      const std::string cause = (step ? "(its srun step) " : "") + describe_wait_status(*status);
      const std::string text = report(i, cause);  // before a relaunch truncates nothing: the log
      const auto refused = relaunch(i, cause);
      if (!refused) continue;
      fail(text + *refused, false);
      return false;
    }
    if (!slot.routing_id) {
      if (now - slot.launched > config_.register_timeout) {
        if (process) process->signal(SIGKILL);
        if (!process) {
          // Name every worker that never came, not just the first.
          std::string missing;
          for (size_t k = 0; k < infos_.size(); ++k)
            if (!io_->slots[k].routing_id)
              missing += "  " + infos_[k].placement.label() + " (node " + infos_[k].placement.node +
                         ", host " + infos_[k].placement.host + ")\n";
          fail("workers never joined within " +
                   std::to_string(config_.register_timeout.count() / 1000) +
                   " s (cluster.join_timeout_s) at " + tcp_endpoint_ + ":\n" + missing,
               false);
          return false;
        }
        fail(report(i, "did not register within " +
                           std::to_string(config_.register_timeout.count()) + " ms (killed)"),
             false);
        return false;
      }
      continue;
    }
    if (config_.worker_timeout.count() > 0 && now - slot.last_seen > config_.worker_timeout) {
      if (process) process->signal(SIGKILL);
      const std::string cause = "stopped answering: no message for " +
                                std::to_string(config_.worker_timeout.count()) + " ms" +
                                (process ? " (killed)" : "");
      const std::string text = report(i, cause);
      const auto refused = relaunch(i, cause);
      if (!refused) continue;
      fail(text + *refused, false);
      return false;
    }
    if (beat) {
      Message hb;
      hb.kind = MessageKind::kHeartbeat;
      Frames out = encode(hb);
      out.insert(out.begin(), zmq::message_t(slot.routing_id->data(), slot.routing_id->size()));
      io_->router->send(std::move(out));
    }
  }
  return !hung(now);
}

void Scheduler::stop_workers() {
  if (!io_) return;
  auto& procs = io_->processes;
  auto all_exited = [&] {
    bool done = true;
    for (size_t i = 0; i < procs.size(); ++i)
      if (!io_->slots[i].exited && procs[i] && !procs[i]->poll_exit())
        done = false;
      else
        io_->slots[i].exited = true;
    return done;
  };
  for (size_t i = 0; i < procs.size(); ++i) {
    if (io_->slots[i].exited) continue;
    if (io_->slots[i].routing_id) {
      Message bye;
      bye.kind = MessageKind::kShutdown;
      Frames out = encode(bye);
      out.insert(out.begin(), zmq::message_t(io_->slots[i].routing_id->data(),
                                             io_->slots[i].routing_id->size()));
      io_->router->send(std::move(out));
    } else if (procs[i]) {
      procs[i]->signal(SIGTERM);
    }
  }
  // Workers started by hand have no process here: give their shutdown messages a moment
  // on the wire (the router does not linger); they also exit when the heartbeats stop.
  bool remote = false;
  for (size_t i = 0; i < procs.size(); ++i)
    remote = remote || (!procs[i] && io_->slots[i].routing_id);
  const auto remote_drain = Clock::now() + milliseconds(remote ? 500 : 0);
  // Wait with a deadline, draining the router meanwhile (late replies are dropped).
  auto wait_until = [&](Clock::time_point deadline) {
    while (!all_exited() && Clock::now() < deadline) {
      zmq::pollitem_t item{io_->router->socket().handle(), 0, ZMQ_POLLIN, 0};
      if (zmq::poll(&item, 1, milliseconds(10)) > 0) (void)io_->router->recv(milliseconds(0));
    }
  };
  while (Clock::now() < remote_drain) {
    zmq::pollitem_t item{io_->router->socket().handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, milliseconds(10)) > 0) (void)io_->router->recv(milliseconds(0));
  }
  wait_until(Clock::now() + config_.stop_grace);
  for (auto& p : procs)
    if (p) p->signal(SIGTERM);
  wait_until(Clock::now() + milliseconds(1000));
  for (auto& p : procs)
    if (p) p->signal(SIGKILL);
  wait_until(Clock::now() + milliseconds(5000));
}

}  // namespace rlhf
