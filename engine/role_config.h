// What a worker needs to build one role's model and, for trained roles, its trainer:
// filled by a driver from the job spec (from_spec) and sent to the worker as JSON in the
// role's `init` operation. Lives in engine/ because both sides (drivers in ppo/ and dpo/,
// workers in actors/) sit above it.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "core/spec.h"
#include "engine/trainer_config.h"
#include "models/config.h"
#include "models/log_probs.h"
#include "models/lora_config.h"

namespace rlhf::engine {

struct ModelRoleConfig {
  std::string role;            // "actor", "critic", "reward", "ref", "teacher" (model roles)
  std::string model_dir;       // HF directory
  std::string dtype = "bf16";  // compute dtype: bf16 | fp32
  models::HeadKind head = models::HeadKind::kLanguageModel;
  std::string value_head_prefix = "score";
  bool gradient_checkpointing = true;
  // Trained mixture-of-experts roles: each sparse layer's experts split over groups of this
  // many consecutive ranks (<role>.expert_parallel_size; 1: every rank holds every expert).
  int64_t expert_parallel_size = 1;
  // Tokens per chunk of the LM head's log-probs (train.logits_chunk_tokens; 0: the path
  // before chunking by tokens), in every role with an LM head.
  int64_t logits_chunk_tokens = models::kDefaultLogitsChunkTokens;
  uint64_t seed = 42;
  std::optional<TrainerConfig> trainer;  // set for trained roles only
  // Untrained roles (ref, a PPO job's reward): ZeRO-3 inference, each rank holding 1/N of
  // the weights and gathering one unit at a time (the spec's zero_stage 3).
  bool shard_weights = false;
  // LoRA (trained roles; <role>.lora.* in the spec): lora.rank 0 = off.
  models::LoraConfig lora;
  std::string lora_adapter;         // a PEFT adapter directory to start from ("" = fresh)
  bool lora_export_merged = false;  // export also writes the merged model
  bool uses_lora() const { return lora.rank > 0 || !lora_adapter.empty(); }

  nlohmann::json to_json() const;
  // Every field required (null trainer: untrained). Throws RuntimeError naming `where` and
  // a field that is missing, unknown or of the wrong type, InputError for a bad value.
  static ModelRoleConfig from_json(const nlohmann::json& j,
                                   const std::string& where = "role config");

  // `total_steps`: optimizer steps the LR schedule spans; `grad_accum_steps`: micro batches
  // per optimizer step on each rank.
  static ModelRoleConfig from_spec(const JobSpec& spec, Role role, int64_t total_steps,
                                   int64_t grad_accum_steps);
};

// The config of every model role the spec uses (actor, critic, ref, reward), with the LR
// schedules over `total_steps` and one micro batch per step (a driver sets grad_accum_steps
// once it knows its groups' sizes).
std::map<Role, ModelRoleConfig> model_role_configs(const JobSpec& spec, int64_t total_steps);

// nlohmann's hooks, so a ModelRoleConfig travels inside typed requests (engine/worker_ops.h).
inline void to_json(nlohmann::json& j, const ModelRoleConfig& c) {
  j = c.to_json();
}
inline void from_json(const nlohmann::json& j, ModelRoleConfig& c) {
  c = ModelRoleConfig::from_json(j);
}

}  // namespace rlhf::engine
