// The memory planner: bytes each role holds on each device, computed from the job spec and
// each role's config.json before anything starts, and the smallest spec change that makes an
// over-budget device fit. It models what the engine allocates (engine/sharded_unit.cpp,
// engine/trainer.cpp) term by term; it does not measure anything (the workers report
// measured peaks into metrics.jsonl, and `rlhf plan --check` compares the two).
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/placement.h"
#include "core/spec.h"
#include "models/config.h"
#include "transport/collective_group.h"

namespace rlhf::engine {

// What a role's workers do with their model, which decides the terms it has.
enum class RoleWork {
  kTrain,     // sharded trainer: model states, gradients, training activations (actor, critic, rm)
  kInfer,     // forward only: weights and one micro batch of inference (ref, reward)
  kGenerate,  // rollout: weights, KV cache for one micro batch x n samples
};

// The settings of one role that its memory depends on, read from the spec (from_spec) or
// set by hand in tests.
struct RoleMemoryInput {
  std::string role;           // "actor"
  models::ModelConfig model;  // sizes (head kind and tie_word_embeddings included)
  RoleWork work = RoleWork::kInfer;
  DeviceKind device_kind = DeviceKind::kCpu;
  int group_size = 1;          // ranks sharing the ZeRO shards
  int64_t compute_bytes = 2;   // bf16: 2, fp32: 4
  int zero_stage = 2;          // 1..3 (0 runs as 1, as the trainer does)
  bool adam_offload = false;   // master + moments in host memory (only moves bytes on cuda)
  bool checkpointing = true;   // per-layer recompute in backward
  int64_t micro_batch = 1;     // sequences per forward (train.micro_batch_size, or rollout mb x n)
  int64_t backward_calls = 1;  // trained roles: backward() calls per optimizer step on a rank
  int64_t infer_micro_batch =
      0;                // trained roles: sequences per scoring forward (PPO: rollout mb x n)
  int64_t seq_len = 1;  // tokens per sequence
  int64_t logprob_chunk = 256;  // train.logits_chunk_tokens 0: positions per chunk of the head
  int64_t logits_chunk_tokens = 1024;  // train.logits_chunk_tokens (0: the position chunks)
  bool lm_head_log_probs = true;       // the role computes log-probs through its LM head
  // Trained roles with <role>.lora.rank > 0 (or an adapter directory's r): the base is frozen
  // in the compute dtype, whole on every rank at stage 1/2 and sharded at 3 (gathered with
  // its unit); only the adapters (and a value head) have trained states.
  int64_t lora_rank = 0;
  std::vector<std::string> lora_targets;  // <role>.lora.target_modules ("all-linear", "q_proj")
  double lora_dropout = 0.0;              // > 0: each adapter saves its dropped input
  bool shard_weights = false;  // kInfer: ZeRO-3 inference over the group (ref/reward stage 3)
  // Trained roles: <role>.expert_parallel_size (each sparse layer's experts split over this
  // many ranks, sharded over the group_size / it that hold the same ones).
  int expert_parallel = 1;
  // Generation only.
  int64_t rollout_micro_batch = 1;  // prompts per KV cache
  int64_t n_samples = 1;            // samples per prompt (the cache holds mb x n rows)
  int64_t prompt_len = 1;           // P
  int64_t max_new_tokens = 1;       // R
  int64_t kv_cache_budget = 0;      // rollout.kv_cache_memory_gb in bytes (0: unbounded)
  bool kv_auto = false;  // kv_cache_memory_gb "auto" on cuda: plan_memory sets kv_cache_budget
  double gpu_memory_utilization = 0.9;  // rollout.gpu_memory_utilization (kv_auto)
  int64_t kv_block_size = 16;           // rollout.kv_block_size (the spec's default)
  int64_t max_num_seqs = 0;             // rollout.max_num_seqs (0: micro batch x n)
  // Paged decode steps replayed as CUDA graphs (on cuda, unless rollout.enforce_eager): the
  // graphs' one shared [max_num_seqs, V] logits buffer (rollout/decode_graph.h) lives as long
  // as the engine.
  bool decode_graphs = false;
  // rollout.tensor_parallel_size: the ranks of one engine, each holding heads / t, KV heads / t
  // and intermediate / t of every layer and V / t rows of the embedding and head
  // (models/tensor_parallel.h); every rank gathers the whole [rows, V] logits to sample.
  int tensor_parallel = 1;
  // The phases of a step (PPO: generate, score, train, sync, save; other jobs: score, train,
  // save; all: load) and what each role holds in them.
  bool ppo = false;
  bool sends_weights = false;       // PPO's actor: gathers and sends its weights in the sync phase
  int64_t sync_bucket_bytes = 0;    // rollout.sync_bucket_mb
  bool sync_adapters_only = false;  // a LoRA actor with rollout.lora_sync adapters
  bool sync_over_ipc = false;       // rollout colocated with the actor on a GPU: CUDA IPC bucket
  // Colocation's sleep mode where it applies (ppo/driver.cpp: rollout colocated with the
  // actor on a GPU, algo.max_staleness 0): the rollout's weights leave the device outside the
  // generate and sync phases (rollout.offload_while_training); the actor's master, moments
  // and gradient shards leave it in the generate and sync phases
  // (actor.offload_optimizer_while_generating).
  bool sleeps_outside_generate = false;
  bool offloads_states_while_generating = false;
  bool generates_while_training = false;  // rollout with algo.max_staleness > 0
  int nccl_communicators =
      0;  // NCCL communicators a rank belongs to (cuda: its group's, the sync's)
};

// Bytes one rank of a role holds, by term, each at its own peak. The transient terms do
// not all peak together: a training step's activation phase (activations, log-probs, the
// .grad in flight, ZeRO-3 gathers) comes before its reduction phase (every .grad not yet
// reduced, collective buffers), and inference phases between. step_peak is the largest
// phase; device_total() = overhead + persistent states + max(load, step_peak). engine_peak
// is what the trainer's MemoryTracker counts (the measured peak_tensor_bytes).
struct MemoryTerms {
  int64_t weights = 0;      // compute-dtype parameters kept on the device
  int64_t master = 0;       // FP32 master weights (this rank's shard)
  int64_t optimizer = 0;    // AdamW exp_avg + exp_avg_sq (this rank's shard)
  int64_t grads = 0;        // FP32 gradient accumulator (shard at stage 2/3, full at stage 1)
  int64_t gathered = 0;     // stage-3 parameters all-gathered at the engine's peak
  int64_t buffers = 0;      // collective buffers at the engine's peak (flat grads, gathers)
  int64_t param_grads = 0;  // compute-dtype .grad autograd holds before the engine reduces it
  int64_t activations = 0;  // forward/backward (or inference) peak for one micro batch
  int64_t log_probs = 0;    // chunked log-prob buffers of the LM head
  int64_t kv_cache = 0;     // rollout KV cache (with its prefill copy)
  int64_t overhead = 0;     // fixed per process: runtime, kernels, allocator slack
  int64_t load = 0;         // loading: the one slice read from the checkpoint in flight beside
                            // what the rank keeps (its shard, or the whole compute-dtype model)
  int64_t host = 0;         // offloaded to host memory (not on the device)
  int64_t step_peak = 0;    // the largest phase sum of the transient terms (see above)
  int64_t engine_peak =
      0;  // MemoryTracker's peak: model states + gathered + buffers (+ host states)
  int64_t cuda_workspace = 0;  // cuda: cuBLAS workspaces (part of overhead, in the allocator)
  int64_t nccl = 0;            // NCCL communicators' buffers (outside the allocator; persistent)
  int64_t sync = 0;            // the weight sync's transient: bucket(s), a ZeRO-3 unit gathered
  int64_t sync_outside = 0;  // of `sync`, a CUDA IPC bucket (raw cudaMalloc, outside the allocator)
  int64_t train_peak = 0;    // trained roles: the larger of the activation and reduction phases
  int64_t score_peak = 0;    // the scoring forward's transient (0: the role does not score)
  int64_t save_peak = 0;     // trained roles: export_hf's FP32 unit gathered whole (+ on cpu
                             // the one parameter converted to write it)
  int64_t kv_sequences = 0;  // rollout: full-length sequences the KV cache holds
  // Bytes this rank holds in each phase of a step ("load", "generate", "score", "train",
  // "sync", "save"): what stays (overhead, states, weights, less what sleep mode moves out)
  // plus the phase's transient. device_total() is the largest.
  std::map<std::string, int64_t> phases;
  // Of each phase, the bytes the role's MemoryTracker counts (trainer: model states, host
  // ones included, + gathered units + collective buffers; ZeRO-3 ref/reward: shards +
  // gathered units; other ref/reward: the weights): what the worker measures per phase as
  // tensor_phases. Activations, log-prob chunks, KV cache and overhead are not tracked.
  // Empty for the rollout (no tracker).
  std::map<std::string, int64_t> engine_phases;
  // Operations whose tracked bytes are below their phase's: in the save phase a checkpoint
  // ("save") writes the shards as they are, and only "export_hf" gathers. `rlhf plan --check`
  // pairs a measured operation with its own figure (the metrics records come before each
  // step's save and the run's final export, so a run shows checkpoints only).
  std::map<std::string, int64_t> engine_operations;

