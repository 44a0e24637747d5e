// The job spec: parse JSON, apply `--set` overrides, fill defaults, validate every key and
// cross-field rule against the key table (core/spec_schema.h) that cli/ installs. Reports every
// problem at once. Components read their settings from a validated JobSpec into their own config
// structs; they never keep the whole spec.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/errors.h"
#include "core/model_ref.h"

namespace rlhf {

enum class JobKind { kPpo, kDpo, kSft, kRm };
const char* job_kind_name(JobKind kind);

// The model roles, each on its own device group. The teacher scores the actor's samples for
// on-policy distillation (algo.distill.coef), like the reference; the judge is a generative
// judge reward source's engine (rollout operations, the paged engine), when a reward.sources
// judge has no url.
enum class Role { kActor, kCritic, kReward, kRef, kTeacher, kJudge, kRollout };
constexpr Role kAllRoles[] = {Role::kActor,   Role::kCritic, Role::kReward, Role::kRef,
                              Role::kTeacher, Role::kJudge,  Role::kRollout};
const char* role_name(Role role);
// The roles whose workers run rlhf's paged engine (the rollout operations: load_model,
// generate) rather than a model role's (init, log_probs, train_*, memory).
inline bool runs_engine(Role role) {
  return role == Role::kRollout || role == Role::kJudge;
}
// Throws InputError for an unknown name.
Role parse_role(const std::string& name);

// The roles of one job: which start workers, and which of them train (optimizer state).
struct RoleUse {
  std::vector<Role> used;     // in start-up order (automatic devices are given in this order)
  std::vector<Role> trained;  // a subset of `used`
};

// One problem found in a spec: the JSON path and what was found vs expected.
struct SpecProblem {
  std::string path;     // "rollout.batch_size", or "" for the whole document
  std::string message;  // "expected an integer >= 1, found -3"
};

// Thrown with every problem found; what() is the full multi-line report.
class SpecError : public InputError {
 public:
  SpecError(std::string source, std::vector<SpecProblem> problems);
  const std::vector<SpecProblem>& problems() const { return problems_; }
  const std::string& source() const { return source_; }

 private:
  std::string source_;
  std::vector<SpecProblem> problems_;
};

class JobSpec {
 public:
  // Reads, overrides (each "dotted.path=value"), fills defaults and validates. Relative
  // paths in the file (keys of type path) resolve against the file's directory; relative
  // paths given as overrides stay relative to the current directory.
  // Throws SpecError listing every problem (exit code 2).
  static JobSpec load(const std::string& path, const std::vector<std::string>& overrides = {});
  // Same for text already in memory; `source` names it in messages.
  static JobSpec parse(const std::string& text, const std::string& source,
                       const std::vector<std::string>& overrides = {});

  // The resolved document: every key of the table present, defaults filled.
  const nlohmann::json& json() const { return resolved_; }
  // Only the keys that differ from their defaults, nested (what `rlhf validate --print` shows).
  nlohmann::json minimal_json() const;
  const std::string& source() const { return source_; }
  // Non-fatal notes (e.g. a configured role that this job kind does not use).
  const std::vector<std::string>& warnings() const { return warnings_; }
  // What automatic defaults resolved to (e.g. "compute dtype (auto): actor fp32, ..."), for
  // the console at start-up.
  const std::vector<std::string>& notes() const { return notes_; }
  // Where each set model key's reference was found ("actor.model" -> its directory, and the
  // Hub revision): what plan.json and a run's first lines record.
  const std::map<std::string, ModelSource>& models() const { return models_; }
  JobKind kind() const;
  // Roles whose workers this job starts (depends on kind, estimator, reward source, loss),
  // as the section that runs the job's kind answered (SpecSection::roles).
  std::vector<Role> used_roles() const;
  bool uses(Role role) const;
  // Trained roles (need optimizer state): actor/critic for ppo, actor for dpo/sft, reward for rm.
  bool trains(Role role) const;

  // Typed access by dotted path; throws std::logic_error for a path not in the table.
  int64_t get_int(const std::string& path) const;
  double get_float(const std::string& path) const;
  bool get_bool(const std::string& path) const;
  std::string get_string(const std::string& path) const;
  std::vector<double> get_float_list(const std::string& path) const;
  const nlohmann::json& at(const std::string& path) const;

  // The outcome of validation (spec.cpp): the resolved document and its warnings.
  struct Validated {
    nlohmann::json resolved;
    std::vector<std::string> warnings;
    std::vector<std::string> notes;
    RoleUse roles;
    std::map<std::string, ModelSource> models;
  };

 private:
  JobSpec(std::string source, Validated validated);

  std::string source_;
  nlohmann::json resolved_;
  std::vector<std::string> warnings_;
  std::vector<std::string> notes_;
  RoleUse roles_;
  std::map<std::string, ModelSource> models_;
};

}  // namespace rlhf

namespace rlhf {

// Inputs a job reads that do not exist on this machine: model directories (without a
// config.json) and dataset files (synthetic:NAME is built in). `rlhf validate` and `rlhf run`
// fail on them; `rlhf validate --no-files` skips them (a spec meant for another machine).
// Also includes lengths_beyond_models().
std::vector<SpecProblem> missing_inputs(const JobSpec& spec);

// Sequence lengths (data.prompt_max_len + rollout.max_new_tokens for PPO, data.max_len for
// the offline kinds) longer than a role model's config.json max_position_embeddings (times a
// linear/dynamic RoPE scaling factor).
std::vector<SpecProblem> lengths_beyond_models(const JobSpec& spec);

}  // namespace rlhf
