// Worker: registration handshake, the I/O loop (heartbeats, forwarding) and the operation
// thread, connected by an inproc PAIR socket so tensors pass between them without copies.
#include "actors/worker.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <iostream>
#include <optional>
#include <thread>

#include "actors/device.h"
#include "actors/wire_version.h"
#include "core/errors.h"
#include "core/host.h"
#include "core/placement.h"
#include "core/timing.h"
#include "transport/channel.h"
#include "transport/collective_group.h"

namespace rlhf {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::string env_or_throw(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v)
    throw InputError(std::string("environment variable ") + name +
                     " is not set "
                     "(rlhf worker is started by `rlhf run`)");
  return v;
}

int env_int(const char* name) {
  std::string v = env_or_throw(name);
  try {
    size_t used = 0;
    int out = std::stoi(v, &used);
    if (used == v.size() && out >= 0) return out;
  } catch (const std::exception&) {
  }
  throw InputError(std::string("environment variable ") + name + "=\"" + v +
                   "\": expected a non-negative integer");
}

// The header's kind, or kRequest when the header is unreadable (the operation thread then
// decodes it properly and answers with the reason).
MessageKind peek_kind(const zmq::message_t& header) {
  const char* text = static_cast<const char*>(header.data());
  auto j = nlohmann::json::parse(text, text + header.size(), nullptr, false);
  if (!j.is_object() || !j.contains("kind") || !j["kind"].is_string()) return MessageKind::kRequest;
  const std::string kind = j["kind"].get<std::string>();
  if (kind == "heartbeat") return MessageKind::kHeartbeat;
  if (kind == "shutdown") return MessageKind::kShutdown;
  if (kind == "registered") return MessageKind::kRegistered;
  return MessageKind::kRequest;
}

// Encrypts the connection to the scheduler (ZeroMQ CURVE) with a fresh key pair of this
// process; the scheduler's token check still decides who may join.
void set_curve_client(Channel& channel, const std::string& server_key) {
  char public_key[41] = {}, secret_key[41] = {};
  if (zmq_curve_keypair(public_key, secret_key) != 0)
    throw RuntimeError(std::string("zmq_curve_keypair failed (libzmq without CURVE?): ") +
                       zmq_strerror(zmq_errno()));
  auto& socket = channel.socket();
  socket.set(zmq::sockopt::curve_serverkey, server_key);
  socket.set(zmq::sockopt::curve_publickey, std::string(public_key));
  socket.set(zmq::sockopt::curve_secretkey, std::string(secret_key));
}

constexpr const char* kExecEndpoint = "inproc://rlhf-worker-operations";

// The header's operation name ("" when unreadable: the request is then not taken in flight
// and the operation thread answers it with the reason in its turn).
std::string peek_op(const zmq::message_t& header) {
  const char* text = static_cast<const char*>(header.data());
  auto j = nlohmann::json::parse(text, text + header.size(), nullptr, false);
  if (!j.is_object() || !j.contains("op") || !j["op"].is_string()) return "";
  return j["op"].get<std::string>();
}

// A request read ahead while an operation ran, and its operation's name.
struct Queued {
  Frames frames;
  std::string op;
};

// The operation thread's queue as an operation running on it sees it (serve_in_flight):
// requests read ahead while it ran wait in `deferred`, in order, for after it.
struct OperationQueue {
  Channel& pair;
  const MessageLimits& limits;
  const OperationRegistry& registry;
  const WorkerIdentity& self;
  std::deque<Queued> deferred;
  const Message* current = nullptr;  // the request whose operation runs (send_partial)
};
thread_local OperationQueue* operation_queue = nullptr;

// Marks `reply` as the answer to `request` after `started` (the handler's own time, so
// drivers can tell worker compute from everything around it).
void finish_reply(Message& reply, const Message& request, Clock::time_point started) {
  if (reply.args.is_object()) reply.args["compute_s"] = seconds_since(started);
  reply.kind = MessageKind::kReply;
  reply.id = request.id;
  reply.op = request.op;
  reply.step = request.step;
  reply.error.clear();
}

