// Placement of a validated spec: one worker per device, ranks in the order the role's
// devices are listed, and the environment each worker process starts with.
#include "core/placement.h"

#include <cstdlib>
#include <sstream>

namespace rlhf {

using nlohmann::json;

namespace {

std::string format_gb(double gb) {
  std::ostringstream out;
  out.precision(17);
  out << gb;
  return out.str();
}

}  // namespace

const char* device_kind_name(DeviceKind kind) {
  return kind == DeviceKind::kCuda ? "cuda" : "cpu";
}

std::string WorkerPlacement::torch_device() const {
  // CUDA_VISIBLE_DEVICES holds exactly this worker's GPU, so inside it the GPU is cuda:0.
  return device_kind == DeviceKind::kCuda ? "cuda:0" : "cpu";
}

std::string WorkerPlacement::label() const {
  return std::string(role_name(role)) + "[" + std::to_string(rank) + "]";
}

std::vector<WorkerPlacement> Placement::group(Role role) const {
  std::vector<WorkerPlacement> out;
  for (const auto& w : workers)
    if (w.role == role) out.push_back(w);
  return out;
}

int Placement::group_size(Role role) const {
  return static_cast<int>(group(role).size());
}

std::vector<NodeSpec> cluster_nodes(const JobSpec& spec) {
  std::vector<NodeSpec> nodes;
  for (const auto& n : spec.at("cluster.nodes")) {
    NodeSpec node;
    node.name = n.at("name").get<std::string>();
    node.host = n.at("host").get<std::string>();
    node.kind = n.at("kind") == "cuda" ? DeviceKind::kCuda : DeviceKind::kCpu;
    node.devices = n.at("devices").get<int>();
    node.memory_gb = n.at("memory_gb").get<double>();
    nodes.push_back(node);
  }
  return nodes;
}

Placement place(const JobSpec& spec) {
  Placement p;
  p.nodes = cluster_nodes(spec);
  const std::string threads = std::to_string(spec.get_int("cluster.threads_per_worker"));
  const std::string alloc_conf = spec.get_string("cluster.cuda_alloc_conf");
  for (Role role : spec.used_roles()) {
    const std::string name = role_name(role);
    // Resolved devices: [ids] on the first node, or {"node": [ids]} (see spec_placement.cpp).
    std::vector<std::pair<size_t, int>> devices;
    const json& d = spec.at(name + ".devices");
    if (d.is_array()) {
      for (const auto& id : d) devices.emplace_back(0, id.get<int>());
    } else {
      for (size_t n = 0; n < p.nodes.size(); ++n)
        if (d.contains(p.nodes[n].name))
          for (const auto& id : d.at(p.nodes[n].name)) devices.emplace_back(n, id.get<int>());
    }
    const int size = static_cast<int>(devices.size());
    std::string cores;
    for (const auto& core : spec.at(name + ".cpu_affinity"))
      cores += (cores.empty() ? "" : ",") + std::to_string(core.get<int64_t>());
    for (int rank = 0; rank < size; ++rank) {
      const NodeSpec& node = p.nodes[devices[rank].first];
      WorkerPlacement w;
      w.role = role;
      w.rank = rank;
      w.group_size = size;
      w.node = node.name;
      w.host = node.host;
      w.device_kind = node.kind;
      w.device_id = devices[rank].second;
      w.colocated_with = spec.get_string(name + ".colocate_with");
      w.env[kEnvRole] = name;
      w.env[kEnvRank] = std::to_string(rank);
      w.env[kEnvWorldSize] = std::to_string(size);
      w.env[kEnvNode] = node.name;
      w.env[kEnvDevice] =
          std::string(device_kind_name(node.kind)) + ":" + std::to_string(w.device_id);
      w.env["OMP_NUM_THREADS"] = threads;
      if (!cores.empty()) w.env[kEnvCpuAffinity] = cores;
      // Several multi-threaded workers share a CPU node's cores (actor and reference score at
      // once): OpenMP threads that spin while waiting steal the others' cores (measured: 2
      // workers x 2 threads on 2 cores scored 1.5x slower spinning than passive). The user's
      // own OMP_WAIT_POLICY wins.
      if (node.kind == DeviceKind::kCpu && threads != "1" && !std::getenv("OMP_WAIT_POLICY"))
        w.env["OMP_WAIT_POLICY"] = "PASSIVE";
      if (node.kind == DeviceKind::kCuda) {
        w.env["CUDA_VISIBLE_DEVICES"] = std::to_string(w.device_id);
        w.env[kEnvDeviceMemoryGb] = format_gb(node.memory_gb);
        if (!alloc_conf.empty()) w.env["PYTORCH_CUDA_ALLOC_CONF"] = alloc_conf;
      }
      p.workers.push_back(std::move(w));
    }
  }
  // Workers sharing a GPU (colocated roles) hand the allocator's cached blocks back after
  // each operation, so one role's cache does not starve the other's next phase.
  for (auto& w : p.workers) {
    if (w.device_kind != DeviceKind::kCuda) continue;
    for (const auto& other : p.workers)
      if (&other != &w && other.node == w.node && other.device_id == w.device_id)
        w.env[kEnvSharedDevice] = "1";
  }
  return p;
}

}  // namespace rlhf
