// The job's memory plan: every role planned (memory_plan.cpp), laid on the devices the
// placement gives it, the rollout's KV cache sized to what a GPU leaves (kv_cache_memory_gb
// auto), and its JSON.
#include <algorithm>
#include <cstdio>
#include <map>

#include "core/errors.h"
#include "engine/memory_plan.h"
#include "engine/memory_suggestions.h"

namespace rlhf::engine {

using nlohmann::json;

namespace {

std::string format_gib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f",
                static_cast<double>(bytes) / static_cast<double>(1ll << 30));
  return buf;
}

}  // namespace

bool MemoryPlan::fits() const {
  return std::all_of(devices.begin(), devices.end(), [](const DevicePlan& d) { return d.fits(); });
}

const RolePlan* MemoryPlan::role(const std::string& name) const {
  for (const auto& r : roles)
    if (r.input.role == name) return &r;
  return nullptr;
}

json MemoryPlan::to_json() const {
  json roles_json = json::object();
  for (const auto& r : roles) {
    json j = r.terms.to_json();
    j["group_size"] = r.input.group_size;
    j["micro_batch"] = r.input.micro_batch;
    j["seq_len"] = r.input.seq_len;
    if (r.input.shard_weights) j["zero_stage"] = 3;
    if (r.input.work == RoleWork::kGenerate) {
      j["tensor_parallel_size"] = r.input.tensor_parallel;
      j["kv_cache_auto"] = r.input.kv_auto;
    }
    if (r.input.work == RoleWork::kTrain) {
      j["zero_stage"] = r.input.zero_stage;
      j["gradient_checkpointing"] = r.input.checkpointing;
      j["adam_offload"] = r.input.adam_offload;
      j["backward_calls_per_step"] = r.input.backward_calls;
      j["collectives_per_step"] = r.collectives;
      j["collective_wire_bytes_per_step"] = r.collective_wire_bytes;
    }
    if (r.sync_bytes > 0) j["weight_sync_bytes"] = r.sync_bytes;
    j["dominant"] = r.terms.dominant().first;
    roles_json[r.input.role] = j;
  }
  json devices_json = json::array();
  for (const auto& d : devices)
    devices_json.push_back({{"node", d.node},
                            {"device", d.device_id},
                            {"capacity", d.capacity},
                            {"roles", d.roles},
                            {"phases", d.phases},
                            {"peak_phase", d.peak_phase},
                            {"total", d.total},
                            {"fits", d.fits()}});
  json s = json::array();
  for (const auto& x : suggestions)
    s.push_back({{"change", x.change},
                 {"new_total", x.new_total},
                 {"fits", x.fits},
                 {"costs_throughput", x.costs_throughput}});
  return {{"fits", fits()},
          {"kv_auto_error", kv_auto_error.empty() ? json(nullptr) : json(kv_auto_error)},
          {"roles", roles_json},
          {"devices", devices_json},
          {"suggestions", s},
          {"note",
           "per-rank bytes; engine_peak is what the trainer's tracker counts (measured "
           "peak_tensor_bytes)"}};
}