// The operation thread: decode (validating), run, reply. Never throws out.
void serve_operations(zmq::context_t& context, const OperationRegistry& registry,
                      const WorkerIdentity& self, const MessageLimits& limits,
                      const std::string& run_dir, const std::atomic<bool>& stop) {
  DeviceMemoryLog& device_memory = device_memory_log();
  // A colocated role's GPU: cached blocks go back to the driver after each operation (as
  // vLLM's sleep mode frees its KV cache while the trainer runs).
  const bool shares_device = on_cuda(self) && std::getenv(kEnvSharedDevice) != nullptr;
  Channel pair(context, zmq::socket_type::pair);
  pair.connect(kExecEndpoint);
  OperationQueue queue{pair, limits, registry, self, {}};
  operation_queue = &queue;
  const std::string me = "[" + self.role + " " + std::to_string(self.rank) + "] ";
  while (true) {
    std::optional<Frames> frames;
    if (!queue.deferred.empty()) {
      frames = std::move(queue.deferred.front().frames);
      queue.deferred.pop_front();
    } else {
      frames = pair.recv(std::nullopt);
    }
    if (!frames) continue;
    if (stop) return;  // set before the wake-up message, which is not a request
    queue.current = nullptr;
    const uint64_t id = peek_request_id((*frames)[0]);
    std::string op;
    Message reply;
    try {
      Message request = decode(std::move(*frames), limits);
      op = request.op;
      if (request.kind != MessageKind::kRequest)
        throw MessageError(std::string("expected a request, got a ") +
                           message_kind_name(request.kind));
      const Operation* handler = registry.find(request.op);
      // A driver asking for an operation no worker has is rlhf's bug, not the user's input.
      if (!handler) throw RuntimeError("unknown operation \"" + request.op + "\"");
      const auto started = std::chrono::steady_clock::now();
      device_memory.begin(request.op);
      queue.current = &request;
      reply = (*handler)(request, self);
      queue.current = nullptr;
      device_memory.end(request.op);
      if (shares_device) release_cached_device_memory(self);
      finish_reply(reply, request, started);
    } catch (const c10::OutOfMemoryError& e) {
      device_memory.end(op);
      const std::string report = out_of_memory_report(self, op, run_dir, e.what());
      std::cerr << me << report << std::endl;
      reply = make_error(id, op, report);
    } catch (const MessageError& e) {
      std::cerr << me << "rejected malformed message (id " << id << "): " << e.what() << std::endl;
      reply = make_error(id, op, std::string("malformed message: ") + e.what());
    } catch (const c10::Error& e) {
      // The message without LibTorch's C++ backtrace (the worker log has the full one).
      std::cerr << me << "operation \"" << op << "\" (id " << id << ") failed: " << e.what()
                << std::endl;
      reply = make_error(id, op, e.what_without_backtrace());
    } catch (const transport::CollectiveFailure& e) {
      // A peer died or hung: this rank's group is unusable. The driver treats it as a lost
      // rank (scheduler/role_group.cpp).
      std::cerr << me << "operation \"" << op << "\" (id " << id << ") failed: " << e.what()
                << std::endl;
      reply = make_error(id, op, e.what());
      reply.args = {{"collective_failed", true}};
    } catch (const InputError& e) {
      std::cerr << me << "operation \"" << op << "\" (id " << id << ") failed: " << e.what()
                << std::endl;
      reply = make_error(id, op, e.what());
      reply.args = {{"bad_input", true}};  // the driver reports it as bad input (exit 2)
    } catch (const std::exception& e) {
      std::cerr << me << "operation \"" << op << "\" (id " << id << ") failed: " << e.what()
                << std::endl;
      reply = make_error(id, op, e.what());
    }
    try {
      pair.send(encode(reply));
    } catch (const std::exception& e) {
      pair.send(encode(make_error(id, op, std::string("cannot encode reply: ") + e.what())));
    }
  }
}

}  // namespace

