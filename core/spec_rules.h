// Internal to core/: the state of one validation pass, and the cross-field rules that run
// after every key was type-checked and defaults were filled. Not for other folders.
#pragma once

#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "core/spec.h"

namespace rlhf::detail {

struct Validation {
  nlohmann::json resolved;          // every key present; a bad value replaced by its default
  std::set<std::string> bad_paths;  // keys whose own value was wrong (rules skip them)
  std::vector<SpecProblem> problems;
  std::vector<std::string> warnings;
  std::vector<std::string> notes;    // what defaults resolved to (e.g. dtype auto), for the console
  std::set<std::string> user_paths;  // keys the user set (in the file or with --set)

  void problem(const std::string& path, const std::string& message);
  // True when none of `paths` had a problem of its own.
  bool ok(std::initializer_list<std::string> paths) const;
  const nlohmann::json& at(const std::string& path) const;
  void set(const std::string& path, nlohmann::json value);
};

nlohmann::json::json_pointer pointer(const std::string& dotted_path);

// Roles whose workers this resolved spec starts.
std::vector<Role> used_roles(const nlohmann::json& resolved);
// True when a LoRA actor on the reference's model serves as its own reference (adapters off).
bool actor_is_reference(const nlohmann::json& resolved);
bool trains(const nlohmann::json& resolved, Role role);

// The reward sources of a resolved ppo spec as one list, shorthands (reward.rule,
// reward.python, reward.remote_url, reward.model) expanded: each {"kind": rule|python|remote|
// model, "name", "weight", and "rule"/"python"/"remote_url"/"model" (+ "pattern")}. Field
// problems go to `problems` as (path, message) when given.
nlohmann::json reward_source_list(const nlohmann::json& resolved,
                                  std::vector<SpecProblem>* problems = nullptr);

// Resolves model inheritance and automatic devices, then checks every cross-field rule.
void check_cross_fields(Validation& v);

}  // namespace rlhf::detail
