// JobSpec: parse, override, type-check every key, fill defaults, then the cross-field rules
// (spec_rules.cpp). Problems are collected, never thrown one at a time.
#include "core/spec.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/spec_check.h"
#include "core/spec_schema.h"
#include "core/text.h"

namespace rlhf {

using nlohmann::json;

const char* job_kind_name(JobKind kind) {
  switch (kind) {
    case JobKind::kPpo:
      return "ppo";
    case JobKind::kDpo:
      return "dpo";
    case JobKind::kSft:
      return "sft";
    case JobKind::kRm:
      return "rm";
  }
  return "?";
}

const char* role_name(Role role) {
  switch (role) {
    case Role::kActor:
      return "actor";
    case Role::kCritic:
      return "critic";
    case Role::kReward:
      return "reward";
    case Role::kRef:
      return "ref";
    case Role::kTeacher:
      return "teacher";
    case Role::kJudge:
      return "judge";
    case Role::kRollout:
      return "rollout";
  }
  return "?";
}

Role parse_role(const std::string& name) {
  for (Role r : kAllRoles)
    if (name == role_name(r)) return r;
  throw InputError("unknown role '" + name +
                   "' (expected actor, critic, reward, ref, teacher, judge or rollout)");
}

namespace {

std::string report(const std::string& source, const std::vector<SpecProblem>& problems) {
  std::ostringstream out;
  out << source << ": " << problems.size() << (problems.size() == 1 ? " problem" : " problems");
  for (const auto& p : problems)
    out << "\n  " << (p.path.empty() ? std::string() : p.path + ": ") << p.message;
  return out.str();
}

// Parses JSON text (comments allowed); a syntax error becomes one problem with line:column.
json parse_text(const std::string& text, SpecCheck& v) {
  try {
    return json::parse(text, nullptr, /*allow_exceptions=*/true, /*ignore_comments=*/true);
  } catch (const json::parse_error& e) {
    LineCol lc = line_col(text, e.byte == 0 ? 0 : e.byte - 1);
    std::string what = e.what();
    // nlohmann prefixes "[json.exception.parse_error.101] parse error at line L, column C: ".
    if (auto pos = what.find(": "); pos != std::string::npos) what = what.substr(pos + 2);
    v.problem("", "malformed JSON at line " + std::to_string(lc.line) + ", column " +
                      std::to_string(lc.column) + ": " + what);
    return json();
  }
}

void apply_override(json& doc, const std::string& assignment, SpecCheck& v) {
  auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0) {
    v.problem("", "--set " + assignment + ": expected PATH=VALUE");
    return;
  }
  std::string path = trim(assignment.substr(0, eq));
  const KeySpec* key = find_key(path);
  if (!key) {
    std::string hint = closest_key(path);
    v.problem(path, "--set: unknown key" + (hint.empty() ? "" : " (did you mean " + hint + "?)"));
    return;
  }
  try {
    doc[spec_pointer(path)] = key->parse_override(assignment.substr(eq + 1));
  } catch (const InputError& e) {
    v.problem(path, e.what());
  }
}

// Walks the user's document: every leaf must be a known key of the right type.
void check_keys(const json& node, const std::string& prefix, SpecCheck& v) {
  for (const auto& [name, value] : node.items()) {
    std::string path = prefix.empty() ? name : prefix + "." + name;
    if (const KeySpec* key = find_key(path)) {
      v.user_paths.insert(path);
      if (std::string err = key->check(value); !err.empty()) {
        v.problem(path, err);
      } else {
        v.set(path, value);
      }
      continue;
    }
    bool is_prefix = false;
    for (const auto& known : spec_key_paths())
      if (known.rfind(path + ".", 0) == 0) is_prefix = true;
    if (is_prefix && value.is_object()) {
      check_keys(value, path, v);
    } else if (is_prefix) {
      v.problem(path, "expected an object (section " + path + "), found " + value.dump());
    } else if (path == "job" && value.is_object() && !value.empty()) {
      // {"job": {"name": ...}}: the reference lists kind and name as the job's keys, but
      // they are top-level; name each one with its hint (job.name -> name).
      for (const auto& [child, _] : value.items()) {
        const std::string hint = closest_key(path + "." + child);
        v.problem(path + "." + child,
                  "unknown key" + (hint.empty() ? "" : " (did you mean " + hint + "?)"));
      }
    } else {
      std::string hint = closest_key(path);
      v.problem(path, "unknown key" + (hint.empty() ? "" : " (did you mean " + hint + "?)"));
    }
  }
}

// Relative paths written in the spec file are relative to its directory (`base`); --set
// values are applied afterwards and stay relative to the current directory.
void resolve_paths(json& node, const std::string& prefix, const std::filesystem::path& base) {
  if (base.empty() || !node.is_object()) return;
  for (auto& [name, value] : node.items()) {
    const std::string path = prefix.empty() ? name : prefix + "." + name;
    if (value.is_object()) {
      resolve_paths(value, path, base);
      continue;
    }
    const KeySpec* key = find_key(path);
    if (key && key->type == KeyType::kSources && value.is_array()) {
      // The fields of a source that name files are paths too.
      for (auto& src : value)
        for (const std::string& field : key->path_fields) {
          // "judge.template": a field of an object field.
          json* holder = &src;
          std::string name = field;
          if (const auto dot = field.find('.'); dot != std::string::npos) {
            const std::string outer = field.substr(0, dot);
            holder = src.is_object() && src.contains(outer) ? &src[outer] : nullptr;
            name = field.substr(dot + 1);
          }
          if (holder && holder->is_object() && holder->contains(name) &&
              (*holder)[name].is_string() &&
              !std::filesystem::path((*holder)[name].get<std::string>()).is_absolute())
            (*holder)[name] =
                (base / (*holder)[name].get<std::string>()).lexically_normal().string();
        }
      continue;
    }
    if (!key || key->type != KeyType::kPath || !value.is_string()) continue;
    const std::string text = value.get<std::string>();
    if (is_builtin_source(text) || std::filesystem::path(text).is_absolute()) continue;
    const std::string relative = (base / text).lexically_normal().string();
    // A model named (smollm2-135m-instruct, ORG/NAME) rather than a folder beside the spec
    // stays a name for resolve_models.
    if (key->model_ref && !std::filesystem::is_directory(relative) && is_model_name(text)) continue;
    value = relative;
  }
}

// Every model key's reference to the directory it names (core/model_ref.h), before the
// rules run, so that inherited models (ref.model from actor.model) and comparisons between
// them see directories. One that resolves nowhere stays as written: missing_inputs() reports
// it with the places looked in when files are checked (rlhf run, validate without
// --no-files).
void resolve_models(SpecCheck& v, const SpecSchema& schema) {
  for (const auto& key : schema.keys()) {
    if (!key.model_ref || v.bad_paths.count(key.path)) continue;
    const std::string ref = v.str(key.path);
    const auto found = resolve_model_ref(ref);
    if (!found) continue;
    if (found->path != ref) v.set(key.path, found->path);
    v.models[key.path] = *found;
  }
}

JobSpec::Validated validate(const std::string& text, const std::string& source,
                            const std::vector<std::string>& overrides,
                            const std::filesystem::path& base) {
  const SpecSchema& schema = job_schema();
  SpecCheck v;
  v.resolved = default_spec_json();
  nlohmann::json doc = parse_text(text, v);
  if (!v.problems.empty()) throw SpecError(source, v.problems);
  if (!doc.is_object()) throw SpecError(source, {{"", "expected a JSON object at the top level"}});
  resolve_paths(doc, "", base);
  for (const auto& o : overrides) apply_override(doc, o, v);
  check_keys(doc, "", v);
  resolve_models(v, schema);
  check_cross_fields(v, schema);
  if (!v.problems.empty()) throw SpecError(source, v.problems);
  for (const auto& [key, model] : v.models)
    if (model.found_in != "directory" && model.found_in != "preset")
      v.notes.push_back(model.describe(key));
  return {std::move(v.resolved), std::move(v.warnings), std::move(v.notes), std::move(v.roles),
          std::move(v.models)};
}

}  // namespace

