// The job-spec key table's machinery: a key (dotted path, type, default, allowed range or
// choices, one line of documentation), the builder a component declares its keys with, and
// the schema cli/ composes from every component's section (cli/job_schema.cpp). The
// validator, `--set` overrides and docs/job-spec.md all come from that one table; each key is
// declared once, by the folder that reads it.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/spec.h"

namespace rlhf {

enum class KeyType {
  kInt,
  kFloat,
  kFloatOrAuto,  // a number within [min, max], or the string "auto"
  kBool,
  kString,
  kPath,       // a file or directory; relative paths in a spec file resolve against its directory
  kEnum,       // one of `choices`
  kFloatList,  // fixed length `list_len`
  kIntList,    // any length, each element within [min, max]
  kDevices,    // [0, 1] on the first node, or {"node-name": [0, 1], ...}
  kNodes,      // list of node objects (see cluster.nodes)
  kSources,    // list of source objects (see reward.sources); `path_fields` of each are paths
  kObject,     // a JSON object of free-form options (see env.options)
};
const char* key_type_name(KeyType type);

struct KeySpec {
  std::string path;  // "rollout.n_samples_per_prompt"
  KeyType type = KeyType::kString;
  nlohmann::json default_value;
  std::optional<double> min;  // numeric bounds (inclusive unless *_exclusive)
  std::optional<double> max;
  bool min_exclusive = false;
  std::vector<std::string> choices;      // kEnum
  size_t list_len = 0;                   // kFloatList
  std::vector<std::string> path_fields;  // kSources: fields of an entry that name files
  bool model_ref = false;                // kPath: a model reference, resolved by core/model_ref.h
  std::string doc;

  // "integer >= 1", "number in (0, 1]", "one of k1, k2, k3" (what the validator expects).
  std::string expectation() const;
  // Checks a JSON value against type and range; returns "" or what is wrong with it.
  std::string check(const nlohmann::json& value) const;
  // Parses a `--set` value ("8", "1e-6", "true", "k3", "[0,1]", "0,1"); throws InputError.
  nlohmann::json parse_override(const std::string& text) const;
};

// No upper bound (KeyTable's `hi`).
constexpr double kUnbounded = 1e300;

// Declares keys one call each, so each row reads as a line of documentation.
class KeyTable {
 public:
  KeySpec& add(std::string path, KeyType type, nlohmann::json def, std::string doc);
  void integer(std::string path, int64_t def, double lo, double hi, std::string doc);
  void number(std::string path, double def, double lo, double hi, std::string doc,
              bool lo_exclusive = false);
  void number_or_auto(std::string path, nlohmann::json def, double lo, std::string doc);
  void boolean(std::string path, bool def, std::string doc);
  void string(std::string path, std::string def, std::string doc);
  void file(std::string path, std::string def, std::string doc);
  // A model reference (core/model_ref.h): a directory, preset:NAME, a name scripts/get-model
  // makes, or ORG/NAME[@REVISION] in the Hugging Face Hub cache.
  void model(std::string path, std::string doc);
  void choice(std::string path, std::string def, std::vector<std::string> choices, std::string doc);
  void numbers(std::string path, std::vector<double> def, std::string doc);
  void integers(std::string path, std::vector<int64_t> def, double lo, std::string doc);
  std::vector<KeySpec> take() { return std::move(keys_); }

 private:
  std::vector<KeySpec> keys_;
};

// Where a role's model comes from and where its workers run (<role>.model, .devices,
// .colocate_with, .dtype): declared by the folder that serves the role, checked by core.
void add_role_placement(KeyTable& t, const std::string& role, const std::string& model_doc);

class SpecCheck;  // core/spec_check.h

// One folder's part of the spec: its keys, its rules, and, for the folders that run a job
// kind, which roles that kind uses. Every hook is optional.
struct SpecSection {
  std::string owner;  // the folder that declares these keys ("rewards")
  std::function<void(KeyTable&)> keys;
  // Before model inheritance and device placement (a reward model source sets reward.model).
  std::function<void(SpecCheck&)> resolve;
  // Cross-field rules, after inheritance and placement (SpecCheck::roles and ::group are set).
  std::function<void(SpecCheck&)> rules;
  // The roles of the job kinds this section runs; nullopt for other kinds.
  std::function<std::optional<RoleUse>(const nlohmann::json& resolved)> roles;
  // Why a role the user configured is not used by this job ("" when this section has no
  // reason); the warning quotes every section's reason.
  std::function<std::string(const nlohmann::json& resolved, Role role)> why_unused;
};

// Core's own keys: kind, name and cluster.* (its rules run in check_cross_fields).
SpecSection core_spec_section();

// The table composed from sections, in documentation order.
class SpecSchema {
 public:
  explicit SpecSchema(std::vector<SpecSection> sections);
  const std::vector<SpecSection>& sections() const { return sections_; }
  const std::vector<KeySpec>& keys() const { return keys_; }
  // nullptr when `path` is not a key.
  const KeySpec* find(const std::string& path) const;
  const std::vector<std::string>& paths() const { return paths_; }
  // The roles of a resolved spec's job kind; throws std::logic_error when no section runs it.
  RoleUse roles(const nlohmann::json& resolved) const;
  std::string why_unused(const nlohmann::json& resolved, Role role) const;

 private:
  std::vector<SpecSection> sections_;
  std::vector<KeySpec> keys_;
  std::vector<std::string> paths_;
  std::map<std::string, size_t> index_;  // path -> position in keys_
};

// The schema of this process: cli/ composes it (cli/job_schema.h) and installs it once at
// start-up (main, and each test binary that reads specs). job_schema() throws
// std::logic_error before that.
void install_job_schema(std::shared_ptr<const SpecSchema> schema);
const SpecSchema& job_schema();

// The installed schema's keys, in documentation order.
const std::vector<KeySpec>& spec_keys();
// nullptr when `path` is not a key.
const KeySpec* find_key(const std::string& path);
// All key paths (for "did you mean" hints).
const std::vector<std::string>& spec_key_paths();
// The known key or section closest to an unknown `path` ("" when nothing is close): keys of
// the same section first, preferring the longest common prefix (rollout.n_samples ->
// rollout.n_samples_per_prompt), then a sibling section, then any key; job.name -> name.
std::string closest_key(const std::string& path);
// True for a kPath value that names no file (empty, or a built-in source such as
// synthetic:letters or preset:llama-3-8b), so it is never resolved against a directory.
bool is_builtin_source(const std::string& value);
// The fields a node object of `cluster.nodes` may have.
const std::vector<std::string>& node_fields();

// docs/job-spec.md, generated from the table (`rlhf spec --markdown`).
std::string spec_markdown();
// The default spec as nested JSON (`rlhf spec --defaults`).
nlohmann::json default_spec_json();

}  // namespace rlhf
