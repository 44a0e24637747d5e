// What each role's plan reads from the job spec (RoleMemoryInput): batches and lengths from
// the spec; the model role's dtype, head, sharding, checkpointing, optimizer placement and LoRA
// from the ModelRoleConfig its workers are built from (engine/role_config.h); the phase flags
// from the phase policy (engine/phase_policy.h) the ppo driver also follows.
#include <algorithm>
#include <filesystem>

#include "core/errors.h"
#include "engine/memory_plan.h"
#include "engine/phase_policy.h"
#include "engine/role_config.h"
#include "models/lora.h"

namespace rlhf::engine {

namespace fs = std::filesystem;

namespace {

// LoRA of a trained role: its config's, or with an adapter directory that directory's
// adapter_config.json (its r, targets and dropout win, as in the trainer: actors/
// model_operations.cpp add_adapters). Throws InputError naming the file.
void set_lora_input(const ModelRoleConfig& c, RoleMemoryInput& in) {
  const models::LoraConfig lora =
      c.lora_adapter.empty() ? c.lora : models::read_adapter_config(c.lora_adapter);
  in.lora_rank = lora.rank;
  in.lora_targets = lora.target_modules;
  in.lora_dropout = lora.dropout;
}

int zero_stage_of(const TrainerConfig& t) {
  switch (t.zero_stage) {
    case ZeroStage::kOptimizer:
      return 1;
    case ZeroStage::kGradients:
      return 2;
    case ZeroStage::kParameters:
      return 3;
  }
  return 3;
}

// The phase flags of RoleMemoryInput, as ppo/driver.cpp decides them at start-up.
void set_phase_flags(const JobSpec& spec, Role role, const Placement& placement,
                     RoleMemoryInput& in) {
  in.ppo = spec.kind() == JobKind::kPpo;
  if (!in.ppo) {
    if (in.device_kind == DeviceKind::kCuda && in.group_size > 1) in.nccl_communicators = 1;
    return;
  }
  auto kind_of = [&](Role r) {
    const auto g = placement.group(r);
    return g.empty() ? DeviceKind::kCpu : g.front().device_kind;
  };
  const bool gpus =
      kind_of(Role::kActor) == DeviceKind::kCuda && kind_of(Role::kRollout) == DeviceKind::kCuda;
  const PhaseSettings settings = PhaseSettings::from_spec(spec);
  const PhasePolicy policy = phase_policy(settings, gpus);
  const bool colocated = settings.rollout_colocated_with_actor;
  in.sync_bucket_bytes =
      static_cast<int64_t>(spec.get_float("rollout.sync_bucket_mb") * static_cast<double>(1 << 20));
  in.sync_over_ipc = gpus && colocated;
  const bool sync_over_nccl = gpus && !colocated;
  const bool cuda = in.device_kind == DeviceKind::kCuda;
  if (role == Role::kActor) {
    in.sends_weights = true;
    in.sync_adapters_only = spec.get_string("rollout.lora_sync") == "adapters";
    in.offloads_states_while_generating = policy.actor_offloads_optimizer;
    in.nccl_communicators = (cuda && in.group_size > 1 ? 1 : 0) + (sync_over_nccl ? 1 : 0);
  } else if (role == Role::kRollout) {
    in.sleeps_outside_generate = policy.rollout_sleeps;
    in.generates_while_training = settings.async;
    const int64_t tp = spec.get_int("rollout.tensor_parallel_size");
    in.nccl_communicators = (cuda && tp > 1 ? 1 : 0) + (sync_over_nccl ? 1 : 0);
  } else if (cuda && in.group_size > 1 && role != Role::kJudge &&
             (spec.trains(role) ||
              spec.get_int(std::string(role_name(role)) + ".zero_stage") == 3)) {
    in.nccl_communicators = 1;
  }
}

}  // namespace

RoleMemoryInput role_memory_input(const JobSpec& spec, Role role, const Placement& placement,
                                  const models::ModelConfig& model) {
  // What the role's workers are built from (the LR schedule's length does not matter here).
  const ModelRoleConfig config = ModelRoleConfig::from_spec(spec, role, 1, 1);
  RoleMemoryInput in;
  in.role = config.role;
  in.model = model;
  in.model.head = config.head;
  in.lm_head_log_probs = in.model.head == models::HeadKind::kLanguageModel;
  const auto group = placement.group(role);
  in.group_size = std::max<int>(1, static_cast<int>(group.size()));
  if (!group.empty()) in.device_kind = group.front().device_kind;
  in.compute_bytes = config.dtype == "fp32" ? 4 : 2;
  const bool ppo = spec.kind() == JobKind::kPpo;
  const int64_t prompt = spec.get_int("data.prompt_max_len");
  const int64_t max_len = spec.get_int("data.max_len");
  in.prompt_len = std::min(prompt, max_len);
  in.max_new_tokens = spec.get_int("rollout.max_new_tokens");
  // PPO sequences are a prompt and a response; other jobs read data.max_len tokens.
  in.seq_len = ppo ? std::min(max_len, in.prompt_len + in.max_new_tokens) : max_len;
  in.rollout_micro_batch = spec.get_int("rollout.micro_batch_size");
  in.n_samples = spec.get_int("rollout.n_samples_per_prompt");
  if (spec.at("rollout.kv_cache_memory_gb").is_string()) {  // "auto": plan_memory sizes it
    in.kv_auto = in.device_kind == DeviceKind::kCuda;
  } else {
    in.kv_cache_budget = static_cast<int64_t>(spec.get_float("rollout.kv_cache_memory_gb") *
                                              static_cast<double>(1ll << 30));
  }
  in.gpu_memory_utilization = spec.get_float("rollout.gpu_memory_utilization");
  in.logits_chunk_tokens = config.logits_chunk_tokens;
  set_phase_flags(spec, role, placement, in);
  in.kv_block_size = spec.get_int("rollout.kv_block_size");
  in.max_num_seqs = spec.get_int("rollout.max_num_seqs");
  in.decode_graphs = in.device_kind == DeviceKind::kCuda && !spec.get_bool("rollout.enforce_eager");
  // DPO and RM batches hold chosen and rejected together.
  const int64_t pair = spec.kind() == JobKind::kDpo || spec.kind() == JobKind::kRm ? 2 : 1;
  if (config.trainer) {
    in.work = RoleWork::kTrain;
    in.zero_stage = zero_stage_of(*config.trainer);
    in.adam_offload = config.trainer->optimizer_placement == OptimizerPlacement::kHost;
    in.checkpointing = config.gradient_checkpointing;
    in.expert_parallel = static_cast<int>(config.expert_parallel_size);
    in.micro_batch = spec.get_int("train.micro_batch_size") * pair;
    // Micro batches per optimizer step on each rank, as the job runtime sets the trainer's
    // grad_accum_steps (runtime/job_runtime.cpp init_role).
    in.backward_calls = std::max<int64_t>(
        1, spec.get_int("train.batch_size") /
               (spec.get_int("train.micro_batch_size") * static_cast<int64_t>(in.group_size)));
    set_lora_input(config, in);
    if (ppo) in.infer_micro_batch = in.rollout_micro_batch * in.n_samples;
  } else if (runs_engine(role)) {  // the rollout, or a judge on the rollout's engine settings
    in.work = RoleWork::kGenerate;
    in.micro_batch = in.rollout_micro_batch * in.n_samples;
    in.tensor_parallel =
        role == Role::kRollout ? static_cast<int>(spec.get_int("rollout.tensor_parallel_size")) : 1;
  } else {
    in.work = RoleWork::kInfer;
    in.shard_weights = config.shard_weights;
    // PPO scores experience in micro batches of rollout mb x n (ppo/driver.cpp).
    in.micro_batch =
        ppo ? in.rollout_micro_batch * in.n_samples : spec.get_int("train.micro_batch_size") * pair;
  }
  // A PPO token budget splits every scoring and training forward into parts of at most
  // max(1, budget / length) rows (actors/model_operations.cpp: budget_ranges).
  const int64_t budget = spec.get_int("train.max_tokens_per_micro_batch");
  if (ppo && budget > 0 && in.work != RoleWork::kGenerate) {
    const int64_t rows = std::max<int64_t>(1, budget / in.seq_len);
    // Each micro batch trains in parts of `rows`, one backward() each.
    if (in.work == RoleWork::kTrain) in.backward_calls *= (in.micro_batch + rows - 1) / rows;
    in.micro_batch = std::min(in.micro_batch, rows);
    if (in.infer_micro_batch > 0) in.infer_micro_batch = std::min(in.infer_micro_batch, rows);
  }
  return in;
}

std::map<Role, models::ModelConfig> load_role_models(const JobSpec& spec,
                                                     std::vector<std::string>& missing) {
  std::map<Role, models::ModelConfig> out;
  for (Role role : spec.used_roles()) {
    const std::string ref = spec.get_string(std::string(role_name(role)) + ".model");
    const bool preset = ref.rfind(models::kArchitecturePrefix, 0) == 0;
    const fs::path file = fs::is_regular_file(ref) ? fs::path(ref) : fs::path(ref) / "config.json";
    if (ref.empty() || (!preset && !fs::exists(file))) {
      missing.push_back(std::string(role_name(role)) + ": " +
                        (ref.empty() ? "(no model set)" : file.string()));
      continue;
    }
    out[role] = models::model_config_of(ref);
  }
  return out;
}

}  // namespace rlhf::engine