SpecError::SpecError(std::string source, std::vector<SpecProblem> problems)
    : InputError(report(source, problems)),
      source_(std::move(source)),
      problems_(std::move(problems)) {}

JobSpec JobSpec::load(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw SpecError(path, {{"", "cannot read the file (does it exist?)"}});
  std::stringstream buf;
  buf << in.rdbuf();
  return JobSpec(path,
                 validate(buf.str(), path, overrides, std::filesystem::path(path).parent_path()));
}

JobSpec JobSpec::parse(const std::string& text, const std::string& source,
                       const std::vector<std::string>& overrides) {
  return JobSpec(source, validate(text, source, overrides, {}));
}

JobSpec::JobSpec(std::string source, Validated validated)
    : source_(std::move(source)),
      resolved_(std::move(validated.resolved)),
      warnings_(std::move(validated.warnings)),
      notes_(std::move(validated.notes)),
      roles_(std::move(validated.roles)),
      models_(std::move(validated.models)) {}

nlohmann::json JobSpec::minimal_json() const {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& k : spec_keys()) {
    const nlohmann::json& value = at(k.path);
    if (value != k.default_value) out[spec_pointer(k.path)] = value;
  }
  return out;
}

JobKind JobSpec::kind() const {
  std::string k = get_string("kind");
  if (k == "dpo") return JobKind::kDpo;
  if (k == "sft") return JobKind::kSft;
  if (k == "rm") return JobKind::kRm;
  return JobKind::kPpo;
}

