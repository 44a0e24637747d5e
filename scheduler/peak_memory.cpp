#include "scheduler/peak_memory.h"

#include "scheduler/role_group.h"
#include "scheduler/scheduler.h"

namespace rlhf {

nlohmann::json peak_memory_by_role(Scheduler& s, const nlohmann::json& planned_roles) {
  nlohmann::json out = nlohmann::json::object();
  for (Role role : s.roles()) {
    RoleGroup& g = s.group(role);
    const auto infos = g.call_all("info");
    std::vector<Message> tensors;
    if (role != Role::kRollout) tensors = g.call_all("memory");  // model roles only
    nlohmann::json ranks = nlohmann::json::array();
    for (int rank = 0; rank < g.size(); ++rank) {
      nlohmann::json m = {{"rank", rank},
                          {"device", infos[rank].args.value("device", std::string())},
                          {"peak_rss_bytes", infos[rank].args.value("peak_rss_bytes", int64_t{0})}};
      if (!tensors.empty()) {
        m["peak_tensor_bytes"] = tensors[rank].args.value("peak_tensor_bytes", int64_t{0});
        // Weights this rank keeps between operations: whole, or its ZeRO shard.
        m["weight_bytes"] = tensors[rank].args.value("params", int64_t{0});
        // Per operation, the tracked-tensor peak (CPU and GPU workers alike).
        m["tensor_phases"] = tensors[rank].args.value("tensor_phases", nlohmann::json::object());
      }
      // GPU workers: the CUDA caching allocator's peaks (tensors, and what it reserved from
      // the driver), overall and per phase (operation).
      if (const auto& cuda = infos[rank].args; cuda.contains("cuda") && cuda["cuda"].is_object()) {
        m["cuda_peak_allocated_bytes"] = cuda["cuda"].value("peak_allocated_bytes", int64_t{0});
        m["cuda_peak_reserved_bytes"] = cuda["cuda"].value("peak_reserved_bytes", int64_t{0});
        m["cuda_phases"] = cuda["cuda"].value("phases", nlohmann::json::object());
      }
      if (planned_roles.is_object() && planned_roles.contains(role_name(role))) {
        const auto& plan = planned_roles[role_name(role)];
        m["planned_total_bytes"] = plan.value("device_total", int64_t{0});
        m["planned_tensor_bytes"] = plan.value("engine_peak", int64_t{0});
        if (plan.value("cuda_allocated", int64_t{0}) > 0)
          m["planned_cuda_allocated_bytes"] = plan["cuda_allocated"];
      }
      ranks.push_back(m);
    }
    out[role_name(role)] = ranks;
  }
  return out;
}

}  // namespace rlhf
