// The key table's composition: KeyTable (what a folder declares its keys with), SpecSchema
// (the sections cli/ composes, in documentation order) and the schema this process installed.
#include "core/spec_schema.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <sstream>
#include <stdexcept>

#include "core/errors.h"
#include "core/text.h"

namespace rlhf {

using nlohmann::json;

KeySpec& KeyTable::add(std::string path, KeyType type, json def, std::string doc) {
  KeySpec k;
  k.path = std::move(path);
  k.type = type;
  k.default_value = std::move(def);
  k.doc = std::move(doc);
  keys_.push_back(std::move(k));
  return keys_.back();
}
void KeyTable::integer(std::string path, int64_t def, double lo, double hi, std::string doc) {
  auto& k = add(std::move(path), KeyType::kInt, def, std::move(doc));
  k.min = lo;
  if (hi < kUnbounded) k.max = hi;
}
void KeyTable::number(std::string path, double def, double lo, double hi, std::string doc,
                      bool lo_exclusive) {
  auto& k = add(std::move(path), KeyType::kFloat, def, std::move(doc));
  k.min = lo;
  k.min_exclusive = lo_exclusive;
  if (hi < kUnbounded) k.max = hi;
}
void KeyTable::number_or_auto(std::string path, json def, double lo, std::string doc) {
  auto& k = add(std::move(path), KeyType::kFloatOrAuto, std::move(def), std::move(doc));
  k.min = lo;
}
void KeyTable::boolean(std::string path, bool def, std::string doc) {
  add(std::move(path), KeyType::kBool, def, std::move(doc));
}
void KeyTable::string(std::string path, std::string def, std::string doc) {
  add(std::move(path), KeyType::kString, std::move(def), std::move(doc));
}
void KeyTable::file(std::string path, std::string def, std::string doc) {
  add(std::move(path), KeyType::kPath, std::move(def), std::move(doc));
}
void KeyTable::model(std::string path, std::string doc) {
  add(std::move(path), KeyType::kPath, "",
      std::move(doc) +
          " A directory, preset:NAME (an architecture without weights, for plan and validate), "
          "a name scripts/get-model makes (smollm2-135m-instruct) or ORG/NAME[@REVISION] in the "
          "Hugging Face Hub cache, found offline (docs/models.md).")
      .model_ref = true;
}
void KeyTable::choice(std::string path, std::string def, std::vector<std::string> choices,
                      std::string doc) {
  auto& k = add(std::move(path), KeyType::kEnum, std::move(def), std::move(doc));
  k.choices = std::move(choices);
}
void KeyTable::numbers(std::string path, std::vector<double> def, std::string doc) {
  auto& k = add(std::move(path), KeyType::kFloatList, def, std::move(doc));
  k.list_len = def.size();
}
void KeyTable::integers(std::string path, std::vector<int64_t> def, double lo, std::string doc) {
  auto& k = add(std::move(path), KeyType::kIntList, def, std::move(doc));
  k.min = lo;
}

// Keys every role has: where its model comes from and where its workers run.
void add_role_placement(KeyTable& t, const std::string& role, const std::string& model_doc) {
  t.model(role + ".model", model_doc);
  t.add(role + ".devices", KeyType::kDevices, json::array(),
        "Devices of the " + role +
            " group: [0, 1] on the first node, or {\"node\": [0, 1], ...}; one worker per "
            "device. Empty: one free device is chosen (or the colocated role's devices).");
  std::vector<std::string> roles = {""};
  for (Role r : kAllRoles) roles.push_back(role_name(r));
  t.choice(role + ".colocate_with", "", std::move(roles),
           "Share the devices of this role (only when asked: roles are disjoint otherwise).");
  t.integers(role + ".cpu_affinity", {}, 0,
             "CPU cores every " + role +
                 " worker may run on (sched_setaffinity at start-up), e.g. [1] or [2, 3]; "
                 "empty: any. Pins role groups apart on a CPU machine so that they do not steal "
                 "each other's cores (what an overlap measurement needs); a core the machine "
                 "lacks stops the worker naming it.");
  t.choice(role + ".dtype", "auto", {"auto", "bf16", "fp16", "fp32"},
           "Compute dtype of the " + role +
               " model (master weights stay FP32 when trained). auto: bf16 on GPUs and on CPUs "
               "with AMX-BF16 units, fp32 on other CPUs, where BF16 is slower than FP32 (emulated "
               "without BF16 units; about 0.6x FP32 with AVX512-BF16 alone). fp16: for GPUs "
               "without BF16 units (V100, T4); a trained role then scales its loss dynamically "
               "(2^16 at first, halved on an overflowing step, which is skipped; doubled after "
               "2000 clean steps).");
}

SpecSection core_spec_section() {
  SpecSection s;
  s.owner = "core";
  s.keys = [](KeyTable& t) {
    t.choice("kind", "ppo", {"ppo", "dpo", "sft", "rm"},
             "Job kind: ppo (PPO family), dpo (DPO family), sft, rm (reward-model training).");
    t.string("name", "rlhf", "Run name; the run directory is logger.run_dir/name.");

    // Cluster and scheduler.
    t.add("cluster.nodes", KeyType::kNodes,
          json::array({{{"name", "local"},
                        {"host", "127.0.0.1"},
                        {"kind", "cpu"},
                        {"devices", 8},
                        {"memory_gb", 16}}}),
          "Nodes: [{\"name\", \"host\", \"kind\": cpu|cuda, \"devices\": count, \"memory_gb\": "
          "per device, \"compute_capability\": cuda only, optional, e.g. 7.0 for V100: below 8.0 "
          "dtype auto is fp16}]. On cpu, devices are logical slots.");
    t.string("cluster.interface", "127.0.0.1",
             "Address the scheduler binds to (loopback unless a job spans nodes).");
    t.string("cluster.port_range", "",
             "Ports of the job's endpoints, \"LOW-HIGH\": the worker endpoint takes the first "
             "free one, the rendezvous store (it admits only workers that prove the job token) the "
             "next. \"\": any free port.");
    t.choice("cluster.launcher", "local", {"local", "manual", "slurm"},
             "Who starts the workers: local (rlhf run, on this host), manual (anyone, with `rlhf "
             "worker --connect`; see docs/multinode.md), slurm (srun steps inside an allocation).");
    t.number("cluster.join_timeout_s", 300.0, 1, 86400,
             "manual and slurm: seconds rlhf run waits for every worker to join before it stops, "
             "naming the ones that never came.");
    t.boolean("cluster.curve", false,
              "Encrypt the scheduler's worker sockets with ZeroMQ CURVE (needs libzmq with "
              "libsodium); the job token still decides who joins.");
    t.integer("cluster.threads_per_worker", 1, 1, 1024,
              "Torch intra-op threads per worker process (OMP_NUM_THREADS).");
    t.string("cluster.cuda_alloc_conf", "expandable_segments:True",
             "PYTORCH_CUDA_ALLOC_CONF of workers on cuda nodes (the CUDA caching allocator's "
             "settings; expandable segments avoid fragmentation OOMs). \"\" leaves it unset.");
  };
  return s;
}

SpecSchema::SpecSchema(std::vector<SpecSection> sections) : sections_(std::move(sections)) {
  for (const auto& section : sections_) {
    if (!section.keys) continue;
    KeyTable t;
    section.keys(t);
    for (auto& k : t.take()) {
      if (find(k.path))
        throw std::logic_error("spec key " + k.path + " is declared twice (again by " +
                               section.owner + ")");
      index_[k.path] = keys_.size();
      paths_.push_back(k.path);
      keys_.push_back(std::move(k));
    }
  }
}

const KeySpec* SpecSchema::find(const std::string& path) const {
  auto it = index_.find(path);
  return it == index_.end() ? nullptr : &keys_[it->second];
}

RoleUse SpecSchema::roles(const json& resolved) const {
  for (const auto& section : sections_)
    if (section.roles)
      if (auto use = section.roles(resolved)) return *use;
  throw std::logic_error("no spec section runs job kind " + resolved.at("kind").dump());
}

std::string SpecSchema::why_unused(const json& resolved, Role role) const {
  std::vector<std::string> reasons;
  for (const auto& section : sections_)
    if (section.why_unused)
      if (std::string why = section.why_unused(resolved, role); !why.empty())
        reasons.push_back(std::move(why));
  return join(reasons, "; ");
}

namespace {

std::shared_ptr<const SpecSchema>& installed() {
  static std::shared_ptr<const SpecSchema> schema;
  return schema;
}

}  // namespace

void install_job_schema(std::shared_ptr<const SpecSchema> schema) {
  installed() = std::move(schema);
}

const SpecSchema& job_schema() {
  if (!installed())
    throw std::logic_error(
        "no job-spec schema installed: call install_job_schema(compose_job_schema()) "
        "(cli/job_schema.h) at start-up");
  return *installed();
}

const std::vector<KeySpec>& spec_keys() {
  return job_schema().keys();
}

const KeySpec* find_key(const std::string& path) {
  return job_schema().find(path);
}

const std::vector<std::string>& spec_key_paths() {
  return job_schema().paths();
}
bool is_builtin_source(const std::string& value) {
  if (value.empty()) return true;
  // "synthetic:letters", "preset:llama-3-8b": a scheme of letters before the first ':' and
  // no '/' before it (so "./a:b" and "/data/x:y" stay paths).
  const auto colon = value.find(':');
  if (colon == std::string::npos || colon == 0) return false;
  for (size_t i = 0; i < colon; ++i)
    if (!std::isalpha(static_cast<unsigned char>(value[i])) && value[i] != '_') return false;
  return true;
}

std::string closest_key(const std::string& path) {
  const auto dot = path.rfind('.');
  const std::string parent = dot == std::string::npos ? "" : path.substr(0, dot + 1);
  const std::string leaf = path.substr(parent.size());
  // "job.name": the top-level keys are listed under a "top level" heading, not a section.
  if (parent == "job." && find_key(leaf)) return leaf;
  // The children of `parent`: keys, or the next section down ("rollout" for "rollouts").
  std::vector<std::string> siblings;
  for (const auto& known : spec_key_paths()) {
    if (known.rfind(parent, 0) != 0) continue;
    const std::string rest = known.substr(parent.size());
    const std::string sibling = parent + rest.substr(0, rest.find('.'));
    if (std::find(siblings.begin(), siblings.end(), sibling) == siblings.end())
      siblings.push_back(sibling);
  }
  // A sibling that shares a long prefix with the typed name is what a user shortened or
  // misspelled at the end (n_samples -> n_samples_per_prompt): the longest common prefix
  // wins when it covers at least 4 characters or the whole typed name.
  std::string best;
  size_t best_common = 0;
  for (const auto& sibling : siblings) {
    const std::string name = sibling.substr(parent.size());
    size_t common = 0;
    while (common < name.size() && common < leaf.size() && name[common] == leaf[common]) ++common;
    if (common > best_common) {
      best_common = common;
      best = sibling;
    }
  }
  if (!best.empty() && (best_common >= 4 || best_common == leaf.size())) return best;
  std::string hint = closest_match(path, siblings);
  if (!hint.empty()) return hint;
  // A misspelled section ("rolout.batch_size"): the same leaf under the closest section.
  return closest_match(path, spec_key_paths());
}

const std::vector<std::string>& node_fields() {
  static const std::vector<std::string> kFields = {"name",    "host",      "kind",
                                                   "devices", "memory_gb", "compute_capability"};
  return kFields;
}

json default_spec_json() {
  json out = json::object();
  for (const auto& k : spec_keys())
    out[json::json_pointer("/" + join(split(k.path, '.'), "/"))] = k.default_value;
  return out;
}

std::string spec_markdown() {
  std::ostringstream md;
  md << "# Job spec reference\n\n"
        "<!-- Generated by `rlhf spec --markdown` from the keys each folder declares "
        "(cli/job_schema.cpp"
        " composes them). Do not edit by hand: a test fails when this file differs from the table. "
        "-->\n\n"
        "A job spec is one JSON object, nested by the dotted paths below (`--set "
        "rollout.n_samples_per_prompt=8` overrides one value). Every key is optional; "
        "unknown keys are errors. Comments (`//`) are allowed.\n\n"
        "**Paths** (type `path`): a relative path written in a spec file is relative to the "
        "directory of that file, so `examples/ppo_tiny.json` runs the same from any working "
        "directory; a relative path given with `--set` is relative to the current directory, "
        "as on any command line. Absolute paths and built-in sources (`synthetic:NAME`, "
        "`preset:NAME`) are taken as they are.\n";
  // Folders may add keys to another's section (ppo's actor.eps_clip beside engine's
  // actor.zero_stage): each section is listed whole, where its first key appears.
  std::vector<std::string> tops;
  for (const auto& k : spec_keys()) {
    const std::string top = k.path.find('.') == std::string::npos ? "" : split(k.path, '.')[0];
    if (std::find(tops.begin(), tops.end(), top) == tops.end()) tops.push_back(top);
  }
  std::vector<const KeySpec*> ordered;
  for (const auto& top : tops)
    for (const auto& k : spec_keys())
      if ((k.path.find('.') == std::string::npos ? "" : split(k.path, '.')[0]) == top)
        ordered.push_back(&k);
  std::string section;
  for (const KeySpec* key : ordered) {
    const KeySpec& k = *key;
    std::string top = split(k.path, '.').front();
    const bool top_level = k.path.find('.') == std::string::npos;
    std::string group = top_level ? "top level" : top;
    if (group != section) {
      section = group;
      md << "\n## " << section << "\n\n";
      if (top_level)
        md << "Keys at the top of the spec, in no section: `{\"kind\": \"dpo\", \"name\": "
              "\"my-run\", ...}`.\n\n";
      md << "| key | type | default | allowed | description |\n"
         << "| --- | --- | --- | --- | --- |\n";
    }
    std::string allowed = k.expectation();
    if (allowed.rfind("an ", 0) == 0) allowed = allowed.substr(3);
    if (allowed.rfind("a ", 0) == 0) allowed = allowed.substr(2);
    std::string def = k.default_value.dump();
    std::string doc = k.doc;
    for (auto* s : {&def, &allowed, &doc}) {
      std::string escaped;
      for (char c : *s) escaped += (c == '|') ? std::string("\\|") : std::string(1, c);
      *s = escaped;
    }
    md << "| `" << k.path << "` | " << key_type_name(k.type) << " | `" << def << "` | " << allowed
       << " | " << doc << " |\n";
  }
  return md.str();
}

}  // namespace rlhf