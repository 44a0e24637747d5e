// The operations every worker answers (ping, info) and the memory query of model workers,
// as typed requests and replies (transport/operation.h). echo, a diagnostic of the transport
// tests, is the one operation whose args are free: it returns what it was sent.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "transport/collective_group.h"
#include "transport/operation.h"

namespace rlhf::ops {

struct PingReply {
  std::string role;
  int rank = 0;
};
RLHF_WIRE_STRUCT(PingReply, "ping reply", role, rank)

// Liveness: who answered.
struct Ping {
  static constexpr const char* kName = "ping";
  using Reply = PingReply;
};
RLHF_WIRE_EMPTY(Ping, "ping")

struct InfoReply {
  int64_t pid = 0;
  std::string role;
  int rank = 0;
  int world_size = 0;
  std::string device;
  std::string node;
  int64_t peak_rss_bytes = 0;  // the process's peak resident memory
  // GPU workers: the CUDA caching allocator's peaks, overall and per operation
  // (actors/device.h DeviceMemoryLog::to_json); null on CPU workers.
  nlohmann::json cuda;
};
RLHF_WIRE_STRUCT(InfoReply, "info reply", pid, role, rank, world_size, device, node, peak_rss_bytes,
                 cuda)

// Who the worker is and what memory it used.
struct Info {
  static constexpr const char* kName = "info";
  using Reply = InfoReply;
};
RLHF_WIRE_EMPTY(Info, "info")

// A model worker's memory: what it holds between operations and its tracked peaks. Fields a
// role does not have are 0 (a reference has no optimizer).
struct MemoryReply {
  int64_t peak_rss_bytes = 0;
  nlohmann::json cuda;  // as InfoReply's
  int64_t params = 0;   // weights held between operations: whole, or this rank's shard
  int64_t master = 0;
  int64_t optimizer = 0;
  int64_t grads = 0;
  int64_t gathered = 0;
  int64_t peak_tensor_bytes = 0;
  // Per operation, the largest tracked-tensor peak over its calls.
  std::map<std::string, int64_t> tensor_phases;
  // A trained role's collectives in its last optimizer step (engine::Trainer).
  transport::CollectiveTraffic step_collectives;
};
RLHF_WIRE_STRUCT(MemoryReply, "memory reply", peak_rss_bytes, cuda, params, master, optimizer,
                 grads, gathered, peak_tensor_bytes, tensor_phases, step_collectives)

struct Memory {
  static constexpr const char* kName = "memory";
  using Reply = MemoryReply;
};
RLHF_WIRE_EMPTY(Memory, "memory")

}  // namespace rlhf::ops
