// Core's part of a job spec's cross-field rules: the cluster's nodes, compute dtypes, models
// that default to another role's, which roles need a model, and where every used role's
// devices are. Each folder's own rules run from its SpecSection (cli/job_schema.cpp lists
// them); check_cross_fields runs them all, in order.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "core/cluster.h"
#include "core/spec_check.h"
#include "core/text.h"

namespace rlhf {

using nlohmann::json;

json::json_pointer spec_pointer(const std::string& dotted_path) {
  return json::json_pointer("/" + join(split(dotted_path, '.'), "/"));
}

void SpecCheck::problem(const std::string& path, const std::string& message) {
  problems.push_back({path, message});
  if (!path.empty()) bad_paths.insert(path);
}

bool SpecCheck::ok(std::initializer_list<std::string> paths) const {
  for (const auto& p : paths)
    if (bad_paths.count(p)) return false;
  return true;
}

const json& SpecCheck::at(const std::string& path) const {
  return resolved.at(spec_pointer(path));
}
void SpecCheck::set(const std::string& path, json value) {
  resolved[spec_pointer(path)] = std::move(value);
}
std::string SpecCheck::str(const std::string& path) const {
  return at(path).get<std::string>();
}
int64_t SpecCheck::integer(const std::string& path) const {
  const json& j = at(path);
  return j.is_number_integer() ? j.get<int64_t>() : static_cast<int64_t>(j.get<double>());
}
double SpecCheck::real(const std::string& path) const {
  return at(path).get<double>();
}
bool SpecCheck::flag(const std::string& path) const {
  return at(path).get<bool>();
}
bool SpecCheck::uses(Role role) const {
  return std::find(roles.used.begin(), roles.used.end(), role) != roles.used.end();
}
bool SpecCheck::trains(Role role) const {
  return std::find(roles.trained.begin(), roles.trained.end(), role) != roles.trained.end();
}

namespace {

std::string str(const SpecCheck& v, const std::string& path) {
  return v.str(path);
}

// A device of the cluster: node index and device id on that node.
struct Device {
  size_t node;
  int64_t id;
  bool operator<(const Device& o) const { return node != o.node ? node < o.node : id < o.id; }
  bool operator==(const Device& o) const { return node == o.node && id == o.id; }
};

struct NodeInfo {
  std::string name;
  int64_t devices;
};

// Validates cluster.nodes field by field and fills each node's defaults.
std::vector<NodeInfo> check_nodes(SpecCheck& v) {
  const std::string base = "cluster.nodes";
  json nodes = v.at(base);
  std::vector<NodeInfo> out;
  std::map<std::string, size_t> seen;
  for (size_t i = 0; i < nodes.size(); ++i) {
    std::string at = base + "[" + std::to_string(i) + "]";
    json& n = nodes[i];
    if (!n.is_object()) {
      v.problem(base, at + ": expected a node object, found " + n.dump());
      continue;
    }
    for (const auto& [field, _] : n.items()) {
      if (std::find(node_fields().begin(), node_fields().end(), field) != node_fields().end())
        continue;
      std::string hint = closest_match(field, node_fields());
      v.problem(base, at + "." + field + ": unknown node field" +
                          (hint.empty() ? "" : " (did you mean " + hint + "?)"));
    }
    if (!n.contains("host")) n["host"] = "127.0.0.1";
    if (!n.contains("kind")) n["kind"] = "cpu";
    if (!n.contains("name")) n["name"] = i == 0 ? "local" : "node" + std::to_string(i);
    bool cuda = n["kind"] == "cuda";
    if (!n.contains("memory_gb") && !cuda) n["memory_gb"] = 16;
    auto expect = [&](bool good, const std::string& field, const std::string& what) {
      if (!good)
        v.problem(base, at + "." + field + ": expected " + what + ", found " +
                            (n.contains(field) ? n[field].dump() : "nothing"));
      return good;
    };
    bool good = expect(n["name"].is_string() && !n["name"].get<std::string>().empty(), "name",
                       "a non-empty string");
    good &= expect(n["host"].is_string(), "host", "a string");
    good &= expect(n["kind"] == "cpu" || cuda, "kind", "cpu or cuda");
    good &= expect(n.contains("devices") && n["devices"].is_number_integer() &&
                       n["devices"].get<int64_t>() >= 1,
                   "devices", "an integer >= 1 (the device count)");
    good &= expect(
        n.contains("memory_gb") && n["memory_gb"].is_number() && n["memory_gb"].get<double>() > 0,
        "memory_gb", cuda ? "memory per GPU in GiB (a number > 0)" : "a number > 0");
    if (n.contains("compute_capability"))
      good &= expect(cuda && n["compute_capability"].is_number() &&
                         n["compute_capability"].get<double>() >= 3.0,
                     "compute_capability", "a cuda node's compute capability (e.g. 7.0, 8.0)");
    if (!good) continue;
    std::string name = n["name"];
    if (seen.count(name)) {
      v.problem(base, at + ".name: \"" + name + "\" is already the name of cluster.nodes[" +
                          std::to_string(seen[name]) + "]");
      continue;
    }
    seen[name] = i;
    out.push_back({name, n["devices"].get<int64_t>()});
  }
  v.set(base, nodes);
  return out;
}

// Fills models that default to another role's model (as OpenRLHF: ref and rollout from the
// actor's pretrain, critic from the reward model's).

// True when this machine's CPU has AMX-BF16 tiles, the only CPU units on which BF16 beats FP32
// here. Without any BF16 units LibTorch emulates BF16 matmuls
// (at::native::AVX2::bf16_dot_with_fp32_arith, ~10x slower than FP32 on the AMD EPYC machines);
// with AVX512-BF16 alone (an Intel Xeon, 2026-11-27) a BF16 linear layer's forward + backward
// ran at 74 GFLOP/s against FP32's 118, and a real-model GRPO step took over 4x longer.
bool cpu_has_bf16_units() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line);
    std::string w;
    while (words >> w)
      if (w == "amx_bf16") return true;
    return false;
  }
  return false;
}