void serve_in_flight(const std::vector<std::string>& ops) {
  OperationQueue* queue = operation_queue;
  if (!queue) return;
  while (auto frames = queue->pair.recv(std::chrono::milliseconds(0))) {
    std::string op = frames->empty() ? std::string() : peek_op((*frames)[0]);
    queue->deferred.push_back({std::move(*frames), std::move(op)});
  }
  for (auto it = queue->deferred.begin(); it != queue->deferred.end();) {
    const Operation* handler = queue->registry.find(it->op);
    if (!handler || std::find(ops.begin(), ops.end(), it->op) == ops.end()) {
      ++it;
      continue;
    }
    const std::string op = it->op;
    Frames frames = std::move(it->frames);
    it = queue->deferred.erase(it);
    const uint64_t id = peek_request_id(frames[0]);
    Message reply;
    try {
      const Message request = decode(std::move(frames), queue->limits);
      const auto started = std::chrono::steady_clock::now();
      reply = (*handler)(request, queue->self);
      finish_reply(reply, request, started);
    } catch (const std::exception& e) {
      // Its caller fails on the error reply; the operation in progress goes on.
      reply = make_error(id, op, e.what());
    }
    queue->pair.send(encode(reply));
  }
}

void send_partial(Message part) {
  OperationQueue* queue = operation_queue;
  if (!queue || !queue->current) throw RuntimeError("send_partial outside an operation");
  part.kind = MessageKind::kPartial;
  part.id = queue->current->id;
  part.op = queue->current->op;
  part.step = queue->current->step;
  part.error.clear();
  queue->pair.send(encode(part));
}

WorkerConfig WorkerConfig::from_env() {
  WorkerConfig c;
  c.identity.role = env_or_throw("RLHF_ROLE");
  c.identity.rank = env_int("RLHF_RANK");
  c.identity.world_size = env_int("RLHF_WORLD_SIZE");
  c.identity.device = env_or_throw("RLHF_DEVICE");
  const char* node = std::getenv("RLHF_NODE");
  c.identity.node = node ? node : "";
  c.scheduler_endpoint = env_or_throw("RLHF_SCHEDULER");
  c.token = env_or_throw("RLHF_TOKEN");
  const char* run_dir = std::getenv("RLHF_RUN_DIR");
  c.run_dir = run_dir ? run_dir : "";
  const char* curve = std::getenv("RLHF_CURVE_SERVER_KEY");
  c.curve_server_key = curve ? curve : "";
  if (c.identity.rank >= c.identity.world_size)
    throw InputError("RLHF_RANK " + std::to_string(c.identity.rank) +
                     " is not below RLHF_WORLD_SIZE " + std::to_string(c.identity.world_size));
  return c;
}

Worker::Worker(WorkerConfig config, OperationRegistry registry)
    : config_(std::move(config)), registry_(std::move(registry)) {}

// Registers with the scheduler (token, identity, wire version) and, for a worker that joins
// by hand, takes the identity and environment it was assigned. Throws RuntimeError naming
// what went wrong.
Message Worker::register_with(Channel& scheduler, const std::string& me) {
  const WorkerIdentity& self = config_.identity;
  Message hello;
  hello.kind = MessageKind::kRegister;
  hello.args = {{"token", config_.token},
                {"role", self.role},
                {"rank", self.rank},
                {"pid", static_cast<int64_t>(getpid())},
                {"host", host_name().value_or("?")},
                {"device", self.device},
                {"wire", wire_version()}};
  if (config_.on_assigned) hello.args["join"] = true;  // any free place, or the one asked for
  if (config_.on_assigned && self.role.empty()) hello.args.erase("rank");
  if (config_.on_assigned && !self.node.empty()) hello.args["node"] = self.node;
  scheduler.send(hello);
  auto answer = scheduler.recv(config_.register_timeout);
  if (!answer)
    throw RuntimeError(me + "no answer from the scheduler at " + config_.scheduler_endpoint +
                       " within " + std::to_string(config_.register_timeout.count() / 1000) +
                       " s (is `rlhf run` up there, and are the endpoint and CURVE key right?)");
  Message accepted = decode(std::move(*answer), config_.limits);
  if (accepted.kind != MessageKind::kRegistered)
    throw RuntimeError(me + "the scheduler refused registration: " + accepted.error);
  if (config_.on_assigned) {
    const auto& a = accepted.args.at("identity");
    config_.identity.role = a.at("role").get<std::string>();
    config_.identity.rank = a.at("rank").get<int>();
    config_.identity.world_size = a.at("world_size").get<int>();
    config_.identity.device = a.at("device").get<std::string>();
    config_.identity.node = a.at("node").get<std::string>();
    config_.run_dir = accepted.args.value("run_dir", config_.run_dir);
    for (const auto& [name, value] : accepted.args.at("env").items())
      ::setenv(name.c_str(), value.get<std::string>().c_str(), 1);
    registry_ = config_.on_assigned(config_.identity);
  }
  return accepted;
}

