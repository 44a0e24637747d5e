#include "scheduler/peak_memory.h"

#include "scheduler/role_group.h"
#include "scheduler/scheduler.h"
#include "transport/worker_ops.h"

namespace rlhf {

nlohmann::json peak_memory_by_role(Scheduler& s, const nlohmann::json& planned_roles) {
  nlohmann::json out = nlohmann::json::object();
  for (Role role : s.roles()) {
    RoleGroup& g = s.group(role);
    const auto infos = g.call_all(ops::Info{});
    std::vector<Answered<ops::MemoryReply>> tensors;
    if (!runs_engine(role)) tensors = g.call_all(ops::Memory{});  // model roles only
    nlohmann::json ranks = nlohmann::json::array();
    for (int rank = 0; rank < g.size(); ++rank) {
      const ops::InfoReply& info = infos[rank].reply;
      nlohmann::json m = {
          {"rank", rank}, {"device", info.device}, {"peak_rss_bytes", info.peak_rss_bytes}};
      if (!tensors.empty()) {
        const ops::MemoryReply& memory = tensors[rank].reply;
        m["peak_tensor_bytes"] = memory.peak_tensor_bytes;
        // Weights this rank keeps between operations: whole, or its ZeRO shard.
        m["weight_bytes"] = memory.params;
        // Per operation, the tracked-tensor peak (CPU and GPU workers alike).
        nlohmann::json phases = nlohmann::json::object();
        for (const auto& [op, bytes] : memory.tensor_phases)
          phases[op] = {{"peak_tensor_bytes", bytes}};
        m["tensor_phases"] = phases;
        // A trained rank's collectives in its last optimizer step (payload bytes by kind).
        if (memory.step_collectives.calls > 0) m["step_collectives"] = memory.step_collectives;
      }
      // GPU workers: the CUDA caching allocator's peaks (tensors, and what it reserved from
      // the driver), overall and per phase (operation).
      if (const auto& cuda = info.cuda; cuda.is_object()) {
        m["cuda_peak_allocated_bytes"] = cuda.value("peak_allocated_bytes", int64_t{0});
        m["cuda_peak_reserved_bytes"] = cuda.value("peak_reserved_bytes", int64_t{0});
        m["cuda_phases"] = cuda.value("phases", nlohmann::json::object());
      }
      if (planned_roles.is_object() && planned_roles.contains(role_name(role))) {
        const auto& plan = planned_roles[role_name(role)];
        m["planned_total_bytes"] = plan.value("device_total", int64_t{0});
        m["planned_tensor_bytes"] = plan.value("engine_peak", int64_t{0});
        if (plan.value("cuda_allocated", int64_t{0}) > 0)
          m["planned_cuda_allocated_bytes"] = plan["cuda_allocated"];
        if (plan.contains("collectives_per_step"))
          m["planned_step_collectives"] = plan["collectives_per_step"];
      }
      ranks.push_back(m);
    }
    out[role_name(role)] = ranks;
  }
  return out;
}

}  // namespace rlhf
