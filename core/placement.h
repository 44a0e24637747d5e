// Placement: turns a validated spec into the list of worker processes (role, rank, node,
// device) and the environment each gets. One worker per device. On `cpu` nodes device ids
// are logical slots, placed and validated exactly like GPUs.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/spec.h"

namespace rlhf {

enum class DeviceKind { kCpu, kCuda };
const char* device_kind_name(DeviceKind kind);

struct NodeSpec {
  std::string name;  // "local", "gpu-a"
  std::string host;  // "127.0.0.1"
  DeviceKind kind = DeviceKind::kCpu;
  int devices = 0;       // device count (logical slots on cpu)
  double memory_gb = 0;  // memory per device (GiB)
};

// Environment variable names every worker gets (the scheduler adds the last three at launch).
inline constexpr const char* kEnvRole = "RLHF_ROLE";             // "actor"
inline constexpr const char* kEnvRank = "RLHF_RANK";             // rank within the role group
inline constexpr const char* kEnvWorldSize = "RLHF_WORLD_SIZE";  // role group size
inline constexpr const char* kEnvDevice = "RLHF_DEVICE";         // physical: "cpu:3", "cuda:5"
inline constexpr const char* kEnvNode = "RLHF_NODE";             // node name
inline constexpr const char* kEnvScheduler = "RLHF_SCHEDULER";   // scheduler endpoint
inline constexpr const char* kEnvToken = "RLHF_TOKEN";           // per-job registration token
inline constexpr const char* kEnvRunDir = "RLHF_RUN_DIR";        // run directory
// cuda nodes only: the node's memory_gb, which caps the worker's CUDA caching allocator.
inline constexpr const char* kEnvDeviceMemoryGb = "RLHF_DEVICE_MEMORY_GB";
// cuda nodes only, "1" when another worker (a colocated role) uses the same GPU.
inline constexpr const char* kEnvSharedDevice = "RLHF_SHARED_DEVICE";

// "1,3": the CPU cores the worker pins itself to (<role>.cpu_affinity); absent: any.
inline constexpr const char* kEnvCpuAffinity = "RLHF_CPU_AFFINITY";

struct WorkerPlacement {
  Role role = Role::kActor;
  int rank = 0;        // within its role group
  int group_size = 1;  // ranks in the role group
  std::string node;    // node name
  std::string host;    // node host
  DeviceKind device_kind = DeviceKind::kCpu;
  int device_id = 0;                       // on its node; CUDA_VISIBLE_DEVICES for cuda
  std::string colocated_with;              // role name whose devices this worker shares, or ""
  std::map<std::string, std::string> env;  // what the worker process gets (see kEnv*)

  // "cuda:0" inside the worker (after CUDA_VISIBLE_DEVICES), "cpu" on cpu nodes.
  std::string torch_device() const;
  // "actor[1]" for messages.
  std::string label() const;
};

struct Placement {
  std::vector<NodeSpec> nodes;
  std::vector<WorkerPlacement> workers;  // grouped by role in kAllRoles order, then rank

  std::vector<WorkerPlacement> group(Role role) const;
  int group_size(Role role) const;  // 0 when the role is not used
};

// Places every used role; the spec was validated, so this only fails on internal errors.
Placement place(const JobSpec& spec);
// Parses `cluster.nodes` (already validated).
std::vector<NodeSpec> cluster_nodes(const JobSpec& spec);

}  // namespace rlhf