namespace {

// The devices' phase tables from the roles' (a device's total is its largest phase).
void fill_devices(const Placement& placement, MemoryPlan& plan) {
  plan.devices.clear();
  std::map<std::pair<std::string, int>, size_t> index;
  for (const auto& w : placement.workers) {
    auto key = std::make_pair(w.node, w.device_id);
    if (!index.count(key)) {
      DevicePlan d;
      d.node = w.node;
      d.device_id = w.device_id;
      for (const auto& n : placement.nodes)
        if (n.name == w.node)
          d.capacity = static_cast<int64_t>(n.memory_gb * static_cast<double>(1ll << 30));
      index[key] = plan.devices.size();
      plan.devices.push_back(d);
    }
    DevicePlan& d = plan.devices[index[key]];
    d.roles.push_back(w.label());
    const RolePlan* r = plan.role(role_name(w.role));
    if (!r) continue;
    for (const auto& [phase, bytes] : r->terms.phases) d.phases[phase] += bytes;
  }
  for (auto& d : plan.devices) {
    d.total = 0;
    for (const auto& [phase, bytes] : d.phases) {
      if (bytes > d.total) {
        d.total = bytes;
        d.peak_phase = phase;
      }
    }
  }
}

// rollout.kv_cache_memory_gb "auto" (vLLM's profile-then-fill): on every device of the
// rollout, capacity x gpu_memory_utilization less what the generate phase holds beside the
// KV cache; the pool is the smallest over the rollout's devices (every rank runs the same
// engine), and never more than max_num_seqs full-length sequences need.
void size_auto_kv_cache(const Placement& placement, MemoryPlan& plan) {
  RolePlan* rollout = nullptr;
  for (auto& r : plan.roles)
    if (r.input.work == RoleWork::kGenerate && r.input.kv_auto) rollout = &r;
  if (!rollout) return;
  std::optional<int64_t> budget;
  std::string where;
  for (const auto& d : plan.devices) {
    if (std::none_of(d.roles.begin(), d.roles.end(),
                     [](const std::string& l) { return l.rfind("rollout[", 0) == 0; }))
      continue;
    const int64_t others = d.phases.at("generate") - rollout->terms.kv_cache;
    const int64_t left = static_cast<int64_t>(static_cast<double>(d.capacity) *
                                              rollout->input.gpu_memory_utilization) -
                         others;
    if (!budget || left < *budget) {
      budget = left;
      where = d.node + ":" + std::to_string(d.device_id);
    }
  }
  if (!budget) return;
  // A pool below one sequence is the same bad input as a too-small explicit budget: a run
  // stops on it (kv_cache_gb_for_run); the plan shows the device over budget with the
  // smallest pool that works, so that its suggestions apply.
  const int64_t least = one_sequence_kv_bytes(rollout->input);
  rollout->input.kv_cache_budget = std::max(*budget, least);
  if (*budget < least) {
    char util[16];
    std::snprintf(util, sizeof util, "%.0f%%", 100 * rollout->input.gpu_memory_utilization);
    plan.kv_auto_error = "rollout.kv_cache_memory_gb auto: " + where + " has " +
                         format_gib(std::max<int64_t>(*budget, 0)) +
                         " GiB left for the KV cache in the generate phase (" + util +
                         " of its memory less every other term), less than one sequence of " +
                         std::to_string(rollout->input.prompt_len) + " + " +
                         std::to_string(rollout->input.max_new_tokens) + " tokens needs (" +
                         format_gib(least) + " GiB)";
  }
  rollout->terms = plan_role(rollout->input);
  fill_devices(placement, plan);
}

}  // namespace

MemoryPlan plan_memory(const JobSpec& spec, const std::map<Role, models::ModelConfig>& models,
                       bool suggest) {
  const Placement placement = place(spec);
  MemoryPlan plan;
  for (Role role : spec.used_roles()) {
    auto it = models.find(role);
    if (it == models.end())
      throw InputError(std::string("memory plan: no model config for ") + role_name(role) + " (" +
                       spec.get_string(std::string(role_name(role)) + ".model") + "/config.json)");
    RolePlan rp;
    rp.input = role_memory_input(spec, role, placement, it->second);
    rp.terms = plan_role(rp.input);
    rp.collectives = plan_collectives(rp.input);
    rp.collective_wire_bytes =
        transport::wire_bytes_per_rank(rp.collectives, rp.input.group_size,
                                       rp.input.device_kind == DeviceKind::kCuda ? "nccl" : "gloo");
    if (rp.input.sends_weights && rp.input.lora_rank == 0)
      rp.sync_bytes = rp.input.compute_bytes * rp.input.model.num_parameters();
    plan.roles.push_back(rp);
  }
  fill_devices(placement, plan);
  size_auto_kv_cache(placement, plan);
  if (suggest) add_suggestions(spec, models, placement, plan);
  return plan;
}

double kv_cache_gb_for_run(const JobSpec& spec) {
  if (!spec.at("rollout.kv_cache_memory_gb").is_string())
    return spec.get_float("rollout.kv_cache_memory_gb");
  const Placement placement = place(spec);
  const auto group = placement.group(Role::kRollout);
  if (group.empty() || group.front().device_kind != DeviceKind::kCuda) return 0.0;
  std::vector<std::string> missing;
  const auto models = load_role_models(spec, missing);
  if (!missing.empty())
    throw InputError(
        "rollout.kv_cache_memory_gb auto: the plan needs every role's config.json; "
        "missing " +
        missing.front());
  const MemoryPlan plan = plan_memory(spec, models, /*suggest=*/false);
  if (!plan.kv_auto_error.empty()) throw InputError(plan.kv_auto_error);
  const RolePlan* r = plan.role("rollout");
  return r ? static_cast<double>(r->input.kv_cache_budget) / static_cast<double>(1ll << 30) : 0.0;
}

}  // namespace rlhf::engine