  // cuda: the caching allocator's planned peak (device_total less the CUDA context, which
  // the allocator does not see); 0 on cpu. Measured as cuda_peak_allocated_bytes.
  int64_t cuda_allocated() const;

  int64_t device_total() const;
  std::string peak_phase() const;  // the phase that sets device_total()
  // The largest device term: {name, bytes}.
  std::pair<std::string, int64_t> dominant() const;
  nlohmann::json to_json() const;
};

// Trainable elements of each ZeRO unit, in the trainer's order: embeddings, each decoder
// layer, the head (final norm + lm_head or value head; no lm_head when tied), as
// models::CausalLM::param_units lays them out.
std::vector<int64_t> unit_numels(const models::ModelConfig& config);

// The largest single parameter of each unit of unit_numels (the one tensor export_hf
// converts at a time): embeddings V x H, a layer's largest projection, the head's lm_head
// (or its norm when tied, its value head).
std::vector<int64_t> largest_param_numels(const models::ModelConfig& config);

// Trainable elements of each unit of unit_numels under LoRA rank r on `targets`
// (models/lora.cpp): per adapted linear [out, in], A [r, in] + B [out, r] = r (in + out);
// "all-linear" adapts q/k/v/o/gate/up/down. The embeddings hold none; the head holds a
// value head's H (it stays trained), nothing for an LM head.
std::vector<int64_t> lora_unit_numels(const models::ModelConfig& config, int64_t r,
                                      const std::vector<std::string>& targets);

// The smallest KV budget a rollout rank can generate with: one full-length sequence's blocks.
int64_t one_sequence_kv_bytes(const RoleMemoryInput& in);

// One rank's terms for one role.
MemoryTerms plan_role(const RoleMemoryInput& in);

// Per role (from the spec and the role's model config).
struct RolePlan {
  RoleMemoryInput input;
  MemoryTerms terms;
  // Trained roles: the collectives one rank runs per optimizer step (engine_collectives),
  // and the bytes it sends (and receives) for them on its group's backend.
  transport::CollectiveTraffic collectives;
  int64_t collective_wire_bytes = 0;
  // PPO's actor: the weights it broadcasts to the rollout group per PPO step (full fine-tune;
  // 0 for a LoRA actor, whose sync depends on rollout.lora_sync).
  int64_t sync_bytes = 0;
};

// One rank's collectives per optimizer step for a trained role (empty for others).
transport::CollectiveTraffic plan_collectives(const RoleMemoryInput& in);

struct DevicePlan {
  std::string node;
  int device_id = 0;
  int64_t capacity = 0;            // bytes (cluster.nodes[].memory_gb)
  std::vector<std::string> roles;  // "actor[0]", several when colocated (a shared budget)
  // Per phase, the sum over the device's roles of what each holds in it; total is the
  // largest, in the phase peak_phase.
  std::map<std::string, int64_t> phases;
  std::string peak_phase;
  int64_t total = 0;
  bool fits() const { return total <= capacity; }
};

// A spec change (one --set override) and what it gives.
struct PlanSuggestion {
  std::string change;             // "actor.gradient_checkpointing=true", or several "K=V --set K=V"
  int64_t new_total = 0;          // the over-budget device's total after the change
  bool fits = false;              // every device fits after the change
  bool costs_throughput = false;  // it fits by doing less per step or more work per step
};

// The phases of a job's step, in order ("load" first).
std::vector<std::string> step_phases(bool ppo);

struct MemoryPlan {
  std::vector<RolePlan> roles;
  std::vector<DevicePlan> devices;
  std::vector<PlanSuggestion> suggestions;  // only when a device is over budget; fitting ones first
  // rollout.kv_cache_memory_gb auto left less than one sequence on a rollout device (the
  // plan then counts the one-sequence pool; a run refuses to start).
  std::string kv_auto_error;
  bool fits() const;
  const RolePlan* role(const std::string& name) const;  // nullptr when not used
  nlohmann::json to_json() const;
};

// The role's settings from a validated spec and its model config.
RoleMemoryInput role_memory_input(const JobSpec& spec, Role role, const Placement& placement,
                                  const models::ModelConfig& model);

// Reads every used role's <model>/config.json. Roles whose file is missing are left out and
// named in `missing` ("actor: runs/models/tiny/config.json").
std::map<Role, models::ModelConfig> load_role_models(const JobSpec& spec,
                                                     std::vector<std::string>& missing);

// The plan for a spec whose role models are all given. With `suggest`, over-budget devices
// get the spec changes that make them fit, each found by planning the changed spec again.
MemoryPlan plan_memory(const JobSpec& spec, const std::map<Role, models::ModelConfig>& models,
                       bool suggest = true);

// rollout.kv_cache_memory_gb as the rollout workers get it: the number, 0 for "auto" on cpu
// nodes, and for "auto" on cuda nodes the pool plan_memory sizes (what the generate phase
// leaves under rollout.gpu_memory_utilization). Throws InputError when that is less than one
// full-length sequence, or a role's config.json is missing.
double kv_cache_gb_for_run(const JobSpec& spec);

}  // namespace rlhf::engine