int Worker::run() {
  const WorkerIdentity& self = config_.identity;
  std::string me = "[" + (self.role.empty() ? "worker" : self.role) + " " +
                   (self.role.empty() ? "?" : std::to_string(self.rank)) + "] ";
  zmq::context_t context(1);
  Channel scheduler(context, zmq::socket_type::dealer);
  scheduler.set_max_message_size(config_.limits.max_total_bytes + config_.limits.max_header_bytes);
  if (!config_.curve_server_key.empty()) set_curve_client(scheduler, config_.curve_server_key);
  scheduler.connect(config_.scheduler_endpoint);

  const Message accepted = register_with(scheduler, me);
  // The job's rendezvous store admits only clients that prove the token: collective groups
  // opened in this process read it here (a worker joined by --join-file had it only in its
  // config).
  ::setenv(kEnvToken, config_.token.c_str(), 1);
  me = "[" + self.role + " " + std::to_string(self.rank) + "] ";
  const milliseconds silence_limit(accepted.args.value("timeout_ms", int64_t{5000}));
  std::cerr << me << "registered with " << config_.scheduler_endpoint << ", pid " << getpid()
            << ", device " << self.device << std::endl;

  Channel operations(context, zmq::socket_type::pair);
  operations.bind(kExecEndpoint);
  std::atomic<bool> stop{false};
  std::thread executor(serve_operations, std::ref(context), std::cref(registry_), std::cref(self),
                       std::cref(config_.limits), std::cref(config_.run_dir), std::cref(stop));
  auto last_contact = Clock::now();
  auto last_pass = last_contact;
  while (true) {
    zmq::pollitem_t items[] = {{scheduler.socket().handle(), 0, ZMQ_POLLIN, 0},
                               {operations.socket().handle(), 0, ZMQ_POLLIN, 0}};
    zmq::poll(items, 2, milliseconds(100));
    // A pass comes every 100 ms or so; a longer gap is time this process did not run (a
    // stalled machine: the scheduler stalled too), not silence of the scheduler's own.
    const auto pass = Clock::now();
    if (pass - last_pass > milliseconds(500))
      last_contact = std::min(pass, last_contact + (pass - last_pass));
    last_pass = pass;
    if (items[0].revents & ZMQ_POLLIN) {
      auto frames = scheduler.recv(milliseconds(0));
      last_contact = Clock::now();
      MessageKind kind = frames ? peek_kind((*frames)[0]) : MessageKind::kRegistered;
      if (kind == MessageKind::kHeartbeat) {
        Message beat;
        beat.kind = MessageKind::kHeartbeat;
        scheduler.send(beat);
      } else if (kind == MessageKind::kShutdown) {
        break;
      } else if (kind == MessageKind::kRequest) {
        operations.send(std::move(*frames));
      }
    }
    if (items[1].revents & ZMQ_POLLIN) {
      if (auto reply = operations.recv(milliseconds(0))) scheduler.send(std::move(*reply));
    }
    if (silence_limit.count() > 0 && Clock::now() - last_contact > silence_limit) {
      std::cerr << me << "no message from the scheduler for " << silence_limit.count()
                << " ms: it is gone, exiting" << std::endl;
      std::fflush(nullptr);
      std::_Exit(1);
    }
  }
  std::cerr << me << "shutdown requested" << std::endl;
  stop = true;
  operations.send(Frames(1));  // wakes the operation thread, which then sees `stop`
  executor.join();
  return 0;
}

}  // namespace rlhf
