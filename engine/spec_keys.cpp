#include "engine/spec_keys.h"

#include <algorithm>
#include <filesystem>

#include "core/spec_check.h"
#include "core/text.h"

namespace rlhf::engine {

using nlohmann::json;

namespace {

// LoRA adapters on a trained role (PEFT's LoraConfig names and defaults, alpha as OpenRLHF).
void add_lora_keys(KeyTable& t, const std::string& role) {
  const std::string p = role + ".lora.";
  t.integer(p + "rank", 0, 0, 65536,
            role == "actor"
                ? std::string("LoRA rank r (0: off, the whole model is trained). Above 0 the "
                              "actor's base weights stay frozen in the compute dtype (no FP32 "
                              "master, gradients or AdamW state; whole on every rank at "
                              "zero_stage 1/2, sharded 1/N at 3) and only the adapters are "
                              "trained, sharded by actor.zero_stage; checkpoints hold only them "
                              "and the export is a PEFT adapter directory. In ppo and dpo-family "
                              "jobs the actor with its adapters off is the reference (no ref "
                              "workers) unless ref.model names another model.")
                : "LoRA rank r (0: off, the whole model is trained). Above 0 the " + role +
                      "'s base weights stay frozen in the compute dtype (sharded 1/N at "
                      "zero_stage 3) and only the adapters "
                      "and the value head are trained (FP32 master, gradients and AdamW state, "
                      "sharded by " +
                      role +
                      ".zero_stage); checkpoints hold only them and the export is a PEFT "
                      "adapter directory with the head saved as PEFT saves a sequence "
                      "classifier's (modules_to_save, task_type SEQ_CLS). Trained roles only: "
                      "the critic of a gae ppo job, the reward model of an rm job.");
  t.number(p + "alpha", 16.0, 0, kUnbounded,
           "LoRA alpha: the adapter's output is scaled by alpha / r.", true);
  t.number(p + "dropout", 0.0, 0, 0.99, "Dropout on each adapter's input while training.");
  t.string(p + "target_modules", "all-linear",
           "Linear maps that get adapters, comma-separated PEFT names: q_proj, k_proj, v_proj, "
           "o_proj, gate_proj, up_proj, down_proj, or all-linear (all seven).");
  t.choice(p + "init", "default", {"default", "gaussian"},
           "Adapter init (B is zero either way): default, PEFT's Kaiming-uniform A; gaussian, "
           "A ~ N(0, 1/r^2) as PEFT's init_lora_weights=\"gaussian\".");
  t.boolean(p + "use_rslora", false, "rsLoRA: scale by alpha / sqrt(r) instead of alpha / r.");
  t.file(p + "adapter", "",
         "Start from this PEFT adapter directory (adapter_config.json + "
         "adapter_model.safetensors; its r, alpha and targets win over the keys above).");
  t.boolean(p + "export_merged", false,
            "Also export the merged model (W + scale B A) as a Hugging Face directory, "
            "export/" +
                role + "-merged, next to the adapter directory export/" + role + ".");
}

// Keys of a role that trains (actor, critic; reward in `rm` jobs).
void add_trainer_keys(KeyTable& t, const std::string& role, double lr,
                      const std::string& zero_note = "") {
  t.integer(role + ".zero_stage", 2, 0, 3,
            "ZeRO stage: 0 replicated, 1 optimizer state sharded, 2 + gradients, 3 + parameters." +
                zero_note);
  t.boolean(role + ".gradient_checkpointing", true,
            "Recompute each decoder layer in backward instead of keeping its activations.");
  t.integer(role + ".expert_parallel_size", 1, 1, kUnbounded,
            "Mixture-of-experts models: the " + role +
                "'s workers split each sparse layer's experts over groups of this many "
                "consecutive ranks (Megatron's expert_model_parallel_size); tokens reach their "
                "experts by all-to-all, the experts' ZeRO shards span the ranks holding the same "
                "experts, the rest is sharded as before. Must divide the worker count and the "
                "expert count; not with LoRA.");
  t.number(role + ".adam.lr", lr, 0, 1, "AdamW learning rate.", true);
  t.numbers(role + ".adam.betas", {0.9, 0.95}, "AdamW (beta1, beta2).");
  t.number(role + ".adam.eps", 1e-8, 0, 1, "AdamW epsilon.", true);
  t.number(role + ".adam.weight_decay", 0.0, 0, 10, "AdamW decoupled weight decay.");
  t.boolean(role + ".adam_offload", false, "Keep AdamW moments and master weights in host memory.");
  t.choice(role + ".lr_scheduler", "cosine_with_min_lr", {"constant", "cosine_with_min_lr"},
           "LR schedule after warmup (cosine decays to 0.1 x lr, as OpenRLHF).");
  t.number(role + ".lr_warmup_ratio", 0.03, 0, 1, "Fraction of steps of linear LR warmup.");
  t.number(role + ".max_norm", 1.0, 0, kUnbounded,
           "Global gradient-norm clipping across shards (0: off).");
  add_lora_keys(t, role);
}

void add_keys(KeyTable& t) {
  t.integer("train.batch_size", 128, 1, kUnbounded, "Samples per optimizer step (global).");
  t.integer("train.micro_batch_size", 4, 1, kUnbounded,
            "Samples per forward/backward on one device.");
  t.integer("train.max_tokens_per_micro_batch", 0, 0, kUnbounded,
            "Token budget of one forward (rows x padded length), as OpenRLHF's/veRL's dynamic "
            "batch: PPO scoring and training split each micro batch into forwards of at most "
            "this many tokens; a training micro batch's parts are weighted so its loss and "
            "gradient are unchanged (0: whole micro batches).");
  t.boolean("train.packing_samples", false,
            "With a token budget, PPO training packs consecutive sequences end to end into one "
            "row of at most the budget (no padding computed), as OpenRLHF's packing_samples.");
  t.integer("train.logits_chunk_tokens", 1024, 0, kUnbounded,
            "Tokens per chunk of the LM head when log-probs (and the entropy) are computed, in "
            "every role and job kind: the [tokens, vocabulary] logits never exist beyond one "
            "chunk, in forward or backward (each chunk's logits are recomputed there), with "
            "the same values and gradients (Liger's / Cut Cross-Entropy's chunked loss). 0: "
            "the path before this key, chunks of 256 positions over all rows of a micro batch.");
  t.integer("train.max_epochs", 1, 1, 1000, "Passes over each batch of experience (ppo) or data.");
  t.integer("train.num_episodes", 1, 1, 100000, "Passes over the prompt dataset (ppo).");
  t.integer("train.max_steps", 0, 0, kUnbounded,
            "Stop after this many steps (0: when data runs out).");
  t.integer("train.seed", 42, 0, kUnbounded, "Seed for data order, sampling and initialisation.");

  add_role_placement(t, "actor", "Policy model: a Hugging Face model directory.");
  add_trainer_keys(t, "actor", 1e-6);
  add_role_placement(t, "critic", "Value model directory (default: reward.model).");
  add_trainer_keys(t, "critic", 9e-6);
  t.string("critic.value_head_prefix", "score", "Name prefix of the value head's weights.");
  add_role_placement(t, "reward",
                     "Reward model directory with a value head (the reward source when no "
                     "other reward key is set; else only critic.model's default).");
  add_trainer_keys(t, "reward", 9e-6,
                   " In PPO jobs (reward not trained) 3 shards the reward model's weights over its "
                   "workers, one layer gathered at a time; other values keep it whole.");
  t.string("reward.value_head_prefix", "score", "Name prefix of the value head's weights.");
  add_role_placement(t, "ref", "Reference model directory (default: actor.model).");
  t.integer("ref.zero_stage", 0, 0, 3,
            "0: full weights on every ref worker (more workers serve more micro batches at "
            "once); 3: weights sharded over the ref workers, each layer all-gathered just "
            "before use (as DeepSpeed's stage-3 reference in OpenRLHF; 1 and 2 are refused).");
  add_role_placement(t, "teacher",
                     "Teacher model directory (ppo with algo.distill.coef or .gkd.coef > 0): "
                     "scores the actor's sampled tokens for on-policy distillation (GKD: its top-k "
                     "next tokens too). Any architecture or size, "
                     "but the actor's tokenizer (checked before any worker starts).");
  t.integer("teacher.zero_stage", 0, 0, 3,
            "0: full weights on every teacher worker; 3: weights sharded over the teacher "
            "workers, each layer all-gathered just before use (as ref.zero_stage).");
  add_role_placement(
      t, "judge",
      "Generative judge model directory (ppo with a reward.sources judge without "
      "a url): served by rlhf's paged engine on the judge group (one engine per "
      "device, the rollout section's KV cache settings), its replies parsed into "
      "the judge's scores. Its own tokenizer and chat template (plain text without one).");

  t.file("ckpt.path", "", "Checkpoint directory (default: the run directory's ckpt/).");
  t.integer("ckpt.save_steps", -1, -1, kUnbounded, "Save every N steps (-1: only at the end).");
  t.integer("ckpt.max_num", 3, 1, 1000, "Keep the newest N checkpoints.");
  t.boolean("ckpt.save_only_model", false, "Skip optimizer state in checkpoints.");
  t.boolean("ckpt.export_hf", true,
            "Export trained models as Hugging Face directories at the end.");
}

// train.batch_size splits into micro batches over every trained role's workers.
void check_batches(SpecCheck& v) {
  const int64_t train_bs = v.integer("train.batch_size");
  const int64_t micro = v.integer("train.micro_batch_size");
  if (!v.ok({"train.batch_size", "train.micro_batch_size"})) return;
  if (micro > train_bs)
    v.problem("train.micro_batch_size", "is " + std::to_string(micro) +
                                            ", larger than train.batch_size (" +
                                            std::to_string(train_bs) + ")");
  for (Role r : v.roles.used) {
    const std::string role = role_name(r);
    if (!v.trains(r) || !v.group.count(role) || v.group.at(role) == 0) continue;
    const int64_t per_step = micro * v.group.at(role);
    if (train_bs % per_step != 0)
      v.problem("train.batch_size",
                std::to_string(train_bs) + " is not divisible by train.micro_batch_size (" +
                    std::to_string(micro) + ") x " + role + " group size (" +
                    std::to_string(v.group.at(role)) + ") = " + std::to_string(per_step));
  }
}

// <role>.lora.*: LoRA only where the role is trained (the actor; a ppo critic; the reward
// model of an rm job: value-head roles train their head beside the adapters); target names
// PEFT knows; an adapter directory that holds PEFT's config.
void check_lora(SpecCheck& v) {
  const std::vector<std::string> known = {"q_proj",    "k_proj",  "v_proj",    "o_proj",
                                          "gate_proj", "up_proj", "down_proj", "all-linear"};
  for (Role r : {Role::kActor, Role::kCritic, Role::kReward}) {
    const std::string role = role_name(r), p = role + ".lora.";
    if (!v.ok({p + "rank", p + "adapter", p + "target_modules"})) continue;
    const bool on = v.integer(p + "rank") > 0 || !v.str(p + "adapter").empty();
    if (!on) continue;
    const std::string key = v.integer(p + "rank") > 0 ? p + "rank" : p + "adapter";
    if (!v.trains(r)) {
      v.problem(key,
                "the " + role + " is not trained in a " + v.kind() + " job: no adapters to train");
      continue;
    }
    for (const std::string& name : split_names(v.str(p + "target_modules")))
      if (std::find(known.begin(), known.end(), name) == known.end())
        v.problem(p + "target_modules", "\"" + name +
                                            "\" is not a linear map of a Llama-family decoder "
                                            "(expected q_proj, k_proj, v_proj, o_proj, gate_proj, "
                                            "up_proj, down_proj or all-linear)");
    const std::string adapter = v.str(p + "adapter");
    if (!adapter.empty() &&
        !std::filesystem::exists(std::filesystem::path(adapter) / "adapter_config.json"))
      v.problem(p + "adapter", adapter +
                                   " holds no adapter_config.json (expected a PEFT "
                                   "LoRA adapter directory)");
  }
}

// role.expert_parallel_size e > 1: a trained role, e dividing its workers, no LoRA (the
// expert count is the model's: cli/preflight.cpp checks it with the config).
void check_expert_parallel(SpecCheck& v) {
  for (Role r : {Role::kActor, Role::kCritic, Role::kReward}) {
    const std::string role = role_name(r), key = role + ".expert_parallel_size";
    if (!v.ok({key}) || v.integer(key) == 1) continue;
    const int64_t e = v.integer(key);
    if (!v.trains(r)) {
      v.problem(key, "the " + role + " is not trained in a " + v.kind() +
                         " job: expert parallelism splits a trained role's experts");
      continue;
    }
    if (v.ok({role + ".lora.rank", role + ".lora.adapter"}) &&
        (v.integer(role + ".lora.rank") > 0 || !v.str(role + ".lora.adapter").empty()))
      v.problem(key, "not with " + role +
                         ".lora: adapters on split experts are not supported; set 1 or drop "
                         "the adapters");
    if (v.group.count(role) && v.ok({role + ".devices", "cluster.nodes"})) {
      const int64_t workers = v.group.at(role);
      if (workers % e != 0)
        v.problem(key, std::to_string(e) + " does not divide the " + role + "'s " +
                           std::to_string(workers) + " worker" + (workers == 1 ? "" : "s") + " (" +
                           role + ".devices): list a multiple of " + std::to_string(e) +
                           " devices");
    }
  }
}

void check_engine(SpecCheck& v) {
  check_batches(v);
  check_expert_parallel(v);
  for (const std::string role : {"ref", "teacher"}) {
    const std::string key = role + ".zero_stage";
    if (v.ok({key}) && v.integer(key) != 0 && v.integer(key) != 3)
      v.problem(key, "expected 0 (full weights on every " + role +
                         " worker) or 3 (weights sharded over the " + role +
                         " workers, one layer gathered at a time): stages 1 and 2 shard optimizer "
                         "state and gradients, which an untrained " +
                         role + " has none of; found " + v.at(key).dump());
  }
  if (v.ok({"ckpt.save_steps"}) && v.integer("ckpt.save_steps") == 0)
    v.problem("ckpt.save_steps",
              "expected -1 (only at the end) or a number of steps >= 1, found 0");
  check_lora(v);
}

std::string why_unused(const json& r, Role role) {
  const std::string kind = r.at("kind").get<std::string>();
  const bool lora = r.at(spec_pointer("actor.lora.rank")).get<int64_t>() > 0 ||
                    !r.at(spec_pointer("actor.lora.adapter")).get<std::string>().empty();
  if (role == Role::kRef && (kind == "ppo" || kind == "dpo") && lora)
    return "the LoRA actor with its adapters off is the reference";
  return "";
}

}  // namespace

bool actor_is_reference(const json& r) {
  auto s = [&](const char* path) { return r.at(spec_pointer(path)).get<std::string>(); };
  const bool lora =
      r.at(spec_pointer("actor.lora.rank")).get<int64_t>() > 0 || !s("actor.lora.adapter").empty();
  return lora && s("ref.model") == s("actor.model");
}

SpecSection spec_section() {
  SpecSection s;
  s.owner = "engine";
  s.keys = add_keys;
  s.rules = check_engine;
  s.why_unused = why_unused;
  return s;
}

}  // namespace rlhf::engine