// The kind ("cpu" or "cuda") of the node a role's devices are on: the node its devices object
// names, else the first node.
// The cluster node a role's devices are on (the first node when they name none).
json role_node(const SpecCheck& v, const std::string& role) {
  const json& nodes = v.at("cluster.nodes");
  if (!nodes.is_array() || nodes.empty() || !nodes[0].is_object()) return json::object();
  const json& devices = v.at(role + ".devices");
  if (devices.is_object() && !devices.empty())
    for (const auto& n : nodes)
      if (n.is_object() && n.value("name", std::string()) == devices.begin().key()) return n;
  return nodes[0];
}

// dtype "auto" -> bf16 on cuda nodes (fp16 on those whose compute_capability is below 8.0:
// no BF16 units) and on CPUs with AMX-BF16 units, else fp32; noted once.
void resolve_dtypes(SpecCheck& v) {
  std::vector<std::string> chosen;
  for (Role r : kAllRoles) {
    const std::string key = std::string(role_name(r)) + ".dtype";
    if (!v.ok({key, "cluster.nodes"}) || str(v, key) != "auto") continue;
    const json node = role_node(v, role_name(r));
    const bool cuda = node.value("kind", std::string("cpu")) == "cuda";
    const bool no_bf16_units = cuda && node.value("compute_capability", 8.0) < 8.0;
    const std::string dtype = no_bf16_units                  ? "fp16"
                              : cuda || cpu_has_bf16_units() ? "bf16"
                                                             : "fp32";
    v.set(key, dtype);
    chosen.push_back(std::string(role_name(r)) + " " + dtype);
  }
  if (!chosen.empty())
    v.notes.push_back(
        "compute dtype (auto): " + join(chosen, ", ") +
        (join(chosen, ",").find("fp16") != std::string::npos
             ? "; GPUs of compute capability below 8.0 have no BF16 units, so those roles compute "
               "in fp16 (trained ones with dynamic loss scaling)"
             : "") +
        (cpu_has_bf16_units() ? ""
                              : "; this CPU has no AMX-BF16 units, so cpu nodes compute in fp32"));
}

// Fills models that default to another role's model (as OpenRLHF: ref and rollout from the
// actor's pretrain, critic from the reward model's).
void inherit_models(SpecCheck& v) {
  auto inherit = [&](const std::string& role, const std::string& from) {
    if (str(v, role + ".model").empty()) v.set(role + ".model", v.at(from + ".model"));
  };
  inherit("ref", "actor");
  inherit("rollout", "actor");
  inherit("critic", "reward");
}

