// Cross-field rules of the job spec: which roles a job uses, where their devices are, and
// that batch sizes, lengths and algorithm options agree. Each rule skips keys whose own
// value was already reported, so one mistake gives one message.
#include "core/spec_rules.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

#include "core/cluster.h"
#include "core/spec_schema.h"
#include "core/text.h"

namespace rlhf::detail {

using nlohmann::json;

void Validation::problem(const std::string& path, const std::string& message) {
  problems.push_back({path, message});
  if (!path.empty()) bad_paths.insert(path);
}

bool Validation::ok(std::initializer_list<std::string> paths) const {
  for (const auto& p : paths)
    if (bad_paths.count(p)) return false;
  return true;
}

json::json_pointer pointer(const std::string& dotted_path) {
  return json::json_pointer("/" + join(split(dotted_path, '.'), "/"));
}

const json& Validation::at(const std::string& path) const {
  return resolved.at(pointer(path));
}
void Validation::set(const std::string& path, json value) {
  resolved[pointer(path)] = std::move(value);
}

namespace {

bool is_group_estimator(const std::string& e) {
  return e == "rloo" || e == "reinforce_baseline" || e == "group_norm" || e == "grpo" ||
         e == "dr_grpo";
}

std::string str(const Validation& v, const std::string& path) {
  return v.at(path).get<std::string>();
}
int64_t num(const Validation& v, const std::string& path) {
  const json& j = v.at(path);
  return j.is_number_integer() ? j.get<int64_t>() : static_cast<int64_t>(j.get<double>());
}
double real(const Validation& v, const std::string& path) {
  return v.at(path).get<double>();
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
std::vector<NodeInfo> check_nodes(Validation& v) {
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
std::string role_node_kind(const Validation& v, const std::string& role) {
  const json& nodes = v.at("cluster.nodes");
  if (!nodes.is_array() || nodes.empty() || !nodes[0].is_object()) return "cpu";
  const json& devices = v.at(role + ".devices");
  if (devices.is_object() && !devices.empty())
    for (const auto& n : nodes)
      if (n.is_object() && n.value("name", std::string()) == devices.begin().key())
        return n.value("kind", std::string("cpu"));
  return nodes[0].value("kind", std::string("cpu"));
}

// dtype "auto" -> bf16 on cuda nodes and on CPUs with AMX-BF16 units, else fp32; noted once.
void resolve_dtypes(Validation& v) {
  std::vector<std::string> chosen;
  for (Role r : kAllRoles) {
    const std::string key = std::string(role_name(r)) + ".dtype";
    if (!v.ok({key, "cluster.nodes"}) || str(v, key) != "auto") continue;
    const bool cuda = role_node_kind(v, role_name(r)) == "cuda";
    const std::string dtype = cuda || cpu_has_bf16_units() ? "bf16" : "fp32";
    v.set(key, dtype);
    chosen.push_back(std::string(role_name(r)) + " " + dtype);
  }
  if (!chosen.empty())
    v.notes.push_back("compute dtype (auto): " + join(chosen, ", ") +
                      (cpu_has_bf16_units()
                           ? ""
                           : "; this CPU has no AMX-BF16 units, so cpu nodes compute in fp32"));
}

}  // namespace

json reward_source_list(const json& r, std::vector<SpecProblem>* problems) {
  auto s = [&](const char* path) { return r.at(pointer(path)).get<std::string>(); };
  auto problem = [&](const std::string& path, const std::string& message) {
    if (problems) problems->push_back({path, message});
  };
  const json& given = r.at(pointer("reward.sources"));
  json list = json::array();
  const std::vector<std::string> kinds = {"rule", "python", "remote_url", "model"};
  const std::vector<std::string> fields = {"rule",   "python", "remote_url", "model",
                                           "weight", "name",   "pattern"};
  if (!given.empty()) {
    for (const char* shorthand : {"reward.rule", "reward.python", "reward.remote_url"})
      if (!s(shorthand).empty())
        problem(shorthand, "set either reward.sources or the single-source keys, not both");
    for (size_t i = 0; i < given.size(); ++i) {
      const std::string at = "reward.sources[" + std::to_string(i) + "]";
      const json& g = given[i];
      json src = json::object();
      int found = 0;
      for (const auto& [field, value] : g.items()) {
        if (std::find(fields.begin(), fields.end(), field) == fields.end()) {
          std::string hint = closest_match(field, fields);
          problem("reward.sources", at + "." + field + ": unknown field" +
                                        (hint.empty() ? "" : " (did you mean " + hint + "?)"));
          continue;
        }
        if (field == "weight") {
          if (!value.is_number())
            problem("reward.sources", at + ".weight: expected a number, found " + value.dump());
          continue;
        }
        if (!value.is_string() || value.get<std::string>().empty()) {
          problem("reward.sources",
                  at + "." + field + ": expected a non-empty string, found " + value.dump());
          continue;
        }
        if (std::find(kinds.begin(), kinds.end(), field) != kinds.end()) {
          ++found;
          src["kind"] = field == "remote_url" ? "remote" : field;
        }
      }
      if (found != 1) {
        problem("reward.sources",
                at +
                    ": expected exactly one of \"rule\", \"python\", \"remote_url\", \"model\", "
                    "found " +
                    std::to_string(found));
        continue;
      }
      for (const auto& [field, value] : g.items())
        if (field != "weight" && value.is_string()) src[field] = value;
      src["weight"] = g.contains("weight") && g["weight"].is_number() ? g["weight"] : json(1.0);
      list.push_back(std::move(src));
    }
  } else {
    // reward.model is the source only when no other shorthand is set: beside a rule, a
    // Python function or a URL it is only where the critic starts from (critic.model's default).
    const bool other =
        !s("reward.rule").empty() || !s("reward.python").empty() || !s("reward.remote_url").empty();
    if (!s("reward.model").empty() && !other)
      list.push_back({{"kind", "model"}, {"model", s("reward.model")}});
    if (!s("reward.rule").empty()) list.push_back({{"kind", "rule"}, {"rule", s("reward.rule")}});
    if (!s("reward.python").empty())
      list.push_back({{"kind", "python"}, {"python", s("reward.python")}});
    if (!s("reward.remote_url").empty())
      list.push_back({{"kind", "remote"}, {"remote_url", s("reward.remote_url")}});
    for (auto& src : list) src["weight"] = 1.0;
  }
  // Names: given, else the rule's name, the Python function's, "remote", "model"; repeats get
  // a suffix (_2, _3) so every source has its own metric.
  std::map<std::string, int> used;
  for (auto& src : list) {
    if (src["kind"] == "rule" && src["rule"] == "format" && !src.contains("pattern") &&
        !s("reward.format_pattern").empty())
      src["pattern"] = s("reward.format_pattern");
    std::string name = src.value("name", std::string());
    if (name.empty()) {
      const std::string kind = src["kind"];
      if (kind == "rule")
        name = src["rule"];
      else if (kind == "python") {
        const std::string spec = src["python"];
        const auto colon = spec.rfind(':');
        name = colon == std::string::npos ? spec : spec.substr(colon + 1);
      } else
        name = kind;
    }
    if (int n = ++used[name]; n > 1) name += "_" + std::to_string(n);
    src["name"] = name;
  }
  return list;
}

namespace {

void inherit_models(Validation& v) {
  auto inherit = [&](const std::string& role, const std::string& from) {
    if (str(v, role + ".model").empty()) v.set(role + ".model", v.at(from + ".model"));
  };
  inherit("ref", "actor");
  inherit("rollout", "actor");
  inherit("critic", "reward");
}

void check_models_and_data(Validation& v, const std::vector<Role>& used) {
  const std::string kind = str(v, "kind");
  const bool actor_model = !str(v, "actor.model").empty();
  for (Role r : used) {
    std::string role = role_name(r);
    if (!str(v, role + ".model").empty()) continue;
    // Report the root cause once: ref and rollout default to the actor's model, and a ppo
    // reward without any source is reported below.
    if ((r == Role::kRef || r == Role::kRollout) && !actor_model) continue;
    if (r == Role::kReward && kind == "ppo") continue;
    std::string what =
        r == Role::kCritic
            ? "a value-model directory (it defaults to reward.model, which is not set)"
            : "a Hugging Face model directory (rlhf init-model makes one)";
    v.problem(role + ".model", "required for a " + kind + " job: " + what);
  }
  if (kind == "ppo") {
    std::vector<SpecProblem> problems;
    const json sources = reward_source_list(v.resolved, &problems);
    for (const auto& p : problems) v.problem(p.path, p.message);
    // An environment (env.*) may be the only source: its rewards are summed per trajectory.
    const bool environment = !str(v, "env.builtin").empty() || !str(v, "env.python").empty() ||
                             !str(v, "env.url").empty();
    if (sources.empty() && problems.empty() && !environment)
      v.problem("reward",
                "a ppo job needs a reward source: reward.model, reward.rule, reward.python, "
                "reward.remote_url, reward.sources or an environment (env.*)");
    int models = 0;
    for (const auto& src : sources) {
      if (src["kind"] == "model") ++models;
      if (src["kind"] == "python") {
        const std::string fn = src["python"];
        const auto colon = fn.rfind(':');
        if (colon == std::string::npos || colon == 0 || colon + 1 == fn.size() ||
            fn.compare(colon - 3 < fn.size() ? colon - 3 : 0, 3, ".py") != 0)
          v.problem(v.at("reward.sources").empty() ? "reward.python" : "reward.sources",
                    "expected \"FILE.py:FUNCTION\", found \"" + fn + "\"");
      }
      if (src["kind"] == "rule" && src["rule"] == "format" && !src.contains("pattern"))
        v.problem("reward.format_pattern",
                  "the format rule needs a pattern: reward.format_pattern, or \"pattern\" in its "
                  "reward.sources entry");
    }
    if (models > 1)
      v.problem("reward.sources", "at most one reward model source (the reward group serves it)");
    if (str(v, "data.prompt_dataset").empty())
      v.problem("data.prompt_dataset", "required for a ppo job: a JSONL file or synthetic:NAME");
  } else if (str(v, "data.dataset").empty()) {
    v.problem("data.dataset", "required for a " + kind + " job: a JSONL file or synthetic:NAME");
  }
  for (Role r : kAllRoles) {
    std::string role = role_name(r);
    if (std::find(used.begin(), used.end(), r) != used.end()) continue;
    bool configured = v.user_paths.count(role + ".devices") || v.user_paths.count(role + ".model");
    if (!configured) continue;
    std::string why = role + " is configured but not used by this " + kind + " job";
    if (r == Role::kRef &&
        (str(v, "algo.dpo.loss") == "simpo" || str(v, "algo.dpo.loss") == "orpo"))
      why += " (" + str(v, "algo.dpo.loss") + " needs no reference)";
    if (r == Role::kCritic && kind == "ppo") why += " (only the gae estimator uses a critic)";
    if (r == Role::kRef && (kind == "ppo" || kind == "dpo") &&
        (num(v, "actor.lora.rank") > 0 || !str(v, "actor.lora.adapter").empty()))
      why += " (the LoRA actor with its adapters off is the reference)";
    v.warnings.push_back(why + "; its devices stay free");
  }
}

// Parses a role's devices into (node, id) pairs, reporting unknown nodes and ids.
std::vector<Device> parse_devices(Validation& v, const std::string& role,
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

// Resolves every used role's devices (explicit, colocated or automatic) and checks that
// groups are disjoint unless a role asked to colocate. Returns group sizes by role name.
std::map<std::string, int64_t> resolve_devices(Validation& v, const std::vector<Role>& used,
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
  // Disjointness between groups that did not ask to share.
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
  std::map<std::string, int64_t> sizes;
  for (Role r : used) {
    std::string role = role_name(r);
    if (v.ok({role + ".devices"})) v.set(role + ".devices", devices_json(devs[role], nodes));
    sizes[role] = static_cast<int64_t>(devs[role].size());
  }
  return sizes;
}

void check_batches(Validation& v, const std::vector<Role>& used,
                   const std::map<std::string, int64_t>& group) {
  const std::string kind = str(v, "kind");
  const int64_t train_bs = num(v, "train.batch_size"), micro = num(v, "train.micro_batch_size");
  bool train_ok = v.ok({"train.batch_size", "train.micro_batch_size"});
  if (train_ok && micro > train_bs)
    v.problem("train.micro_batch_size", "is " + std::to_string(micro) +
                                            ", larger than train.batch_size (" +
                                            std::to_string(train_bs) + ")");
  for (Role r : used) {
    std::string role = role_name(r);
    if (!train_ok || !trains(v.resolved, r) || !group.count(role) || group.at(role) == 0) continue;
    int64_t per_step = micro * group.at(role);
    if (train_bs % per_step != 0)
      v.problem("train.batch_size",
                std::to_string(train_bs) + " is not divisible by train.micro_batch_size (" +
                    std::to_string(micro) + ") x " + role + " group size (" +
                    std::to_string(group.at(role)) + ") = " + std::to_string(per_step));
  }
  if (kind != "ppo") return;
  const int64_t n = num(v, "rollout.n_samples_per_prompt"), rb = num(v, "rollout.batch_size");
  if (train_ok && v.ok({"rollout.batch_size", "rollout.n_samples_per_prompt"}) &&
      (rb * n) % train_bs != 0)
    v.problem("rollout.batch_size", std::to_string(rb) +
                                        " prompts x rollout.n_samples_per_prompt (" +
                                        std::to_string(n) + ") = " + std::to_string(rb * n) +
                                        " samples is not a multiple of train.batch_size (" +
                                        std::to_string(train_bs) + ")");
  std::string est = str(v, "algo.advantage.estimator");
  if (is_group_estimator(est) && n < 2 && v.ok({"rollout.n_samples_per_prompt"}))
    v.problem("rollout.n_samples_per_prompt",
              "is 1, but the " + est +
                  " estimator compares samples of the same prompt: set it to 2 or more");
  if (v.ok({"rollout.micro_batch_size", "rollout.batch_size"}) &&
      num(v, "rollout.micro_batch_size") > rb)
    v.problem("rollout.micro_batch_size",
              "is " + std::to_string(num(v, "rollout.micro_batch_size")) +
                  ", larger than rollout.batch_size (" + std::to_string(rb) + ")");
}

// rollout.tensor_parallel_size t: the rollout's workers form engines of t consecutive ranks
// (rank order as core/placement.cpp gives it: nodes in cluster order, then the listed ids).
// Distinct GPUs per engine need no rule of their own: a role never lists a device twice.
void check_rollout_engines(Validation& v, const std::vector<Role>& used,
                           const std::map<std::string, int64_t>& group) {
  const std::string key = "rollout.tensor_parallel_size";
  if (std::find(used.begin(), used.end(), Role::kRollout) == used.end() || !v.ok({key})) return;
  const int64_t t = num(v, key);
  if (t == 1 || !group.count("rollout") || !v.ok({"rollout.devices", "cluster.nodes"})) return;
  const int64_t workers = group.at("rollout");
  if (workers % t != 0) {
    v.problem(key, std::to_string(t) + " does not divide the rollout's " + std::to_string(workers) +
                       " worker" + (workers == 1 ? "" : "s") +
                       " (rollout.devices): each engine takes " + std::to_string(t) +
                       " consecutive workers; list a multiple of " + std::to_string(t) +
                       " devices");
    return;
  }
  const json& nodes = v.at("cluster.nodes");
  const json& devices = v.at("rollout.devices");
  std::vector<std::pair<std::string, bool>> node_of_rank;  // node name, cuda
  for (const auto& n : nodes) {
    const std::string name = n.value("name", std::string());
    const bool cuda = n.value("kind", std::string()) == "cuda";
    if (devices.is_array() && &n == &nodes[0])
      for (size_t i = 0; i < devices.size(); ++i) node_of_rank.emplace_back(name, cuda);
    if (devices.is_object() && devices.contains(name))
      for (size_t i = 0; i < devices.at(name).size(); ++i) node_of_rank.emplace_back(name, cuda);
  }
  for (size_t first = 0; first + static_cast<size_t>(t) <= node_of_rank.size();
       first += static_cast<size_t>(t)) {
    const size_t last = first + static_cast<size_t>(t) - 1;
    if (!node_of_rank[first].second || node_of_rank[first].first == node_of_rank[last].first)
      continue;
    v.problem(key, "engine " + std::to_string(first / static_cast<size_t>(t)) +
                       " (rollout workers " + std::to_string(first) + ".." + std::to_string(last) +
                       ") spans nodes \"" + node_of_rank[first].first + "\" and \"" +
                       node_of_rank[last].first +
                       "\": its ranks all-reduce in every layer, so list each engine's " +
                       std::to_string(t) + " GPUs on one node");
    return;
  }
  const bool cuda = !node_of_rank.empty() && node_of_rank.front().second;
  if (cuda && !str(v, "rollout.colocate_with").empty())
    v.warnings.push_back(key + " " + std::to_string(t) +
                         " with rollout.colocate_with: the weight sync goes over NCCL or Gloo, "
                         "not CUDA IPC (IPC hands one whole model to one GPU)");
}

void check_lengths_and_algo(Validation& v) {
  const std::string kind = str(v, "kind");
  int64_t prompt = num(v, "data.prompt_max_len"), max_len = num(v, "data.max_len");
  if (kind == "ppo" && v.ok({"data.prompt_max_len", "rollout.max_new_tokens", "data.max_len"})) {
    int64_t gen = num(v, "rollout.max_new_tokens");
    if (prompt + gen > max_len)
      v.problem("data.max_len", std::to_string(max_len) + " is shorter than data.prompt_max_len (" +
                                    std::to_string(prompt) + ") + rollout.max_new_tokens (" +
                                    std::to_string(gen) + ") = " + std::to_string(prompt + gen));
  } else if (kind != "ppo" && v.ok({"data.prompt_max_len", "data.max_len"}) && prompt >= max_len) {
    v.problem("data.prompt_max_len", std::to_string(prompt) +
                                         " leaves no room for a response within data.max_len (" +
                                         std::to_string(max_len) + ")");
  }
  if (v.ok({"data.multiturn", "data.apply_chat_template"}) && v.at("data.multiturn").get<bool>()) {
    if (kind != "sft")
      v.problem("data.multiturn",
                "trains on whole conversations in sft jobs only (kind is " + kind + ")");
    else if (!v.at("data.apply_chat_template").get<bool>())
      v.problem("data.multiturn",
                "conversations are rendered with the chat template: set "
                "data.apply_chat_template=true (chatml or llama3)");
  }
  if (v.ok({"ref.zero_stage"}) && num(v, "ref.zero_stage") != 0 && num(v, "ref.zero_stage") != 3)
    v.problem("ref.zero_stage",
              "expected 0 (full weights on every ref worker) or 3 (weights sharded over the "
              "ref workers, one layer gathered at a time): stages 1 and 2 shard optimizer "
              "state and gradients, which an untrained reference has none of; found " +
                  v.at("ref.zero_stage").dump());
  double dual = real(v, "actor.dual_clip");
  if (v.ok({"actor.dual_clip"}) && dual != 0 && dual <= 1)
    v.problem("actor.dual_clip",
              "expected 0 (off) or a number > 1, found " + v.at("actor.dual_clip").dump());
  if (v.ok({"algo.kl.target", "algo.kl.init_coef"}) && real(v, "algo.kl.target") > 0 &&
      real(v, "algo.kl.init_coef") == 0)
    v.problem("algo.kl.target", "an adaptive KL target needs algo.kl.init_coef > 0");
  if (v.ok({"ckpt.save_steps"}) && num(v, "ckpt.save_steps") == 0)
    v.problem("ckpt.save_steps",
              "expected -1 (only at the end) or a number of steps >= 1, found 0");
  const auto clip = v.at("reward.clip_range");
  if (v.ok({"reward.clip_range"}) && clip[0].get<double>() >= clip[1].get<double>())
    v.problem("reward.clip_range", "expected [low, high] with low < high, found " + clip.dump());
  if (kind != "ppo") return;
  if (v.ok({"rollout.max_turns", "data.apply_chat_template"}) && num(v, "rollout.max_turns") > 1) {
    if (!v.at("data.apply_chat_template").get<bool>())
      v.problem("rollout.max_turns",
                "the environment's turns are rendered with the chat template: set "
                "data.apply_chat_template=true (chatml or llama3)");
  }
  if (v.ok({"reward.overlong_buffer_len", "rollout.max_new_tokens"}) &&
      num(v, "reward.overlong_buffer_len") > num(v, "rollout.max_new_tokens"))
    v.problem("reward.overlong_buffer_len",
              "expected at most rollout.max_new_tokens (" +
                  std::to_string(num(v, "rollout.max_new_tokens")) + "), found " +
                  std::to_string(num(v, "reward.overlong_buffer_len")));
  if (v.ok({"algo.dynamic_sampling", "reward.rule", "reward.remote_url", "reward.sources"}) &&
      v.at("algo.dynamic_sampling").get<bool>()) {
    bool model = false;
    for (const auto& src : reward_source_list(v.resolved)) model = model || src["kind"] == "model";
    if (model)
      v.problem("algo.dynamic_sampling",
                "needs the scores before scoring: use rule, python or remote reward sources (a "
                "reward model is not supported with dynamic sampling)");
    if (v.ok({"rollout.n_samples_per_prompt"}) && num(v, "rollout.n_samples_per_prompt") < 2)
      v.problem("algo.dynamic_sampling",
                "compares the samples of a prompt: set rollout.n_samples_per_prompt to 2 or more");
  }
}

}  // namespace

// A LoRA actor on the reference's model is its own reference (adapters off): no ref group
// (issue 30.2; ppo and the dpo family alike).
bool actor_is_reference(const json& r) {
  auto s = [&](const char* path) { return r.at(pointer(path)).get<std::string>(); };
  const bool lora =
      r.at(pointer("actor.lora.rank")).get<int64_t>() > 0 || !s("actor.lora.adapter").empty();
  return lora && s("ref.model") == s("actor.model");
}

std::vector<Role> used_roles(const json& r) {
  auto s = [&](const char* path) { return r.at(pointer(path)).get<std::string>(); };
  const std::string kind = s("kind");
  if (kind == "sft") return {Role::kActor};
  if (kind == "rm") return {Role::kReward};
  if (kind == "dpo") {
    if (s("algo.dpo.loss") == "simpo" || s("algo.dpo.loss") == "orpo") return {Role::kActor};
    if (actor_is_reference(r)) return {Role::kActor};
    return {Role::kActor, Role::kRef};
  }
  std::vector<Role> roles = {Role::kActor};
  if (s("algo.advantage.estimator") == "gae") roles.push_back(Role::kCritic);
  // The reward group serves the reward model source (reward.model or a {"model": DIR} entry).
  for (const auto& src : reward_source_list(r))
    if (src["kind"] == "model") roles.push_back(Role::kReward);
  double kl = r.at(pointer("algo.kl.init_coef")).get<double>();
  if ((kl > 0 || r.at(pointer("algo.kl.use_loss")).get<bool>()) && !actor_is_reference(r))
    roles.push_back(Role::kRef);
  roles.push_back(Role::kRollout);
  return roles;
}

bool trains(const json& r, Role role) {
  const std::string kind = r.at(pointer("kind")).get<std::string>();
  if (kind == "rm") return role == Role::kReward;
  if (kind == "ppo") {
    if (role == Role::kActor) return true;
    return role == Role::kCritic &&
           r.at(pointer("algo.advantage.estimator")).get<std::string>() == "gae";
  }
  return role == Role::kActor;
}

// <role>.lora.*: LoRA only where the role is trained (the actor; a ppo critic; the reward
// model of an rm job: value-head roles train their head beside the adapters); target names
// PEFT knows; an adapter directory that holds PEFT's config.
void check_lora(Validation& v) {
  const std::string kind = str(v, "kind");
  const std::vector<std::string> known = {"q_proj",    "k_proj",  "v_proj",    "o_proj",
                                          "gate_proj", "up_proj", "down_proj", "all-linear"};
  for (Role r : {Role::kActor, Role::kCritic, Role::kReward}) {
    const std::string role = role_name(r), p = role + ".lora.";
    if (!v.ok({p + "rank", p + "adapter", p + "target_modules"})) continue;
    const bool on = num(v, p + "rank") > 0 || !str(v, p + "adapter").empty();
    if (!on) continue;
    const std::string key = num(v, p + "rank") > 0 ? p + "rank" : p + "adapter";
    if (!trains(v.resolved, r)) {
      v.problem(key, "the " + role + " is not trained in a " + kind + " job: no adapters to train");
      continue;
    }
    // The adapters-only sync merges into the rollout's own base: it must be the actor's.
    if (kind == "ppo" && v.ok({"rollout.lora_sync", "rollout.model", "actor.model"}) &&
        str(v, "rollout.lora_sync") == "adapters" &&
        std::filesystem::weakly_canonical(str(v, "rollout.model")) !=
            std::filesystem::weakly_canonical(str(v, "actor.model")))
      v.problem("rollout.lora_sync",
                "adapters needs the rollout to hold the actor's base (rollout.model " +
                    str(v, "rollout.model") + " is not actor.model " + str(v, "actor.model") +
                    "); set rollout.lora_sync merged");
    for (const std::string& name : split_names(str(v, p + "target_modules")))
      if (std::find(known.begin(), known.end(), name) == known.end())
        v.problem(p + "target_modules", "\"" + name +
                                            "\" is not a linear map of a Llama-family decoder "
                                            "(expected q_proj, k_proj, v_proj, o_proj, gate_proj, "
                                            "up_proj, down_proj or all-linear)");
    const std::string adapter = str(v, p + "adapter");
    if (!adapter.empty() &&
        !std::filesystem::exists(std::filesystem::path(adapter) / "adapter_config.json"))
      v.problem(p + "adapter", adapter +
                                   " holds no adapter_config.json (expected a PEFT "
                                   "LoRA adapter directory)");
  }
}

// The environment of multi-turn rollouts (env.*): at most one kind, a Python file that
// exists, an http:// URL, and only in ppo jobs (the rollout that runs it).
void check_env(Validation& v) {
  const std::vector<std::string> kinds = {"env.builtin", "env.python", "env.url"};
  std::vector<std::string> set;
  for (const auto& k : kinds)
    if (v.ok({k}) && !str(v, k).empty()) set.push_back(k);
  if (set.size() > 1)
    v.problem(set[1], "set at most one of env.builtin, env.python, env.url (found " +
                          join(set, " and ") + ")");
  if (!set.empty() && str(v, "kind") != "ppo")
    v.problem(set[0],
              "environments run in the rollout of ppo jobs, not in a " + str(v, "kind") + " job");
  const std::string python = v.ok({"env.python"}) ? str(v, "env.python") : "";
  if (!python.empty()) {
    const auto colon = python.rfind(':');
    const std::string file = colon == std::string::npos ? "" : python.substr(0, colon);
    if (colon == std::string::npos || colon + 1 == python.size() || file.size() < 4 ||
        file.compare(file.size() - 3, 3, ".py") != 0)
      v.problem("env.python", "expected \"FILE.py:FACTORY\", found \"" + python + "\"");
    else if (!std::filesystem::is_regular_file(file))
      v.problem("env.python", "no such file: " + file);
  }
  const std::string url = v.ok({"env.url"}) ? str(v, "env.url") : "";
  if (!url.empty() && (url.rfind("http://", 0) != 0 || url.size() == 7))
    v.problem("env.url", "expected http://host[:port][/path], found \"" + url + "\"");
}

void check_cross_fields(Validation& v) {
  std::vector<NodeInfo> nodes;
  if (v.ok({"cluster.nodes"})) nodes = check_nodes(v);
  resolve_dtypes(v);
  // A {"model": DIR} source is the reward role's model.
  if (v.ok({"reward.sources"}) && str(v, "kind") == "ppo") {
    for (const auto& src : reward_source_list(v.resolved)) {
      if (src["kind"] == "model" && str(v, "reward.model").empty()) {
        v.set("reward.model", src["model"]);
      } else if (src["kind"] == "model" && src["model"] != v.at("reward.model")) {
        v.problem("reward.sources",
                  "the model source " + src["model"].dump() + " differs from reward.model " +
                      v.at("reward.model").dump() + " (the reward group serves one)");
      }
    }
  }
  inherit_models(v);
  std::vector<Role> used = used_roles(v.resolved);
  check_models_and_data(v, used);
  std::map<std::string, int64_t> group;
  if (v.ok({"cluster.nodes"}) && !nodes.empty()) group = resolve_devices(v, used, nodes);
  check_batches(v, used, group);
  check_rollout_engines(v, used, group);
  check_lengths_and_algo(v);
  check_lora(v);
  check_env(v);
  check_cluster(v);
}

}  // namespace rlhf::detail
