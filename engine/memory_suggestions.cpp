// rlhf plan's suggestions: when a device is over budget, the spec changes that would make it
// fit, each tried by planning the changed spec again.
#include "engine/memory_suggestions.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include "core/errors.h"
#include "core/text.h"
#include "engine/memory_plan.h"
#include "models/tensor_parallel.h"

namespace rlhf::engine {

namespace {

// A spec change worth trying, and whether it fits by doing less or more slowly per step
// (recompute, host round trips, smaller batches, shorter sequences) rather than by placing
// the same work better (phases, the KV pool, tensor parallelism, sharding, more devices).
struct Candidate {
  std::string change;
  bool costs_throughput = false;
};

// Candidates that keep throughput for the roles on one device: sleep mode and the KV pool
// where the rollout shares a GPU, wider engines, sharding, more devices.
void placement_changes(const JobSpec& spec, const MemoryPlan& plan, const DevicePlan& device,
                       const Placement& placement, const std::set<std::string>& names,
                       std::vector<Candidate>& out) {
  for (const auto& name : names) {
    const RolePlan* r = plan.role(name);
    if (!r) continue;
    const RoleMemoryInput& in = r->input;
    if (in.work == RoleWork::kGenerate && in.device_kind == DeviceKind::kCuda) {
      if (in.sync_over_ipc && !in.sleeps_outside_generate && !in.generates_while_training &&
          !spec.get_bool("rollout.offload_while_training"))
        out.push_back({"rollout.offload_while_training=true", false});
      if (!in.kv_auto) out.push_back({"rollout.kv_cache_memory_gb=auto", false});
    }
    if (in.sends_weights && in.sync_over_ipc && !in.offloads_states_while_generating &&
        !in.adam_offload && spec.get_int("algo.max_staleness") == 0)
      out.push_back({"actor.offload_optimizer_while_generating=true", false});
    // Engines twice as wide over the same workers: each rank holds half the weights and KV.
    const int wider = 2 * in.tensor_parallel;
    if (in.work == RoleWork::kGenerate && in.group_size % wider == 0) {
      try {
        models::check_tensor_parallel(in.model, wider, name);
        out.push_back({name + ".tensor_parallel_size=" + std::to_string(wider), false});
      } catch (const InputError&) {
        // The model's heads or vocabulary do not split that many ways.
      }
    }
    if (in.work == RoleWork::kTrain && in.zero_stage == 1)
      out.push_back({name + ".zero_stage=2", false});
  }
  // Spread a role over twice the devices, taking free ones of the same node.
  std::set<int> used;
  for (const auto& w : placement.workers)
    if (w.node == device.node) used.insert(w.device_id);
  int node_devices = 0;
  for (const auto& n : placement.nodes)
    if (n.name == device.node) node_devices = n.devices;
  for (const auto& name : names) {
    const RolePlan* r = plan.role(name);
    // More ranks help where weights or states are sharded: trainers, ZeRO-3 ref/reward.
    if (!r || (r->input.work != RoleWork::kTrain && !r->input.shard_weights)) continue;
    auto group = placement.group(parse_role(name));
    std::vector<int> ids;
    for (const auto& w : group) ids.push_back(w.device_id);
    for (int d = 0; d < node_devices && ids.size() < 2 * group.size(); ++d)
      if (!used.count(d)) ids.push_back(d);
    if (ids.size() < 2 * group.size()) continue;
    std::string list;
    for (int d : ids) list += (list.empty() ? "" : ",") + std::to_string(d);
    out.push_back({name + ".devices=[" + list + "]", false});
  }
}

// Spec changes worth trying for the roles on one device: those that keep throughput first,
// then those that cost it, each group in the order a practitioner would reach for them.
std::vector<Candidate> candidate_changes(const JobSpec& spec, const MemoryPlan& plan,
                                         const DevicePlan& device, const Placement& placement) {
  std::vector<Candidate> out;
  std::set<std::string> names;
  for (const auto& label : device.roles) names.insert(label.substr(0, label.find('[')));
  placement_changes(spec, plan, device, placement, names, out);
  bool trains = false, generates = false, infers = false;
  for (const auto& name : names) {
    const RolePlan* r = plan.role(name);
    if (!r) continue;
    if (r->input.work == RoleWork::kTrain) {
      trains = true;
      if (r->input.zero_stage == 2) out.push_back({name + ".zero_stage=3", true});
      if (!r->input.checkpointing) out.push_back({name + ".gradient_checkpointing=true", true});
      if (!r->input.adam_offload && r->input.device_kind == DeviceKind::kCuda)
        out.push_back({name + ".adam_offload=true", true});
    }
    generates |= r->input.work == RoleWork::kGenerate;
    infers |= r->input.work == RoleWork::kInfer;
    if (r->input.work == RoleWork::kInfer &&
        (name == "ref" || name == "teacher" || name == "reward") && !r->input.shard_weights &&
        r->input.group_size > 1)
      out.push_back({name + ".zero_stage=3", true});
  }
  const int64_t train_mb = spec.get_int("train.micro_batch_size");
  if (trains && train_mb > 1)
    out.push_back({"train.micro_batch_size=" + std::to_string(train_mb / 2), true});
  const int64_t rollout_mb = spec.get_int("rollout.micro_batch_size");
  if ((generates || infers) && rollout_mb > 1)
    out.push_back({"rollout.micro_batch_size=" + std::to_string(rollout_mb / 2), true});
  const int64_t max_len = spec.get_int("data.max_len");
  if (max_len > 2) out.push_back({"data.max_len=" + std::to_string(max_len / 2), true});
  return out;
}

// Bytes over capacity, summed over devices (0 when everything fits).
int64_t overflow(const MemoryPlan& plan) {
  int64_t over = 0;
  for (const auto& d : plan.devices) over += std::max<int64_t>(0, d.total - d.capacity);
  return over;
}

int64_t device_total(const MemoryPlan& plan, const DevicePlan& device) {
  for (const auto& d : plan.devices)
    if (d.node == device.node && d.device_id == device.device_id) return d.total;
  return 0;
}

// `spec` with one more override, or nothing when it breaks a rule (batch divisibility, ...).
std::optional<JobSpec> with_change(const JobSpec& spec, const std::string& change) {
  try {
    return JobSpec::parse(spec.json().dump(), spec.source(), {change});
  } catch (const InputError&) {
    return std::nullopt;
  }
}

// The plan of `spec`, or nothing when it cannot be planned (a KV pool below one sequence).
std::optional<MemoryPlan> plan_again(const JobSpec& spec,
                                     const std::map<Role, models::ModelConfig>& models) {
  try {
    return plan_memory(spec, models, false);
  } catch (const InputError&) {
    return std::nullopt;
  }
}

}  // namespace

// Each candidate alone (reported with the worst device's new total); when none fits alone,
// first the combination as one --set line: candidates in order (those that keep throughput
// first), each kept if it lowers the bytes over capacity, until everything fits; a key
// appears once, with its last value.
void add_suggestions(const JobSpec& spec, const std::map<Role, models::ModelConfig>& models,
                     const Placement& placement, MemoryPlan& plan) {
  const DevicePlan* worst = nullptr;
  std::vector<Candidate> candidates;
  auto add_new = [](std::vector<Candidate>& to, const std::vector<Candidate>& from) {
    for (const auto& c : from)
      if (std::none_of(to.begin(), to.end(),
                       [&](const Candidate& x) { return x.change == c.change; }))
        to.push_back(c);
  };
  for (const auto& d : plan.devices) {
    if (d.fits()) continue;
    if (!worst || d.total - d.capacity > worst->total - worst->capacity) worst = &d;
    add_new(candidates, candidate_changes(spec, plan, d, placement));
  }
  if (!worst) return;
  bool any_fits = false;
  for (const auto& c : candidates) {
    auto changed = with_change(spec, c.change);
    if (!changed) continue;
    const auto again = plan_again(*changed, models);
    if (!again) continue;
    plan.suggestions.push_back(
        {c.change, device_total(*again, *worst), again->fits(), c.costs_throughput});
    any_fits |= again->fits();
  }
  // Fitting first; among them, those that keep throughput.
  std::stable_sort(plan.suggestions.begin(), plan.suggestions.end(),
                   [](const PlanSuggestion& a, const PlanSuggestion& b) {
                     if (a.fits != b.fits) return a.fits;
                     return a.fits && !a.costs_throughput && b.costs_throughput;
                   });
  if (any_fits) return;
  JobSpec current = spec;
  int64_t over = overflow(plan);
  std::vector<std::pair<std::string, std::string>> combined;
  bool costs = false;
  auto add_change = [&combined](const std::string& change) {
    const auto eq = change.find('=');
    const std::string key = change.substr(0, eq), value = change.substr(eq + 1);
    for (auto& kv : combined)
      if (kv.first == key) return void(kv.second = value);
    combined.push_back({key, value});
  };
  MemoryPlan last = plan;
  // Rounds: the candidates of the changed spec again (a micro batch can halve twice).
  for (int round = 0; round < 6 && over > 0; ++round) {
    const int64_t before = over;
    const Placement now = place(current);
    std::vector<Candidate> next;
    for (const auto& d : last.devices)
      if (!d.fits()) add_new(next, candidate_changes(current, last, d, now));
    std::stable_partition(next.begin(), next.end(),
                          [](const Candidate& c) { return !c.costs_throughput; });
    for (const auto& c : next) {
      auto changed = with_change(current, c.change);
      if (!changed) continue;
      auto again = plan_again(*changed, models);
      if (!again || overflow(*again) >= over) continue;
      current = *changed;
      over = overflow(*again);
      last = std::move(*again);
      add_change(c.change);
      costs |= c.costs_throughput;
      if (over == 0) break;
    }
    if (over == before) break;
  }
  std::string text;
  for (const auto& [key, value] : combined)
    text += (text.empty() ? "" : " --set ") + key + "=" + value;
  // Not when it is one of the single changes already listed.
  if (!text.empty() && std::none_of(plan.suggestions.begin(), plan.suggestions.end(),
                                    [&](const PlanSuggestion& x) { return x.change == text; }))
    plan.suggestions.insert(plan.suggestions.begin(),
                            {text, device_total(last, *worst), over == 0, costs});
}

}  // namespace rlhf::engine