// Every used role needs a model; a role the user configured but this job does not use is a
// warning (with the reason its section gives).
void check_role_models(SpecCheck& v, const SpecSchema& schema) {
  const std::string kind = v.kind();
  const bool actor_model = !str(v, "actor.model").empty();
  for (Role r : v.roles.used) {
    std::string role = role_name(r);
    if (!str(v, role + ".model").empty()) continue;
    // Report the root cause once: ref and rollout default to the actor's model, and a ppo
    // reward without any source is reported by the rewards section.
    if ((r == Role::kRef || r == Role::kRollout) && !actor_model) continue;
    if (r == Role::kReward && kind == "ppo") continue;
    std::string what =
        r == Role::kCritic
            ? "a value-model directory (it defaults to reward.model, which is not set)"
        : r == Role::kTeacher
            ? "the model to distil from (algo.distill.coef or algo.distill.gkd.coef > 0), "
              "sharing the actor's tokenizer"
        : r == Role::kJudge
            ? "the generative judge's model (a reward.sources judge without a url runs on it)"
            : "a Hugging Face model directory (rlhf init-model makes one)";
    v.problem(role + ".model", "required for a " + kind + " job: " + what);
  }
  for (Role r : kAllRoles) {
    std::string role = role_name(r);
    if (v.uses(r)) continue;
    bool configured = v.user_paths.count(role + ".devices") || v.user_paths.count(role + ".model");
    if (!configured) continue;
    std::string why = role + " is configured but not used by this " + kind + " job";
    if (const std::string reason = schema.why_unused(v.resolved, r); !reason.empty())
      why += " (" + reason + ")";
    v.warnings.push_back(why + "; its devices stay free");
  }
}

// Parses a role's devices into (node, id) pairs, reporting unknown nodes and ids.
std::vector<Device> parse_devices(SpecCheck& v, const std::string& role,
                                  const std::vector<NodeInfo>& nodes) {
  const std::string path = role + ".devices";
  std::vector<Device> out;
  auto add_list = [&](size_t node, const json& ids) {
    for (const auto& id : ids) {
      int64_t d = id.get<int64_t>();
      if (d >= nodes[node].devices) {
        v.problem(path, "device " + std::to_string(d) + " does not exist on node \"" +
                            nodes[node].name + "\" (it has " + std::to_string(nodes[node].devices) +
                            " devices: 0.." + std::to_string(nodes[node].devices - 1) + ")");
        continue;
      }
      Device dev{node, d};
      if (std::find(out.begin(), out.end(), dev) != out.end()) {
        v.problem(path, "device " + std::to_string(d) + " is listed twice");
        continue;
      }
      out.push_back(dev);
    }
  };
  const json& spec = v.at(path);
  if (spec.is_array()) {
    if (!spec.empty()) add_list(0, spec);
    return out;
  }
  for (const auto& [node_name, ids] : spec.items()) {
    auto it = std::find_if(nodes.begin(), nodes.end(),
                           [&](const NodeInfo& n) { return n.name == node_name; });
    if (it == nodes.end()) {
      std::vector<std::string> names;
      for (const auto& n : nodes) names.push_back(n.name);
      v.problem(path, "no node named \"" + node_name +
                          "\" in cluster.nodes (nodes: " + join(names, ", ") + ")");
      continue;
    }
    add_list(static_cast<size_t>(it - nodes.begin()), ids);
  }
  return out;
}

json devices_json(const std::vector<Device>& devs, const std::vector<NodeInfo>& nodes) {
  bool all_first =
      std::all_of(devs.begin(), devs.end(), [](const Device& d) { return d.node == 0; });
  if (all_first) {
    json list = json::array();
    for (const auto& d : devs) list.push_back(d.id);
    return list;
  }
  json obj = json::object();
  for (const auto& d : devs) obj[nodes[d.node].name].push_back(d.id);
  return obj;
}

// Groups that did not ask to share devices must not: colocation is only ever asked for.
void check_disjoint(SpecCheck& v, const std::vector<Role>& used,
                    std::map<std::string, std::vector<Device>>& devs,
                    std::map<std::string, std::string>& colocate,
                    const std::vector<NodeInfo>& nodes) {
  std::vector<std::string> names;
  for (Role r : used) names.push_back(role_name(r));
  for (size_t i = 0; i < names.size(); ++i)
    for (size_t j = i + 1; j < names.size(); ++j) {
      const auto &a = names[i], &b = names[j];
      auto shares = [&](const std::string& x, const std::string& y) {
        return colocate.count(x) && colocate[x] == y;
      };
      bool allowed = shares(a, b) || shares(b, a) ||
                     (colocate.count(a) && colocate.count(b) && colocate[a] == colocate[b]);
      if (allowed) continue;
      for (const auto& d : devs[a])
        if (std::find(devs[b].begin(), devs[b].end(), d) != devs[b].end()) {
          v.problem(b + ".devices", "device " + std::to_string(d.id) + " on node \"" +
                                        nodes[d.node].name + "\" is also used by " + a +
                                        "; role groups must be disjoint unless one sets "
                                        "colocate_with");
          break;
        }
    }
}

