// The operations of a worker that holds one role's model (actor, critic, reward, ref, teacher;
// their requests and replies: engine/, ppo/, rollout/ and dpo/worker_ops.h): `init` (load the
// model and, for trained roles, join the role's collective group and build the sharded trainer),
// `log_probs` (with a teacher's top-k when asked), `values`, `score`, `train_actor` (PPO policy
// loss) and `train_critic` (value loss) (in train_operations.cpp), `save`, `load`,
// `export_hf`, `memory`, `push_weights` (the actor's side of the weight sync to the rollout group,
// in buckets) and `offload_optimizer` / `restore_optimizer` (the trainer's optimizer state to host
// memory while a colocated rollout generates, and back). Generation lives with the rollout role.
//
// Alignment (as OpenRLHF): for sequences [B, T] whose last A positions are the response,
// action t is token T-A+t; its log-prob and the critic's value both come from position
// T-A-1+t (the state before the action).
#pragma once

#include <map>
#include <memory>
#include <string>

#include "actors/operation_registry.h"
#include "engine/role_config.h"
#include "engine/sharded_inference.h"
#include "engine/trainer.h"
#include "models/causal_lm.h"
#include "transport/collective_group.h"

namespace rlhf {

// What one model worker holds between operations.
struct ModelRole {
  engine::ModelRoleConfig config;
  std::shared_ptr<models::CausalLM> model;
  std::unique_ptr<transport::CollectiveGroup> group;  // trained and sharded roles
  // Expert parallelism (<role>.expert_parallel_size > 1): the ranks splitting the experts
  // (the model holds it too) and those holding the same experts.
  std::shared_ptr<transport::CollectiveGroup> ep_group;
  std::unique_ptr<transport::CollectiveGroup> edp_group;
  std::unique_ptr<engine::Trainer> trainer;           // trained roles only
  std::unique_ptr<engine::ShardedInference> sharded;  // ZeRO-3 ref/reward only
  std::string config_json;                            // the model's config.json text (for export)
  torch::Device device = torch::kCPU;                 // the worker's: cuda:0 on a GPU node
  std::unique_ptr<transport::CollectiveGroup> sync_group;  // actor rank 0 -> rollout ranks
  std::string sync_store;                                  // where sync_group met
  int64_t weight_version = 0;                              // pushes done so far
  // Per operation name, the largest tracked-tensor peak over its calls (the trainer's or
  // the sharded inference's MemoryTracker, from the operation's start; an unsharded
  // untrained model: its weights). CPU and GPU alike; metrics.jsonl's tensor_phases.
  std::map<std::string, int64_t> tensor_phases;

  // Throws RuntimeError when `init` has not run yet.
  models::CausalLM& checked_model(const std::string& op) const;
};

// Registers the model operations on a shared ModelRole (created empty; `init` fills it),
// each wrapped to record its tracked-tensor peak in ModelRole::tensor_phases.
// Returns the role state so other operations of the worker (weight sync) can reach it.
std::shared_ptr<ModelRole> add_model_operations(OperationRegistry& registry);

}  // namespace rlhf
