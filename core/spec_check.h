// One validation pass over a job spec, as the rules of each folder's SpecSection see it: the
// resolved document, the problems found so far, and (for `rules`) the job's roles and group
// sizes. A rule skips keys whose own value was already reported (ok()), so one mistake gives
// one message.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "core/model_ref.h"
#include "core/spec.h"
#include "core/spec_schema.h"

namespace rlhf {

// "rollout.batch_size" -> /rollout/batch_size.
nlohmann::json::json_pointer spec_pointer(const std::string& dotted_path);

class SpecCheck {
 public:
  nlohmann::json resolved;          // every key present; a bad value replaced by its default
  std::set<std::string> bad_paths;  // keys whose own value was wrong (rules skip them)
  std::vector<SpecProblem> problems;
  std::vector<std::string> warnings;
  std::vector<std::string> notes;    // what defaults resolved to (e.g. dtype auto), for the console
  std::set<std::string> user_paths;  // keys the user set (in the file or with --set)
  RoleUse roles;                     // set before the sections' `rules` run
  std::map<std::string, int64_t> group;       // workers per used role, after device placement
  std::map<std::string, ModelSource> models;  // each model key's resolved reference

  void problem(const std::string& path, const std::string& message);
  // True when none of `paths` had a problem of its own.
  bool ok(std::initializer_list<std::string> paths) const;
  const nlohmann::json& at(const std::string& path) const;
  void set(const std::string& path, nlohmann::json value);

  std::string str(const std::string& path) const;
  int64_t integer(const std::string& path) const;
  double real(const std::string& path) const;
  bool flag(const std::string& path) const;
  std::string kind() const { return str("kind"); }
  bool uses(Role role) const;
  bool trains(Role role) const;
};

// Runs core's placement rules and every section's hooks over `v` (after the key checks).
void check_cross_fields(SpecCheck& v, const SpecSchema& schema);

}  // namespace rlhf
