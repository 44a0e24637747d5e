// The table of every job-spec key: dotted path, type, default, allowed range or choices,
// and one line of documentation. The validator, `--set` overrides and docs/job-spec.md all
// come from this one table; nothing else declares a key or a default.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

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
  kSources,    // list of reward-source objects (see reward.sources)
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
  std::vector<std::string> choices;  // kEnum
  size_t list_len = 0;               // kFloatList
  std::string doc;

  // "integer >= 1", "number in (0, 1]", "one of k1, k2, k3" (what the validator expects).
  std::string expectation() const;
  // Checks a JSON value against type and range; returns "" or what is wrong with it.
  std::string check(const nlohmann::json& value) const;
  // Parses a `--set` value ("8", "1e-6", "true", "k3", "[0,1]", "0,1"); throws InputError.
  nlohmann::json parse_override(const std::string& text) const;
};

// Every key, in documentation order.
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