// Resolves every used role's devices (explicit, colocated or automatic) and checks that
// groups are disjoint unless a role asked to colocate. Returns group sizes by role name.
std::map<std::string, int64_t> resolve_devices(SpecCheck& v, const std::vector<Role>& used,
                                               const std::vector<NodeInfo>& nodes) {
  std::map<std::string, std::vector<Device>> devs;
  std::map<std::string, std::string> colocate;
  auto is_used = [&](const std::string& name) {
    return std::any_of(used.begin(), used.end(), [&](Role r) { return name == role_name(r); });
  };
  for (Role r : used) {
    std::string role = role_name(r);
    devs[role] = parse_devices(v, role, nodes);
    std::string target = str(v, role + ".colocate_with");
    if (target.empty()) continue;
    std::string path = role + ".colocate_with";
    if (target == role) {
      v.problem(path, "a role cannot colocate with itself");
    } else if (!is_used(target)) {
      v.problem(path, "\"" + target +
                          "\" is not used by this job, so there is nothing to "
                          "share devices with");
    } else if (!str(v, target + ".colocate_with").empty()) {
      v.problem(path, "\"" + target + "\" itself colocates with \"" +
                          str(v, target + ".colocate_with") + "\"; name that role instead");
    } else {
      colocate[role] = target;
    }
  }
  // Explicit devices are taken first; then automatic ones from what is left, in role order.
  std::set<Device> taken;
  for (Role r : used)
    if (!colocate.count(role_name(r)))
      for (const auto& d : devs[role_name(r)]) taken.insert(d);
  for (Role r : used) {
    std::string role = role_name(r);
    if (!devs[role].empty() || colocate.count(role) || !v.ok({role + ".devices"})) continue;
    std::optional<Device> free;
    for (size_t n = 0; n < nodes.size() && !free; ++n)
      for (int64_t id = 0; id < nodes[n].devices && !free; ++id)
        if (!taken.count({n, id})) free = Device{n, id};
    if (!free) {
      v.problem(role + ".devices", "no free device left for " + role +
                                       " (every device of cluster.nodes is taken); name "
                                       "devices, add a node or set colocate_with");
      continue;
    }
    taken.insert(*free);
    devs[role] = {*free};
  }
  for (const auto& [role, target] : colocate) {
    if (devs[role].empty()) {
      devs[role] = devs[target];
      continue;
    }
    for (const auto& d : devs[role])
      if (std::find(devs[target].begin(), devs[target].end(), d) == devs[target].end())
        v.problem(role + ".devices", "device " + std::to_string(d.id) + " on node \"" +
                                         nodes[d.node].name + "\" is not one of " + target +
                                         "'s devices, which " + role + " colocates with");
  }
  check_disjoint(v, used, devs, colocate, nodes);
  std::map<std::string, int64_t> sizes;
  for (Role r : used) {
    std::string role = role_name(r);
    if (v.ok({role + ".devices"})) v.set(role + ".devices", devices_json(devs[role], nodes));
    sizes[role] = static_cast<int64_t>(devs[role].size());
  }
  return sizes;
}

}  // namespace

void check_cross_fields(SpecCheck& v, const SpecSchema& schema) {
  std::vector<NodeInfo> nodes;
  if (v.ok({"cluster.nodes"})) nodes = check_nodes(v);
  resolve_dtypes(v);
  for (const auto& section : schema.sections())
    if (section.resolve) section.resolve(v);
  inherit_models(v);
  v.roles = schema.roles(v.resolved);
  check_role_models(v, schema);
  if (v.ok({"cluster.nodes"}) && !nodes.empty()) v.group = resolve_devices(v, v.roles.used, nodes);
  for (const auto& section : schema.sections())
    if (section.rules) section.rules(v);
  check_cluster(v);
}

}  // namespace rlhf
