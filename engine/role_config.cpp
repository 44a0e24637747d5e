#include "engine/role_config.h"

#include "core/errors.h"
#include "core/json_fields.h"
#include "core/text.h"
#include "models/pretrained.h"

namespace rlhf::engine {

using nlohmann::json;

namespace {

const char* zero_name(ZeroStage s) {
  return s == ZeroStage::kOptimizer ? "1" : s == ZeroStage::kGradients ? "2" : "3";
}

const char* scheduler_name(LrScheduler s) {
  switch (s) {
    case LrScheduler::kConstant:
      return "constant";
    case LrScheduler::kConstantWithWarmup:
      return "constant_with_warmup";
    case LrScheduler::kCosineWithMinLr:
      return "cosine_with_min_lr";
  }
  return "?";
}

LrScheduler parse_scheduler(const std::string& s) {
  if (s == "constant") return LrScheduler::kConstant;
  if (s == "constant_with_warmup") return LrScheduler::kConstantWithWarmup;
  if (s == "cosine_with_min_lr") return LrScheduler::kCosineWithMinLr;
  throw InputError("lr_scheduler: unknown schedule \"" + s + "\"");
}

json trainer_json(const TrainerConfig& t) {
  return {{"zero_stage", zero_name(t.zero_stage)},
          {"lr", t.lr},
          {"beta1", t.beta1},
          {"beta2", t.beta2},
          {"eps", t.eps},
          {"weight_decay", t.weight_decay},
          {"max_norm", t.max_norm},
          {"lr_scheduler", scheduler_name(t.lr_scheduler)},
          {"warmup_ratio", t.warmup_ratio},
          {"min_lr_ratio", t.min_lr_ratio},
          {"total_steps", t.total_steps},
          {"grad_accum_steps", t.grad_accum_steps},
          {"adam_offload", t.optimizer_placement == OptimizerPlacement::kHost}};
}

TrainerConfig trainer_from_json(const json& j, const std::string& where) {
  JsonFields f(j, where);
  TrainerConfig t;
  std::string stage = f.get<std::string>("zero_stage");
  if (stage != "1" && stage != "2" && stage != "3")
    throw InputError("role config: zero_stage must be 1, 2 or 3 for a trained role, found " +
                     stage);
  t.zero_stage = stage == "1"   ? ZeroStage::kOptimizer
                 : stage == "2" ? ZeroStage::kGradients
                                : ZeroStage::kParameters;
  t.lr = f.get<double>("lr");
  t.beta1 = f.get<double>("beta1");
  t.beta2 = f.get<double>("beta2");
  t.eps = f.get<double>("eps");
  t.weight_decay = f.get<double>("weight_decay");
  t.max_norm = f.get<double>("max_norm");
  t.lr_scheduler = parse_scheduler(f.get<std::string>("lr_scheduler"));
  t.warmup_ratio = f.get<double>("warmup_ratio");
  t.min_lr_ratio = f.get<double>("min_lr_ratio");
  t.total_steps = f.get<int64_t>("total_steps");
  t.grad_accum_steps = f.get<int64_t>("grad_accum_steps");
  t.optimizer_placement =
      f.get<bool>("adam_offload") ? OptimizerPlacement::kHost : OptimizerPlacement::kDevice;
  f.finish();
  return t;
}

json lora_json(const ModelRoleConfig& c) {
  return {{"rank", c.lora.rank},
          {"alpha", c.lora.alpha},
          {"dropout", c.lora.dropout},
          {"target_modules", c.lora.target_modules},
          {"init", models::lora_init_name(c.lora.init)},
          {"use_rslora", c.lora.use_rslora},
          {"adapter", c.lora_adapter},
          {"export_merged", c.lora_export_merged}};
}

void lora_from_json(const json& j, const std::string& where, ModelRoleConfig& c) {
  JsonFields f(j, where);
  c.lora.rank = f.get<int64_t>("rank");
  c.lora.alpha = f.get<double>("alpha");
  c.lora.dropout = f.get<double>("dropout");
  c.lora.target_modules = f.get<std::vector<std::string>>("target_modules");
  c.lora.init = models::lora_init_from_name(f.get<std::string>("init"));
  c.lora.use_rslora = f.get<bool>("use_rslora");
  c.lora_adapter = f.get<std::string>("adapter");
  c.lora_export_merged = f.get<bool>("export_merged");
  f.finish();
}

}  // namespace

json ModelRoleConfig::to_json() const {
  json j = {{"role", role},
            {"model_dir", model_dir},
            {"dtype", dtype},
            {"head", head == models::HeadKind::kValue ? "value" : "lm"},
            {"value_head_prefix", value_head_prefix},
            {"gradient_checkpointing", gradient_checkpointing},
            {"expert_parallel_size", expert_parallel_size},
            {"logits_chunk_tokens", logits_chunk_tokens},
            {"seed", seed},
            {"shard_weights", shard_weights}};
  j["trainer"] = trainer ? trainer_json(*trainer) : json();
  j["lora"] = lora_json(*this);
  return j;
}

ModelRoleConfig ModelRoleConfig::from_json(const json& j, const std::string& where) {
  JsonFields f(j, where);
  ModelRoleConfig c;
  c.role = f.get<std::string>("role");
  c.model_dir = f.get<std::string>("model_dir");
  c.dtype = f.get<std::string>("dtype");
  if (c.dtype != "bf16" && c.dtype != "fp16" && c.dtype != "fp32")
    throw InputError("role config: dtype must be bf16, fp16 or fp32, found " + c.dtype);
  std::string head = f.get<std::string>("head");
  if (head != "lm" && head != "value") throw InputError("role config: head must be lm or value");
  c.head = head == "value" ? models::HeadKind::kValue : models::HeadKind::kLanguageModel;
  c.value_head_prefix = f.get<std::string>("value_head_prefix");
  c.gradient_checkpointing = f.get<bool>("gradient_checkpointing");
  c.expert_parallel_size = f.get<int64_t>("expert_parallel_size");
  if (c.expert_parallel_size < 1)
    throw InputError("role config: expert_parallel_size must be >= 1");
  c.logits_chunk_tokens = f.get<int64_t>("logits_chunk_tokens");
  if (c.logits_chunk_tokens < 0) throw InputError("role config: logits_chunk_tokens must be >= 0");
  c.seed = f.get<uint64_t>("seed");
  c.shard_weights = f.get<bool>("shard_weights");
  if (const json& trainer = f.take("trainer"); !trainer.is_null())
    c.trainer = trainer_from_json(trainer, f.nested("trainer"));
  lora_from_json(f.take("lora"), f.nested("lora"), c);
  f.finish();
  return c;
}

std::map<Role, ModelRoleConfig> model_role_configs(const JobSpec& spec, int64_t total_steps) {
  std::map<Role, ModelRoleConfig> out;
  for (Role role : {Role::kActor, Role::kCritic, Role::kRef, Role::kTeacher, Role::kReward})
    if (spec.uses(role)) out.emplace(role, ModelRoleConfig::from_spec(spec, role, total_steps, 1));
  return out;
}

ModelRoleConfig ModelRoleConfig::from_spec(const JobSpec& spec, Role role, int64_t total_steps,
                                           int64_t grad_accum_steps) {
  const std::string r = role_name(role);
  ModelRoleConfig c;
  c.role = r;
  c.model_dir = spec.get_string(r + ".model");
  c.dtype = spec.get_string(r + ".dtype");
  c.head = (role == Role::kCritic || role == Role::kReward) ? models::HeadKind::kValue
                                                            : models::HeadKind::kLanguageModel;
  if (role == Role::kCritic || role == Role::kReward)
    c.value_head_prefix = spec.get_string(r + ".value_head_prefix");
  c.seed = static_cast<uint64_t>(spec.get_int("train.seed"));
  c.logits_chunk_tokens = spec.get_int("train.logits_chunk_tokens");
  if (!spec.trains(role)) {
    c.gradient_checkpointing = false;
    c.shard_weights = (role == Role::kRef || role == Role::kTeacher || role == Role::kReward) &&
                      spec.get_int(r + ".zero_stage") == 3;
    return c;
  }
  c.gradient_checkpointing = spec.get_bool(r + ".gradient_checkpointing");
  c.expert_parallel_size = spec.get_int(r + ".expert_parallel_size");
  c.lora.rank = spec.get_int(r + ".lora.rank");
  c.lora.alpha = spec.get_float(r + ".lora.alpha");
  c.lora.dropout = spec.get_float(r + ".lora.dropout");
  c.lora.target_modules = split_names(spec.get_string(r + ".lora.target_modules"));
  c.lora.init = models::lora_init_from_name(spec.get_string(r + ".lora.init"));
  c.lora.use_rslora = spec.get_bool(r + ".lora.use_rslora");
  c.lora_adapter = spec.get_string(r + ".lora.adapter");
  c.lora_export_merged = spec.get_bool(r + ".lora.export_merged");
  TrainerConfig t;
  int64_t stage = spec.get_int(r + ".zero_stage");
  // ZeRO stage 0 (plain data parallel) runs as stage 1: same numbers, sharded optimizer.
  t.zero_stage = stage <= 1   ? ZeroStage::kOptimizer
                 : stage == 2 ? ZeroStage::kGradients
                              : ZeroStage::kParameters;
  t.compute_dtype = models::dtype_from_name(c.dtype);
  t.lr = spec.get_float(r + ".adam.lr");
  auto betas = spec.get_float_list(r + ".adam.betas");
  t.beta1 = betas[0];
  t.beta2 = betas[1];
  t.eps = spec.get_float(r + ".adam.eps");
  t.weight_decay = spec.get_float(r + ".adam.weight_decay");
  t.max_norm = spec.get_float(r + ".max_norm");
  t.lr_scheduler = parse_scheduler(spec.get_string(r + ".lr_scheduler"));
  t.warmup_ratio = spec.get_float(r + ".lr_warmup_ratio");
  t.total_steps = std::max<int64_t>(1, total_steps);
  t.grad_accum_steps = std::max<int64_t>(1, grad_accum_steps);
  t.optimizer_placement =
      spec.get_bool(r + ".adam_offload") ? OptimizerPlacement::kHost : OptimizerPlacement::kDevice;
  c.trainer = t;
  return c;
}

}  // namespace rlhf::engine
