// The scheduler's I/O-thread state (sockets, processes, registration), shared by its
// translation units: scheduler.cpp (launch, routing, supervision) and scheduler_faults.cpp
// (relaunching lost workers, hangs). Private to scheduler/.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "scheduler/scheduler.h"
#include "scheduler/worker_process.h"
#include "transport/channel.h"

namespace rlhf {

struct Scheduler::Io {
  struct Slot {
    std::optional<std::string> routing_id;  // set once registered
    Clock::time_point last_seen;
    Clock::time_point launched;
    bool exited = false;
    // How it was started, for a relaunch (fault.max_restarts).
    std::string program;
    std::vector<std::string> args;
    std::vector<std::pair<std::string, std::string>> env;
    int relaunches = 0;  // its earlier logs are <log>.1, <log>.2, ...
  };
  zmq::context_t context{1};
  std::unique_ptr<Channel> router;  // workers
  std::unique_ptr<Channel> inbox;   // PULL: driver requests, [index, header, tensors...]
  std::unique_ptr<Channel> outbox;  // PUSH: the driver side of inbox (send_mutex_)
  std::vector<std::unique_ptr<WorkerProcess>> processes;
  std::vector<Slot> slots;
  std::map<std::string, size_t> by_routing_id;
  boost::asio::io_context asio;
  std::unique_ptr<boost::asio::signal_set> signals;
  int signal_received = 0;
  Clock::time_point next_heartbeat;
  Clock::time_point last_pass;  // the previous supervise(): see credit_stall
  std::string ipc_path;
};

// The reply a request gets when its worker is lost: an error is_worker_lost recognises.
Message lost_reply(uint64_t id, const std::string& op, const std::string& why);

}  // namespace rlhf