std::vector<Role> JobSpec::used_roles() const {
  return roles_.used;
}

bool JobSpec::uses(Role role) const {
  return std::find(roles_.used.begin(), roles_.used.end(), role) != roles_.used.end();
}

bool JobSpec::trains(Role role) const {
  return std::find(roles_.trained.begin(), roles_.trained.end(), role) != roles_.trained.end();
}

const nlohmann::json& JobSpec::at(const std::string& path) const {
  if (!find_key(path)) throw std::logic_error("JobSpec: no key '" + path + "' in the table");
  return resolved_.at(spec_pointer(path));
}

int64_t JobSpec::get_int(const std::string& path) const {
  const nlohmann::json& v = at(path);
  return v.is_number_integer() ? v.get<int64_t>() : static_cast<int64_t>(v.get<double>());
}
double JobSpec::get_float(const std::string& path) const {
  return at(path).get<double>();
}
bool JobSpec::get_bool(const std::string& path) const {
  return at(path).get<bool>();
}
std::string JobSpec::get_string(const std::string& path) const {
  return at(path).get<std::string>();
}
std::vector<double> JobSpec::get_float_list(const std::string& path) const {
  return at(path).get<std::vector<double>>();
}

}  // namespace rlhf

namespace rlhf {

namespace {

// Positions a model was trained for: max_position_embeddings, times the factor of a linear or
// dynamic RoPE scaling (HF keeps the original value in those configs). nullopt when the
// config cannot be read or lacks the key (the model loader reports unreadable configs).
std::optional<int64_t> position_limit(const std::filesystem::path& config_file) {
  std::ifstream in(config_file);
  const auto config = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!config.is_object() || !config.contains("max_position_embeddings") ||
      !config["max_position_embeddings"].is_number_integer())
    return std::nullopt;
  auto limit = config["max_position_embeddings"].get<int64_t>();
  const auto& scaling = config.value("rope_scaling", nlohmann::json());
  if (scaling.is_object() && scaling.value("factor", nlohmann::json()).is_number()) {
    const std::string type = scaling.value("rope_type", scaling.value("type", std::string()));
    if (type == "linear" || type == "dynamic")
      limit = static_cast<int64_t>(static_cast<double>(limit) * scaling["factor"].get<double>());
  }
  return limit;
}

}  // namespace

std::vector<SpecProblem> lengths_beyond_models(const JobSpec& spec) {
  namespace fs = std::filesystem;
  const bool ppo = spec.kind() == JobKind::kPpo;
  // The longest sequence a job builds: prompt + response for PPO, data.max_len otherwise.
  const int64_t longest =
      ppo ? spec.get_int("data.prompt_max_len") + spec.get_int("rollout.max_new_tokens")
          : spec.get_int("data.max_len");
  const std::string what = ppo ? "data.prompt_max_len + rollout.max_new_tokens" : "data.max_len";
  std::vector<SpecProblem> out;
  std::vector<std::string> seen;
  for (Role r : spec.used_roles()) {
    const std::string key = std::string(role_name(r)) + ".model";
    const std::string dir = spec.get_string(key);
    if (dir.empty() || std::find(seen.begin(), seen.end(), dir) != seen.end()) continue;
    seen.push_back(dir);
    const auto limit = position_limit(fs::path(dir) / "config.json");
    if (!limit || longest <= *limit) continue;
    out.push_back({what, std::to_string(longest) + " tokens exceed " + key + " (" + dir +
                             ") max_position_embeddings " + std::to_string(*limit) +
                             "; lower the lengths or use a model trained for longer sequences"});
  }
  return out;
}

