// The worker process's loop: register with the scheduler (job token), then serve named
// operations from an OperationRegistry, answer heartbeats, and exit on shutdown or when
// the scheduler falls silent. Operations run on their own thread so heartbeats are answered
// during a long train step. Holds no model itself: roles add operations that do.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "actors/operation_registry.h"
#include "transport/channel.h"
#include "transport/message.h"

namespace rlhf {

struct WorkerConfig {
  WorkerIdentity identity;
  std::string scheduler_endpoint;  // RLHF_SCHEDULER
  std::string token;               // RLHF_TOKEN
  std::string run_dir;             // RLHF_RUN_DIR
  std::chrono::milliseconds register_timeout{30000};
  MessageLimits limits;
  // CURVE: the scheduler's public key (Z85, 40 characters; RLHF_CURVE_SERVER_KEY), "" when
  // the job's sockets are not encrypted.
  std::string curve_server_key;
  // Hand-joined workers (rlhf worker --connect) learn their identity from the scheduler's
  // answer; after their environment is set from it, this prepares the process (device,
  // threads) and returns the operations to serve. Unset: the identity comes from from_env().
  std::function<OperationRegistry(const WorkerIdentity&)> on_assigned;

  // From the environment the scheduler sets (RLHF_ROLE, RLHF_RANK, RLHF_WORLD_SIZE,
  // RLHF_DEVICE, RLHF_NODE, RLHF_SCHEDULER, RLHF_TOKEN, RLHF_RUN_DIR).
  // Throws InputError naming the missing or malformed variable.
  static WorkerConfig from_env();
};

// In-flight requests (issue 42.3): an operation that runs for long (generate) may serve some
// requests meant for after it between two of its steps (a weight sync between two decode
// steps; a memory query that should not wait for the whole call). serve_in_flight, called on
// the operation thread inside an operation, runs now, on this thread, every request that
// reached the worker meanwhile for one of `ops` (in arrival order, with its registered
// handler, which must not need what the running operation holds, or must take it
// re-entrantly) and answers it (an error reply when its handler throws); every other request
// stays queued, in order, for after the operation. Outside an operation thread: nothing.
void serve_in_flight(const std::vector<std::string>& ops);
// Inside an operation: sends `part` now as a partial reply (kPartial) of the request being
// served, ahead of its reply (a streaming generate's finished prompt groups; RoleGroup::
// scatter hands it to its caller's PartHandler). Throws RuntimeError outside an operation.
void send_partial(Message part);

class Worker {
 public:
  Worker(WorkerConfig config, OperationRegistry registry);
  // Registers and serves until shutdown (returns 0). Throws RuntimeError when registration
  // is refused or times out. When the scheduler stops sending heartbeats for its timeout,
  // logs that and ends the process with exit code 1 (a running operation cannot be joined).
  int run();

 private:
  Message register_with(Channel& scheduler, const std::string& me);
  WorkerConfig config_;
  OperationRegistry registry_;
};

}  // namespace rlhf
