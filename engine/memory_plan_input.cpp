// What each role's plan reads from the job spec (RoleMemoryInput): batches, lengths, dtypes,
// sharding, LoRA, and the phase policy (engine/phase_policy.h) the ppo driver also follows.
#include <algorithm>
#include <filesystem>

#include "core/errors.h"
#include "core/text.h"
#include "engine/memory_plan.h"
#include "engine/phase_policy.h"
#include "models/lora.h"

namespace rlhf::engine {

namespace fs = std::filesystem;

namespace {

// LoRA of a trained role: <role>.lora.*, or with <role>.lora.adapter the adapter directory's
// adapter_config.json (its r, targets and dropout win, as in the trainer: actors/
// model_operations.cpp add_adapters). Throws InputError naming the file.
void set_lora_input(const JobSpec& spec, const std::string& r, RoleMemoryInput& in) {
  const std::string adapter = spec.get_string(r + ".lora.adapter");
  if (!adapter.empty()) {
    const models::LoraConfig c = models::read_adapter_config(adapter);
    in.lora_rank = c.rank;
    in.lora_targets = c.target_modules;
    in.lora_dropout = c.dropout;
    return;
  }
  in.lora_rank = spec.get_int(r + ".lora.rank");
  in.lora_targets = split_names(spec.get_string(r + ".lora.target_modules"));
  in.lora_dropout = spec.get_float(r + ".lora.dropout");
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
    in.offloads_states_while_generating = policy.actor_offloads_optimizer;
    in.nccl_communicators = (cuda && in.group_size > 1 ? 1 : 0) + (sync_over_nccl ? 1 : 0);
  } else if (role == Role::kRollout) {
    in.sleeps_outside_generate = policy.rollout_sleeps;
    in.generates_while_training = settings.async;
    const int64_t tp = spec.get_int("rollout.tensor_parallel_size");
    in.nccl_communicators = (cuda && tp > 1 ? 1 : 0) + (sync_over_nccl ? 1 : 0);
  } else if (cuda && in.group_size > 1 &&
             (spec.trains(role) ||
              spec.get_int(std::string(role_name(role)) + ".zero_stage") == 3)) {
    in.nccl_communicators = 1;
  }
}

}  // namespace

RoleMemoryInput role_memory_input(const JobSpec& spec, Role role, const Placement& placement,
                                  const models::ModelConfig& model) {
  const std::string r = role_name(role);
  RoleMemoryInput in;
  in.role = r;
  in.model = model;
  if (role == Role::kCritic || role == Role::kReward) in.model.head = models::HeadKind::kValue;
  in.lm_head_log_probs = in.model.head == models::HeadKind::kLanguageModel;
  const auto group = placement.group(role);
  in.group_size = std::max<int>(1, static_cast<int>(group.size()));
  if (!group.empty()) in.device_kind = group.front().device_kind;
  in.compute_bytes = spec.get_string(r + ".dtype") == "fp32" ? 4 : 2;
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
  in.logits_chunk_tokens = spec.get_int("train.logits_chunk_tokens");
  set_phase_flags(spec, role, placement, in);
  in.kv_block_size = spec.get_int("rollout.kv_block_size");
  in.max_num_seqs = spec.get_int("rollout.max_num_seqs");
  in.decode_graphs = in.device_kind == DeviceKind::kCuda && !spec.get_bool("rollout.enforce_eager");
  // DPO and RM batches hold chosen and rejected together.
  const int64_t pair = spec.kind() == JobKind::kDpo || spec.kind() == JobKind::kRm ? 2 : 1;
  if (spec.trains(role)) {
    in.work = RoleWork::kTrain;
    in.zero_stage = static_cast<int>(std::max<int64_t>(1, spec.get_int(r + ".zero_stage")));
    in.adam_offload = spec.get_bool(r + ".adam_offload");
    in.checkpointing = spec.get_bool(r + ".gradient_checkpointing");
    in.micro_batch = spec.get_int("train.micro_batch_size") * pair;
    set_lora_input(spec, r, in);
    if (ppo) in.infer_micro_batch = in.rollout_micro_batch * in.n_samples;
  } else if (role == Role::kRollout) {
    in.work = RoleWork::kGenerate;
    in.micro_batch = in.rollout_micro_batch * in.n_samples;
    in.tensor_parallel = static_cast<int>(spec.get_int("rollout.tensor_parallel_size"));
  } else {
    in.work = RoleWork::kInfer;
    in.shard_weights =
        (role == Role::kRef || role == Role::kReward) && spec.get_int(r + ".zero_stage") == 3;
    // PPO scores experience in micro batches of rollout mb x n (ppo/driver.cpp).
    in.micro_batch =
        ppo ? in.rollout_micro_batch * in.n_samples : spec.get_int("train.micro_batch_size") * pair;
  }
  // A PPO token budget splits every scoring and training forward into parts of at most
  // max(1, budget / length) rows (actors/model_operations.cpp: budget_ranges).
  const int64_t budget = spec.get_int("train.max_tokens_per_micro_batch");
  if (ppo && budget > 0 && in.work != RoleWork::kGenerate) {
    const int64_t rows = std::max<int64_t>(1, budget / in.seq_len);
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