namespace {

// True when the last part of `dir` reads like a released model's name: a parameter count in
// billions (8B, 70b, 1.5B) or a model family (Llama, Qwen, Mistral, ...). Test models made
// by init-model (tiny, 100m) are not.
bool looks_like_released_model(const std::string& dir) {
  std::string name = std::filesystem::path(dir).lexically_normal().filename().string();
  if (name.empty()) name = std::filesystem::path(dir).lexically_normal().parent_path().filename();
  std::string lower;
  for (char c : name) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const char* family : {"llama", "qwen", "mistral", "mixtral", "gemma", "phi-", "deepseek",
                             "falcon", "gpt", "olmo", "yi-", "instruct", "chat"})
    if (lower.find(family) != std::string::npos) return true;
  // A size: digits (maybe with a decimal point) then b or m, at a word boundary.
  for (size_t i = 0; i < lower.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(lower[i]))) continue;
    size_t j = i;
    while (j < lower.size() &&
           (std::isdigit(static_cast<unsigned char>(lower[j])) || lower[j] == '.'))
      ++j;
    const bool boundary_before = i == 0 || !std::isalnum(static_cast<unsigned char>(lower[i - 1]));
    const bool unit = j < lower.size() && lower[j] == 'b';
    const bool boundary_after =
        j + 1 >= lower.size() || !std::isalnum(static_cast<unsigned char>(lower[j + 1]));
    if (boundary_before && unit && boundary_after) return true;
    i = j;
  }
  return false;
}

}  // namespace

std::vector<SpecProblem> missing_inputs(const JobSpec& spec) {
  namespace fs = std::filesystem;
  std::vector<SpecProblem> out;
  // One line per missing directory, naming every role that reads it.
  std::vector<std::pair<std::string, std::vector<std::string>>> dirs;
  for (Role r : spec.used_roles()) {
    const std::string dir = spec.get_string(std::string(role_name(r)) + ".model");
    if (dir.empty() || fs::exists(fs::path(dir) / "config.json")) continue;
    auto it = std::find_if(dirs.begin(), dirs.end(), [&](const auto& d) { return d.first == dir; });
    if (it == dirs.end())
      dirs.push_back({dir, {role_name(r)}});
    else
      it->second.push_back(role_name(r));
  }
  for (const auto& [dir, roles] : dirs) {
    bool value_head = roles.front() == "critic" || roles.front() == "reward";
    std::string path = roles.front() + ".model";
    if (roles.size() > 1) path += " (also " + join({roles.begin() + 1, roles.end()}, ", ") + ")";
    if (dir.rfind("preset:", 0) == 0) {  // models::kArchitecturePrefix (core is below models/)
      out.push_back({path, dir + " is an architecture without weights: rlhf plan and rlhf "
                                 "validate --no-files size the job with it; a run needs a model "
                                 "directory"});
      continue;
    }
    // A name (smollm2-135m-instruct, ORG/NAME[@REVISION]) that resolved nowhere: every place
    // looked in.
    std::vector<std::string> looked;
    if (!resolve_model_ref(dir, &looked) && looked.size() > 1) {
      std::string places;
      for (const auto& l : looked) places += (places.empty() ? "" : "; ") + l;
      out.push_back({path, "model \"" + dir + "\" not found (looked in: " + places + ")"});
      continue;
    }
    // A random test model is a useful hint for runs/models/tiny, not for a path that names
    // a real model (/models/Meta-Llama-3-8B-Instruct): that one is to be downloaded.
    const std::string hint =
        looks_like_released_model(dir)
            ? "download the model's Hugging Face directory there (config.json, tokenizer and "
              "*.safetensors), or size the job without weights: --set " +
                  roles.front() + ".model=preset:NAME (docs/memory.md lists them)"
            : std::string("a random test model: rlhf init-model --preset tiny") +
                  (value_head ? " --value-head" : "") + " --out " + dir;
    out.push_back(
        {path, dir + (fs::exists(dir) ? " has no config.json" : " not found") + " (" + hint + ")"});
  }
  for (const auto& problem : lengths_beyond_models(spec)) out.push_back(problem);
  const char* dataset = spec.kind() == JobKind::kPpo ? "data.prompt_dataset" : "data.dataset";
  for (const char* path : {dataset, "data.eval_dataset"}) {
    const std::string file = spec.get_string(path);
    if (file.empty() || file.rfind("synthetic:", 0) == 0 || fs::exists(file)) continue;
    out.push_back({path, file + " not found"});
  }
  return out;
}

}  // namespace rlhf
