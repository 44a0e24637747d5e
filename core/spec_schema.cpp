// The key table and the per-key type/range checks. Cross-field rules live in spec.cpp.
#include "core/spec_schema.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>

#include "core/errors.h"
#include "core/text.h"

namespace rlhf {

using nlohmann::json;

namespace {

constexpr double kInf = 1e300;

// Builds the table with one call per key, so each row reads as a line of documentation.
class TableBuilder {
 public:
  KeySpec& add(std::string path, KeyType type, json def, std::string doc) {
    KeySpec k;
    k.path = std::move(path);
    k.type = type;
    k.default_value = std::move(def);
    k.doc = std::move(doc);
    keys_.push_back(std::move(k));
    return keys_.back();
  }
  void integer(std::string path, int64_t def, double lo, double hi, std::string doc) {
    auto& k = add(std::move(path), KeyType::kInt, def, std::move(doc));
    k.min = lo;
    if (hi < kInf) k.max = hi;
  }
  void number(std::string path, double def, double lo, double hi, std::string doc,
              bool lo_exclusive = false) {
    auto& k = add(std::move(path), KeyType::kFloat, def, std::move(doc));
    k.min = lo;
    k.min_exclusive = lo_exclusive;
    if (hi < kInf) k.max = hi;
  }
  void number_or_auto(std::string path, json def, double lo, std::string doc) {
    auto& k = add(std::move(path), KeyType::kFloatOrAuto, std::move(def), std::move(doc));
    k.min = lo;
  }
  void boolean(std::string path, bool def, std::string doc) {
    add(std::move(path), KeyType::kBool, def, std::move(doc));
  }
  void string(std::string path, std::string def, std::string doc) {
    add(std::move(path), KeyType::kString, std::move(def), std::move(doc));
  }
  void file(std::string path, std::string def, std::string doc) {
    add(std::move(path), KeyType::kPath, std::move(def), std::move(doc));
  }
  void choice(std::string path, std::string def, std::vector<std::string> choices,
              std::string doc) {
    auto& k = add(std::move(path), KeyType::kEnum, std::move(def), std::move(doc));
    k.choices = std::move(choices);
  }
  void numbers(std::string path, std::vector<double> def, std::string doc) {
    auto& k = add(std::move(path), KeyType::kFloatList, def, std::move(doc));
    k.list_len = def.size();
  }
  void integers(std::string path, std::vector<int64_t> def, double lo, std::string doc) {
    auto& k = add(std::move(path), KeyType::kIntList, def, std::move(doc));
    k.min = lo;
  }
  std::vector<KeySpec> take() { return std::move(keys_); }

 private:
  std::vector<KeySpec> keys_;
};

const std::vector<std::string> kRoleChoices = {"", "actor", "critic", "reward", "ref", "rollout"};

// Keys every role has: where its model comes from and where its workers run.
void add_role_placement(TableBuilder& t, const std::string& role, const std::string& model_doc) {
  t.file(role + ".model", "", model_doc);
  t.add(role + ".devices", KeyType::kDevices, json::array(),
        "Devices of the " + role +
            " group: [0, 1] on the first node, or {\"node\": [0, 1], ...}; one worker per "
            "device. Empty: one free device is chosen (or the colocated role's devices).");
  t.choice(role + ".colocate_with", "", kRoleChoices,
           "Share the devices of this role (only when asked: roles are disjoint otherwise).");
  t.choice(role + ".dtype", "auto", {"auto", "bf16", "fp32"},
           "Compute dtype of the " + role +
               " model (master weights stay FP32 when trained). auto: bf16 on GPUs and on CPUs "
               "with AMX-BF16 units, fp32 on other CPUs, where BF16 is slower than FP32 (emulated "
               "without BF16 units; about 0.6x FP32 with AVX512-BF16 alone).");
}

// LoRA adapters on a trained role (PEFT's LoraConfig names and defaults, alpha as OpenRLHF).
void add_lora_keys(TableBuilder& t, const std::string& role) {
  const std::string p = role + ".lora.";
  t.integer(p + "rank", 0, 0, 65536,
            role == "actor"
                ? std::string("LoRA rank r (0: off, the whole model is trained). Above 0 the "
                              "actor's base weights stay frozen in the compute dtype (no FP32 "
                              "master, gradients or AdamW state) and only the adapters are "
                              "trained, sharded by actor.zero_stage; checkpoints hold only them "
                              "and the export is a PEFT adapter directory. In ppo and dpo-family "
                              "jobs the actor with its adapters off is the reference (no ref "
                              "workers) unless ref.model names another model.")
                : "LoRA rank r (0: off, the whole model is trained). Above 0 the " + role +
                      "'s base weights stay frozen in the compute dtype and only the adapters "
                      "and the value head are trained (FP32 master, gradients and AdamW state, "
                      "sharded by " +
                      role +
                      ".zero_stage); checkpoints hold only them and the export is a PEFT "
                      "adapter directory with the head saved as PEFT saves a sequence "
                      "classifier's (modules_to_save, task_type SEQ_CLS). Trained roles only: "
                      "the critic of a gae ppo job, the reward model of an rm job.");
  t.number(p + "alpha", 16.0, 0, kInf, "LoRA alpha: the adapter's output is scaled by alpha / r.",
           true);
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
void add_trainer_keys(TableBuilder& t, const std::string& role, double lr,
                      const std::string& zero_note = "") {
  t.integer(role + ".zero_stage", 2, 0, 3,
            "ZeRO stage: 0 replicated, 1 optimizer state sharded, 2 + gradients, 3 + parameters." +
                zero_note);
  t.boolean(role + ".gradient_checkpointing", true,
            "Recompute each decoder layer in backward instead of keeping its activations.");
  t.number(role + ".adam.lr", lr, 0, 1, "AdamW learning rate.", true);
  t.numbers(role + ".adam.betas", {0.9, 0.95}, "AdamW (beta1, beta2).");
  t.number(role + ".adam.eps", 1e-8, 0, 1, "AdamW epsilon.", true);
  t.number(role + ".adam.weight_decay", 0.0, 0, 10, "AdamW decoupled weight decay.");
  t.boolean(role + ".adam_offload", false, "Keep AdamW moments and master weights in host memory.");
  t.choice(role + ".lr_scheduler", "cosine_with_min_lr", {"constant", "cosine_with_min_lr"},
           "LR schedule after warmup (cosine decays to 0.1 x lr, as OpenRLHF).");
  t.number(role + ".lr_warmup_ratio", 0.03, 0, 1, "Fraction of steps of linear LR warmup.");
  t.number(role + ".max_norm", 1.0, 0, kInf,
           "Global gradient-norm clipping across shards (0: off).");
  add_lora_keys(t, role);
}

std::vector<KeySpec> build_table() {
  TableBuilder t;
  t.choice("kind", "ppo", {"ppo", "dpo", "sft", "rm"},
           "Job kind: ppo (PPO family), dpo (DPO family), sft, rm (reward-model training).");
  t.string("name", "rlhf", "Run name; the run directory is logger.run_dir/name.");

  // Cluster and scheduler.
  t.add("cluster.nodes", KeyType::kNodes,
        json::array({{{"name", "local"},
                      {"host", "127.0.0.1"},
                      {"kind", "cpu"},
                      {"devices", 8},
                      {"memory_gb", 16}}}),
        "Nodes: [{\"name\", \"host\", \"kind\": cpu|cuda, \"devices\": count, \"memory_gb\": "
        "per device}]. On cpu, devices are logical slots.");
  t.string("cluster.interface", "127.0.0.1",
           "Address the scheduler binds to (loopback unless a job spans nodes).");
  t.string("cluster.port_range", "",
           "Ports of the job's endpoints, \"LOW-HIGH\": the worker endpoint takes the first "
           "free one, the rendezvous store (it admits only workers that prove the job token) the "
           "next. \"\": any free port.");
  t.choice("cluster.launcher", "local", {"local", "manual", "slurm"},
           "Who starts the workers: local (rlhf run, on this host), manual (anyone, with `rlhf "
           "worker --connect`; see docs/multinode.md), slurm (srun steps inside an allocation).");
  t.number("cluster.join_timeout_s", 300.0, 1, 86400,
           "manual and slurm: seconds rlhf run waits for every worker to join before it stops, "
           "naming the ones that never came.");
  t.boolean("cluster.curve", false,
            "Encrypt the scheduler's worker sockets with ZeroMQ CURVE (needs libzmq with "
            "libsodium); the job token still decides who joins.");
  t.integer("cluster.threads_per_worker", 1, 1, 1024,
            "Torch intra-op threads per worker process (OMP_NUM_THREADS).");
  t.string("cluster.cuda_alloc_conf", "expandable_segments:True",
           "PYTORCH_CUDA_ALLOC_CONF of workers on cuda nodes (the CUDA caching allocator's "
           "settings; expandable segments avoid fragmentation OOMs). \"\" leaves it unset.");
  t.number("scheduler.heartbeat_interval_s", 1.0, 0, 60, "Seconds between heartbeats.", true);
  t.number("scheduler.worker_timeout_s", 5.0, 0, 3600,
           "A worker silent this long is declared dead and the job stops (time the driver "
           "itself did not run, a stalled machine, is not counted).",
           true);
  t.integer("scheduler.max_inflight", 2, 1, 64, "Requests in flight per worker (back-pressure).");
  t.number("scheduler.request_timeout_s", 1800.0, 0, 86400,
           "Seconds one operation may take before the job fails.", true);

  // Data.
  t.file("data.prompt_dataset", "",
         "Prompt dataset for ppo: a JSONL or Parquet file, or synthetic:NAME for a built-in one "
         "(synthetic:letters, synthetic:arith, synthetic:calc).");
  t.file("data.dataset", "",
         "Training dataset for dpo, sft and rm: a JSONL file, or synthetic:NAME.");
  t.file("data.eval_dataset", "",
         "Held-out dataset (a file or synthetic:NAME), evaluated before training, every "
         "eval.steps and at the end (optional).");
  t.string("data.input_key", "input",
           "JSON key of the prompt in prompt datasets (dots reach into nested objects: "
           "extra_info.question).");
  t.choice("data.label_from", "field", {"field", "gsm8k"},
           "How the label is read from data.label_key's value: field (as it is), gsm8k (the "
           "number after \"####\" in a GSM8K answer, e.g. data.label_key answer).");
  t.string("data.label_key", "",
           "JSON key of a label passed to rule and remote rewards; for algo.dpo.loss kto, of "
           "the boolean desirable flag (empty: \"label\").");
  t.string("data.prompt_key", "prompt", "JSON key of the prompt in preference and SFT data.");
  t.string("data.chosen_key", "chosen", "JSON key of the preferred response.");
  t.string("data.rejected_key", "rejected", "JSON key of the dispreferred response.");
  t.string("data.output_key", "output", "JSON key of the target response in SFT data.");
  t.boolean("data.multiturn", false,
            "SFT on whole conversations (OpenRLHF's --multiturn): data.prompt_key holds a list "
            "of {role, content} messages (system, user, assistant, tool) and the loss covers "
            "the assistant turns and their end-of-turn tokens, the other turns being context, "
            "rendered as a multi-turn rollout renders them. Needs data.apply_chat_template "
            "(chatml or llama3).");
  t.string("data.margin_key", "",
           "JSON key of a per-pair reward margin for rm: -log sigmoid(r_c - r_r - margin) (empty: "
           "none).");
  t.string("data.input_template", "", "Prompt template with {} for the prompt text.");
  t.boolean("data.apply_chat_template", false, "Format prompts with the model's chat template.");
  t.choice("data.chat_template", "auto", {"auto", "chatml", "llama3", "llama2", "mistral"},
           "Chat template family; auto detects it from tokenizer_config.json.");
  t.integer("data.prompt_max_len", 1024, 1, kInf, "Prompts are truncated to this many tokens.");
  t.integer("data.max_len", 2048, 2, kInf, "Maximum total sequence length (prompt + response).");
  t.integer("data.max_samples", 0, 0, kInf, "Use at most this many dataset rows (0: all).");
  t.choice("data.bad_lines", "fatal", {"fatal", "skip"},
           "A malformed dataset line stops the job (fatal) or is skipped and counted (skip).");
  t.boolean("data.packing", false, "Pack several SFT samples into one sequence.");

  // Rollout (generation).
  t.integer("rollout.batch_size", 1024, 1, kInf, "Prompts per PPO step (rollout_batch_size).");
  t.number_or_auto(
      "rollout.kv_cache_memory_gb", "auto", 0,
      "KV cache budget per rollout worker in GiB (0: unbounded, sized for max_num_seqs "
      "sequences at full length). auto: on cuda nodes what the device has left in the "
      "generate phase after every other term the plan counts there (weights, the roles "
      "colocated with the rollout, activations, logits, the CUDA context), minus the headroom "
      "rollout.gpu_memory_utilization leaves (vLLM's meaning); `rlhf plan` shows the size "
      "and how many full-length sequences it holds; on cpu nodes auto is 0. The paged pool's size "
      "(never more than max_num_seqs full-length sequences): sequences join as others finish "
      "and are preempted and recomputed when blocks run out; outputs do not depend on it.");
  t.number("rollout.gpu_memory_utilization", 0.9, 0, 1,
           "With rollout.kv_cache_memory_gb auto: the share of each rollout GPU's memory "
           "(cluster.nodes[].memory_gb) the plan may fill in the generate phase, all roles "
           "on the device counted (vLLM's gpu_memory_utilization); the rest is headroom for "
           "the allocator's fragmentation and what no term counts.",
           true);
  t.integer("rollout.kv_block_size", 16, 1, 4096,
            "Tokens per KV cache block (vLLM's block_size): a sequence holds only the blocks "
            "it fills, a prompt's samples share its blocks, and new prompts join the decode "
            "batch as others finish.");
  t.integer("rollout.max_num_seqs", 0, 0, kInf,
            "Sequences decoding at once with a paged KV cache (vLLM's max_num_seqs); 0: "
            "rollout.micro_batch_size x rollout.n_samples_per_prompt.");
  t.boolean("rollout.enforce_eager", false,
            "Run paged decode steps eagerly at their own shapes (vLLM's enforce_eager). By "
            "default a GPU rollout pads each decode step to a bucketed shape and replays it as "
            "a CUDA graph captured on first use (a small model's decode step is bound by "
            "kernel launches, not by the GPU). No effect on CPU nodes, which always run "
            "eagerly.");
  t.boolean("rollout.gpu_kernels", true,
            "On GPU nodes, generate with the FlashInfer kernels compiled into rlhf (`rlhf "
            "version` names them) where they have an instance for the model: paged decode "
            "attention reading the KV blocks in place, one-kernel RMSNorm. false: torch's "
            "operators (gather + SDPA), the reference path. No effect on CPU nodes.");
  t.integer("rollout.micro_batch_size", 8, 1, kInf,
            "Prompts per generate call on one rollout engine (one worker, or the "
            "rollout.tensor_parallel_size workers of a tensor-parallel engine).");
  t.integer("rollout.tensor_parallel_size", 1, 1, kInf,
            "Workers per rollout engine (vLLM's tensor_parallel_size): each layer is split "
            "over this many GPUs (column- and row-parallel attention and MLP, "
            "vocabulary-parallel embedding and head), so each holds about 1/t of the weights "
            "and KV cache. Rollout workers t*e .. t*e+t-1 form engine e; each micro batch goes "
            "to every worker of one engine. The rollout's worker count must be a multiple, "
            "t must divide the model's heads, KV heads, intermediate size and vocabulary, and "
            "on cuda nodes an engine's workers must be on one node. With t > 1 the weight sync "
            "goes over NCCL or Gloo (never CUDA IPC), each rank receiving only its slices.");
  t.integer("rollout.n_samples_per_prompt", 1, 1, 4096, "Responses sampled per prompt.");
  t.integer("rollout.max_new_tokens", 1024, 1, kInf,
            "Maximum response length in tokens. A multi-turn trajectory's budget (veRL's "
            "response_length): its model and environment tokens together.");
  t.integer("rollout.max_turns", 1, 1, 1000,
            "Model turns per trajectory (veRL's multi_turn.max_assistant_turns). With an "
            "environment (env.*), a turn ends at a stop token (EOS, rollout.stop_token_ids and "
            "the template's end of turn, <|im_end|> or <|eot_id|>), the environment answers, its "
            "answer is "
            "appended as the template's tool or user turn over the same KV cache (chatml or "
            "llama3 templates) and the model goes on, up to "
            "this many turns and rollout.max_new_tokens tokens. Environment tokens are outside "
            "the action mask: no loss, KL or entropy on them. 1: one turn (an environment then "
            "only scores it).");
  t.number("rollout.temperature", 1.0, 0, 100, "Sampling temperature (0: greedy).");
  t.number("rollout.top_p", 1.0, 0, 1, "Nucleus sampling mass.", true);
  t.integer("rollout.top_k", -1, -1, kInf, "Sample among the k most likely tokens (-1: off).");
  t.integers("rollout.stop_token_ids", {}, 0,
             "Extra token ids that end a response (EOS always does).");
  t.integer("rollout.max_refill_batches", 0, 0, 1000,
            "With algo.dynamic_sampling: up to this many extra batches of rollout.batch_size "
            "prompts are generated per step to replace the dropped groups (0: train on the "
            "kept groups only).");

  // Training loop.
  t.integer("train.batch_size", 128, 1, kInf, "Samples per optimizer step (global).");
  t.integer("train.micro_batch_size", 4, 1, kInf, "Samples per forward/backward on one device.");
  t.integer("train.max_tokens_per_micro_batch", 0, 0, kInf,
            "Token budget of one forward (rows x padded length), as OpenRLHF's/veRL's dynamic "
            "batch: PPO scoring and training split each micro batch into forwards of at most "
            "this many tokens; a training micro batch's parts are weighted so its loss and "
            "gradient are unchanged (0: whole micro batches).");
  t.boolean("train.packing_samples", false,
            "With a token budget, PPO training packs consecutive sequences end to end into one "
            "row of at most the budget (no padding computed), as OpenRLHF's packing_samples.");
  t.integer("train.logits_chunk_tokens", 1024, 0, kInf,
            "Tokens per chunk of the LM head when log-probs (and the entropy) are computed, in "
            "every role and job kind: the [tokens, vocabulary] logits never exist beyond one "
            "chunk, in forward or backward (each chunk's logits are recomputed there), with "
            "the same values and gradients (Liger's / Cut Cross-Entropy's chunked loss). 0: "
            "the path before this key, chunks of 256 positions over all rows of a micro batch.");
  t.integer("train.max_epochs", 1, 1, 1000, "Passes over each batch of experience (ppo) or data.");
  t.integer("train.num_episodes", 1, 1, 100000, "Passes over the prompt dataset (ppo).");
  t.integer("train.max_steps", 0, 0, kInf, "Stop after this many steps (0: when data runs out).");
  t.integer("train.seed", 42, 0, kInf, "Seed for data order, sampling and initialisation.");

  // Algorithm.
  t.choice("algo.advantage.estimator", "gae",
           {"gae", "reinforce", "rloo", "reinforce_baseline", "group_norm", "grpo", "dr_grpo"},
           "Advantage estimator; grpo is an alias of group_norm.");
  t.number("algo.advantage.gamma", 1.0, 0, 1, "Discount factor.");
  t.number("algo.advantage.lambd", 0.95, 0, 1, "GAE lambda.");
  t.number("algo.kl.init_coef", 0.01, 0, kInf, "Initial KL coefficient (0: no reference model).");
  t.choice("algo.kl.estimator", "k1", {"k1", "k2", "k3"},
           "KL estimator on log_probs - log_probs_ref.");
  t.number("algo.kl.target", 0.0, 0, kInf, "Adaptive KL target (0: fixed coefficient).");
  t.integer("algo.kl.horizon", 10000, 1, kInf, "Adaptive KL controller horizon.");
  t.boolean("algo.kl.use_loss", false, "KL as a loss term instead of a per-token reward penalty.");
  t.integer("algo.async_steps", 0, 0, 1,
            "One-step off-policy: 1 = the rollout group generates step k+1's samples with the "
            "weights before step k's update while the actor and critic train on step k "
            "(veRL's one-step-off-policy); the PPO ratio is taken against the rollout's own "
            "log-probs (with algo.rollout_correction, against the trainer's). 0: generate, "
            "then train (on-policy).");
  t.choice("algo.rollout_correction", "none", {"none", "tis", "decoupled"},
           "Correction for the rollout engine's log-probs differing from the trainer's (BF16 "
           "kernels, and with algo.async_steps 1 the weights it lags by): the ratio is taken "
           "against the trainer's recomputed log-probs pi_old and each token's policy loss is "
           "weighted by w = pi_old / pi_rollout, detached. tis: truncated importance sampling, "
           "w capped at algo.rollout_correction_cap (Yao et al. 2025, veRL's "
           "tis_imp_ratio_cap); decoupled: AReaL's decoupled PPO (Fu et al. 2025), w "
           "untruncated. none: no weight, as before.");
  t.number("algo.rollout_correction_cap", 2.0, 1, kInf,
           "tis: the cap C of the weight min(pi_old / pi_rollout, C) (veRL's default 2).");
  t.boolean("algo.dynamic_sampling", false,
            "DAPO dynamic sampling: drop the prompts whose samples all got the same score (no "
            "group-relative signal), refilled up to rollout.max_refill_batches. Needs "
            "reward.rule or reward.remote_url and rollout.n_samples_per_prompt >= 2.");
  t.choice("algo.dpo.loss", "sigmoid", {"sigmoid", "ipo", "hinge", "simpo", "orpo", "kto"},
           "DPO-family loss; simpo and orpo need no reference model; kto trains on unpaired rows "
           "(data.prompt_key, data.output_key, data.label_key: true for desirable).");
  t.number("algo.dpo.beta", 0.1, 0, kInf, "DPO beta: strength of the implicit KL to the reference.",
           true);
  t.number("algo.dpo.label_smoothing", 0.0, 0, 0.5, "cDPO label smoothing.");
  t.number("algo.dpo.simpo_gamma", 0.5, 0, kInf, "SimPO target reward margin gamma.");
  t.number("algo.dpo.orpo_lambda", 0.1, 0, kInf,
           "ORPO weight lambda of the odds-ratio term added to the chosen NLL (TRL's beta).");
  t.number("algo.dpo.kto_desirable_weight", 1.0, 0, kInf,
           "KTO weight lambda_D of the desirable rows' loss.");
  t.number("algo.dpo.kto_undesirable_weight", 1.0, 0, kInf,
           "KTO weight lambda_U of the undesirable rows' loss.");
  t.number("algo.dpo.nll_loss_coef", 0.0, 0, kInf, "Weight of the NLL loss on chosen responses.");
  t.choice("algo.rm.loss", "sigmoid", {"sigmoid", "logexp"}, "Pairwise reward-model loss.");

  // Roles.
  add_role_placement(t, "actor", "Policy model: a Hugging Face model directory.");
  add_trainer_keys(t, "actor", 1e-6);
  t.number("actor.eps_clip", 0.2, 0, 10, "PPO ratio clip.", true);
  t.number("actor.eps_clip_low", 0.0, 0, 10, "Lower ratio clip (0: actor.eps_clip).");
  t.number("actor.eps_clip_high", 0.0, 0, 10, "Upper ratio clip (0: actor.eps_clip).");
  t.number("actor.dual_clip", 0.0, 0, kInf, "Dual-clip constant c > 1 (0: off).");
  t.choice("actor.policy_loss", "ppo", {"ppo", "gspo"},
           "Importance ratio of the clipped policy loss: ppo, one per token; gspo, one per "
           "sequence, exp of the mean log-ratio over its tokens, clipped as a whole (GSPO, as "
           "OpenRLHF's policy_loss_type; the paper clips to [1 - 3e-4, 1 + 4e-4]).");
  t.choice("actor.loss_agg", "auto", {"auto", "token_mean", "seq_mean", "token_sum_norm"},
           "Loss aggregation of the policy and value losses: token_mean over all action "
           "tokens; seq_mean per sequence, then over sequences; token_sum_norm sums over "
           "tokens and divides by sequences x rollout.max_new_tokens (Dr. GRPO). auto: "
           "token_sum_norm for dr_grpo, token_mean otherwise.");
  t.number("actor.entropy_coef", 0.0, 0, kInf, "Entropy bonus coefficient.");
  t.boolean("actor.offload_optimizer_while_generating", false,
            "With rollout.colocate_with actor on cuda nodes: the actor's FP32 master weights, "
            "AdamW moments and gradient shards move to pinned host memory while the rollout "
            "generates and the weights sync, and come back to train (a host round trip of 16 "
            "bytes per parameter of the shard per step; actor.adam_offload keeps them on the "
            "host for good instead). A no-op on cpu nodes (host memory is the same memory), on "
            "GPUs of its own, with actor.adam_offload and with algo.async_steps 1.");

  add_role_placement(t, "critic", "Value model directory (default: reward.model).");
  add_trainer_keys(t, "critic", 9e-6);
  t.number("critic.value_clip", 0.5, 0, kInf, "Value clip around the old values (0: off).");
  t.string("critic.value_head_prefix", "score", "Name prefix of the value head's weights.");

  add_role_placement(t, "reward",
                     "Reward model directory with a value head (the reward source when no "
                     "other reward key is set; else only critic.model's default).");
  add_trainer_keys(t, "reward", 9e-6,
                   " In PPO jobs (reward not trained) 3 shards the reward model's weights over its "
                   "workers, one layer gathered at a time; other values keep it whole.");
  t.string("reward.value_head_prefix", "score", "Name prefix of the value head's weights.");
  t.numbers("reward.clip_range", {-10.0, 10.0}, "Scores are clipped to [low, high].");
  t.string("reward.remote_url", "",
           "HTTP endpoint scoring {prompts, responses, labels} (instead of a reward model).");
  t.number("reward.remote_timeout_s", 30.0, 0, 3600, "Timeout of one remote reward call.", true);
  t.string("reward.rule", "",
           "Built-in rule reward instead of a model: letters, match_label, math, format (see "
           "docs/rewards.md).");
  t.file("reward.python", "",
         "A Python reward function \"FILE.py:FUNCTION\" with TRL's signature fn(prompts, "
         "completions, labels, **row) -> list[float], run in rlhf's pool of Python processes.");
  t.string("reward.format_pattern", "",
           "Regular expression (PCRE2, . matches newlines) the whole response must match for "
           "the format rule to give 1 (e.g. <think>.*</think>\\s*<answer>.*</answer>).");
  t.add("reward.sources", KeyType::kSources, json::array(),
        "Several reward sources, summed with weights (TRL's reward_funcs + reward_weights): "
        "a list of {\"rule\": NAME} | {\"python\": \"FILE.py:FUNCTION\"} | {\"remote_url\": URL} "
        "| {\"model\": DIR}, each with optional \"weight\" (default 1), \"name\" and, for the "
        "format rule, \"pattern\". Each is logged as reward/<name>. Instead of the single-source "
        "keys reward.rule, reward.python, reward.remote_url, reward.model.");
  t.string("reward.python_interpreter", "python3",
           "Interpreter of the Python reward processes (a venv's python for your packages).");
  t.integer("reward.python_workers", 2, 1, 256,
            "Python processes per Python reward source; a batch is split between them.");
  t.number("reward.python_timeout_s", 300.0, 0, 86400,
           "Seconds one batch may take in a Python reward function before the job stops.", true);
  t.integer("reward.overlong_buffer_len", 0, 0, kInf,
            "DAPO overlong reward shaping: a response longer than rollout.max_new_tokens minus "
            "this many tokens loses reward.overlong_penalty_factor x (excess / this), up to the "
            "whole factor (0: off).");
  t.number("reward.overlong_penalty_factor", 1.0, 0, kInf,
           "Largest overlong penalty (at rollout.max_new_tokens tokens).");

  // Environments of multi-turn rollouts (docs/agentic.md): at most one of the first three.
  t.choice("env.builtin", "", {"", "calculator", "guess_number"},
           "Built-in environment of multi-turn rollouts: calculator (a tool `calculator` with "
           "argument `expression`) or guess_number (\"higher\"/\"lower\" feedback). Empty: "
           "none (single-turn rollouts, unless env.python or env.url is set).");
  t.file("env.python", "",
         "A Python environment \"FILE.py:FACTORY\": FACTORY(**env.options) makes one object per "
         "trajectory with reset(row) -> str | None and step(action) -> (observation, reward, "
         "done), run in rlhf's pool of Python processes.");
  t.string("env.url", "",
           "An HTTP environment: POST {url}/reset, {url}/step and {url}/close with the JSON "
           "protocol of docs/agentic.md.");
  t.number("env.timeout_s", 30.0, 0, 86400,
           "Seconds one environment call may take; past it the trajectory ends (timed out). A "
           "Python process that does not come back from it stops the job.",
           true);
  t.integer("env.python_workers", 2, 1, 256,
            "Python processes of a Python environment; each trajectory's object lives in one.");
  t.string("env.python_interpreter", "python3",
           "Interpreter of the Python environment processes (a venv's python for your packages).");
  t.add("env.options", KeyType::kObject, json::object(),
        "Options of the environment: the factory's keyword arguments (Python), \"options\" of "
        "each reset (HTTP), or the built-in's: tool_format (auto, hermes, llama3) for the "
        "calculator; low, high, seed, max_guesses for guess_number.");

  add_role_placement(t, "ref", "Reference model directory (default: actor.model).");
  t.integer("ref.zero_stage", 0, 0, 3,
            "0: full weights on every ref worker (more workers serve more micro batches at "
            "once); 3: weights sharded over the ref workers, each layer all-gathered just "
            "before use (as DeepSpeed's stage-3 reference in OpenRLHF; 1 and 2 are refused).");

  add_role_placement(t, "rollout",
                     "Generation model (default: actor.model; synced after each step).");
  t.number("rollout.sync_bucket_mb", 256.0, 0, 65536,
           "Actor -> rollout weight sync: the weights travel in wire dtype packed into flat "
           "buckets of this many MiB (a larger tensor is split), one bucket at a time, through "
           "CUDA IPC when the rollout shares the actor's GPU, NCCL when both have GPUs of their "
           "own, else Gloo; no rank holds more than one layer and one bucket beyond its model.",
           true);
  t.choice("rollout.lora_sync", "adapters", {"adapters", "merged"},
           "How a LoRA actor (actor.lora.rank > 0) syncs the rollout: `adapters` sends only "
           "the lora_A / lora_B tensors (a few MB) and each rollout worker merges them into "
           "the base it loaded, W = base + scale B A from a host copy of the base (needs "
           "rollout.model = actor.model); `merged` sends W + scale B A for the whole model, "
           "computed one layer at a time on the actor. Both give the rollout the same weights "
           "bit for bit; bench/RESULTS.md (issue 30.3) has the timings.");
  t.boolean("rollout.offload_while_training", true,
            "With rollout.colocate_with actor on cuda nodes (vLLM's sleep mode, level 1): the "
            "rollout's weights move to pinned host memory after generating and come back "
            "before the weight sync, so scoring and training have the GPU (the KV cache is "
            "freed after every generate call anyway); costs two host copies of the rollout's "
            "weights per step. A no-op on cpu nodes (host memory is the same memory), on GPUs "
            "of its own and with algo.async_steps 1 (generation overlaps training).");

  // Checkpoints and logging.
  t.file("ckpt.path", "", "Checkpoint directory (default: the run directory's ckpt/).");
  t.integer("ckpt.save_steps", -1, -1, kInf, "Save every N steps (-1: only at the end).");
  t.integer("ckpt.max_num", 3, 1, 1000, "Keep the newest N checkpoints.");
  t.boolean("ckpt.save_only_model", false, "Skip optimizer state in checkpoints.");
  t.integer("eval.steps", 0, 0, kInf,
            "Also evaluate the held-out set (data.eval_dataset) every N training steps "
            "(OpenRLHF's eval_steps); 0: only before and after training.");
  t.integer("eval.n_samples", 0, 0, 1024,
            "ppo: sampled responses per held-out prompt (at rollout.temperature) beside the "
            "greedy one, for eval/pass_rate_sampled (0: greedy only).");
  t.string("eval.accuracy_source", "",
           "ppo: the reward source whose full score (>= 1) counts as correct in eval/accuracy "
           "(empty: the first source).");
  t.integer("eval.max_samples", 0, 0, kInf,
            "ppo: evaluate at most this many held-out prompts (0: all).");
  t.boolean("ckpt.export_hf", true,
            "Export trained models as Hugging Face directories at the end.");
  t.file("logger.run_dir", "runs", "Parent directory of run directories.");
  t.integer("logger.logging_steps", 1, 1, kInf, "Log metrics every N steps.");
  t.boolean("logger.tensorboard", true,
            "Write TensorBoard event files to <run dir>/tensorboard: every logged number as a "
            "scalar at its step, sample generations as text.");
  t.integer("logger.samples_per_step", 4, 0, 1000,
            "Sample generations (prompt, response, reward) of each logged PPO step kept in "
            "samples.jsonl and TensorBoard's text tab (0: none).");
  t.integer("logger.dashboard_port", -1, -1, 65535,
            "`rlhf run` serves a live dashboard (charts of the run's metrics) on "
            "127.0.0.1:PORT and prints its address at start; -1: any free port (the default, so "
            "jobs run side by side never clash), 0: no dashboard. `rlhf report RUN_DIR` writes "
            "the same page as a file.");
  return t.take();
}

std::string format_number(double v) {
  if (std::abs(v) >= kInf) return "inf";
  if (v == std::floor(v) && std::abs(v) < 1e15) return std::to_string(static_cast<int64_t>(v));
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

std::string describe(const json& v) {
  std::string s = v.dump();
  return s.size() > 60 ? s.substr(0, 57) + "..." : s;
}

bool is_integer(const json& v) {
  if (v.is_number_integer()) return true;
  return v.is_number_float() && v.get<double>() == std::floor(v.get<double>()) &&
         std::abs(v.get<double>()) < 9e15;
}

std::string range_text(const KeySpec& k) {
  std::string lo = k.min ? format_number(*k.min) : "";
  std::string hi = k.max ? format_number(*k.max) : "";
  if (k.min && k.max)
    return " in " + std::string(k.min_exclusive ? "(" : "[") + lo + ", " + hi + "]";
  if (k.min) return std::string(k.min_exclusive ? " > " : " >= ") + lo;
  if (k.max) return " <= " + hi;
  return "";
}

bool in_range(const KeySpec& k, double v) {
  if (k.min && (k.min_exclusive ? v <= *k.min : v < *k.min)) return false;
  if (k.max && v > *k.max) return false;
  return true;
}

std::string check_devices(const json& v) {
  auto check_list = [](const json& list) -> std::string {
    if (!list.is_array()) return "a list of device ids";
    for (const auto& d : list)
      if (!d.is_number_integer() || d.get<int64_t>() < 0) return "device ids as integers >= 0";
    return "";
  };
  if (v.is_array()) return check_list(v);
  if (v.is_object()) {
    for (const auto& [node, list] : v.items())
      if (auto e = check_list(list); !e.empty()) return e + " for node \"" + node + "\"";
    return "";
  }
  return "a list of device ids or an object {\"node\": [ids]}";
}

}  // namespace

const char* key_type_name(KeyType type) {
  switch (type) {
    case KeyType::kInt:
      return "integer";
    case KeyType::kFloat:
      return "number";
    case KeyType::kFloatOrAuto:
      return "number or auto";
    case KeyType::kBool:
      return "boolean";
    case KeyType::kString:
      return "string";
    case KeyType::kPath:
      return "path";
    case KeyType::kEnum:
      return "choice";
    case KeyType::kFloatList:
      return "numbers";
    case KeyType::kIntList:
      return "integers";
    case KeyType::kDevices:
      return "devices";
    case KeyType::kNodes:
      return "nodes";
    case KeyType::kSources:
      return "sources";
    case KeyType::kObject:
      return "object";
  }
  return "?";
}

std::string KeySpec::expectation() const {
  switch (type) {
    case KeyType::kInt:
      return "an integer" + range_text(*this);
    case KeyType::kFloat:
      return "a number" + range_text(*this);
    case KeyType::kFloatOrAuto:
      return "\"auto\" or a number" + range_text(*this);
    case KeyType::kBool:
      return "true or false";
    case KeyType::kString:
      return "a string";
    case KeyType::kPath:
      return "a path (a string)";
    case KeyType::kEnum: {
      std::vector<std::string> shown;
      for (const auto& c : choices) shown.push_back(c.empty() ? "\"\"" : c);
      return "one of " + join(shown, ", ");
    }
    case KeyType::kFloatList:
      return "a list of " + std::to_string(list_len) + " numbers";
    case KeyType::kIntList:
      return "a list of integers" + range_text(*this);
    case KeyType::kDevices:
      return "a list of device ids or an object {\"node\": [ids]}";
    case KeyType::kNodes:
      return "a list of node objects";
    case KeyType::kSources:
      return "a list of reward-source objects";
    case KeyType::kObject:
      return "a JSON object";
  }
  return "?";
}

std::string KeySpec::check(const json& v) const {
  auto bad = [&](const std::string& what = "") {
    return "expected " + (what.empty() ? expectation() : what) + ", found " + describe(v);
  };
  switch (type) {
    case KeyType::kInt:
      if (!is_integer(v)) return bad();
      return in_range(*this, v.get<double>()) ? "" : bad();
    case KeyType::kFloat:
      if (!v.is_number()) return bad();
      return in_range(*this, v.get<double>()) ? "" : bad();
    case KeyType::kFloatOrAuto:
      if (v.is_string() && v.get<std::string>() == "auto") return "";
      if (!v.is_number()) return bad();
      return in_range(*this, v.get<double>()) ? "" : bad();
    case KeyType::kBool:
      return v.is_boolean() ? "" : bad();
    case KeyType::kString:
    case KeyType::kPath:
      return v.is_string() ? "" : bad();
    case KeyType::kEnum:
      if (!v.is_string()) return bad();
      for (const auto& c : choices)
        if (c == v.get<std::string>()) return "";
      {
        std::string hint = closest_match(v.get<std::string>(), choices);
        return bad() + (hint.empty() ? "" : " (did you mean " + hint + "?)");
      }
    case KeyType::kFloatList:
      if (!v.is_array() || v.size() != list_len) return bad();
      for (const auto& e : v)
        if (!e.is_number()) return bad();
      return "";
    case KeyType::kIntList:
      if (!v.is_array()) return bad();
      for (const auto& e : v)
        if (!is_integer(e) || !in_range(*this, e.get<double>())) return bad();
      return "";
    case KeyType::kDevices: {
      std::string e = check_devices(v);
      return e.empty() ? "" : bad(e);
    }
    case KeyType::kNodes:
      return v.is_array() && !v.empty() ? "" : bad("a non-empty list of node objects");
    case KeyType::kSources:
      if (!v.is_array()) return bad();
      for (const auto& e : v)
        if (!e.is_object()) return bad();
      return "";
    case KeyType::kObject:
      return v.is_object() ? "" : bad();
  }
  return "";
}

json KeySpec::parse_override(const std::string& text) const {
  auto fail = [&]() -> json {
    throw InputError("--set " + path + "=" + text + ": expected " + expectation());
  };
  switch (type) {
    case KeyType::kString:
    case KeyType::kPath:
    case KeyType::kEnum:
      return text;
    case KeyType::kBool:
      if (text == "true" || text == "1") return true;
      if (text == "false" || text == "0") return false;
      return fail();
    case KeyType::kFloatOrAuto:
      if (trim(text) == "auto") return "auto";
      [[fallthrough]];
    case KeyType::kInt:
    case KeyType::kFloat: {
      json v = json::parse(text, nullptr, /*allow_exceptions=*/false);
      if (v.is_discarded() || !v.is_number()) return fail();
      return v;
    }
    default: {
      // Lists and objects: JSON, or a bare comma-separated list of numbers.
      std::string t = trim(text);
      json v = json::parse(t, nullptr, false);
      if (v.is_discarded() && !t.empty() && t.front() != '[' && t.front() != '{')
        v = json::parse("[" + t + "]", nullptr, false);
      if (v.is_discarded()) return fail();
      return v;
    }
  }
}

const std::vector<KeySpec>& spec_keys() {
  static const std::vector<KeySpec> kKeys = build_table();
  return kKeys;
}

const KeySpec* find_key(const std::string& path) {
  static const std::map<std::string, const KeySpec*> kIndex = [] {
    std::map<std::string, const KeySpec*> m;
    for (const auto& k : spec_keys()) m[k.path] = &k;
    return m;
  }();
  auto it = kIndex.find(path);
  return it == kIndex.end() ? nullptr : it->second;
}

const std::vector<std::string>& spec_key_paths() {
  static const std::vector<std::string> kPaths = [] {
    std::vector<std::string> p;
    for (const auto& k : spec_keys()) p.push_back(k.path);
    return p;
  }();
  return kPaths;
}

bool is_builtin_source(const std::string& value) {
  if (value.empty()) return true;
  // "synthetic:letters", "preset:llama-3-8b": a scheme of letters before the first ':' and
  // no '/' before it (so "./a:b" and "/data/x:y" stay paths).
  const auto colon = value.find(':');
  if (colon == std::string::npos || colon == 0) return false;
  for (size_t i = 0; i < colon; ++i)
    if (!std::isalpha(static_cast<unsigned char>(value[i])) && value[i] != '_') return false;
  return true;
}

std::string closest_key(const std::string& path) {
  const auto dot = path.rfind('.');
  const std::string parent = dot == std::string::npos ? "" : path.substr(0, dot + 1);
  const std::string leaf = path.substr(parent.size());
  // "job.name": the top-level keys are listed under a "top level" heading, not a section.
  if (parent == "job." && find_key(leaf)) return leaf;
  // The children of `parent`: keys, or the next section down ("rollout" for "rollouts").
  std::vector<std::string> siblings;
  for (const auto& known : spec_key_paths()) {
    if (known.rfind(parent, 0) != 0) continue;
    const std::string rest = known.substr(parent.size());
    const std::string sibling = parent + rest.substr(0, rest.find('.'));
    if (std::find(siblings.begin(), siblings.end(), sibling) == siblings.end())
      siblings.push_back(sibling);
  }
  // A sibling that shares a long prefix with the typed name is what a user shortened or
  // misspelled at the end (n_samples -> n_samples_per_prompt): the longest common prefix
  // wins when it covers at least 4 characters or the whole typed name.
  std::string best;
  size_t best_common = 0;
  for (const auto& sibling : siblings) {
    const std::string name = sibling.substr(parent.size());
    size_t common = 0;
    while (common < name.size() && common < leaf.size() && name[common] == leaf[common]) ++common;
    if (common > best_common) {
      best_common = common;
      best = sibling;
    }
  }
  if (!best.empty() && (best_common >= 4 || best_common == leaf.size())) return best;
  std::string hint = closest_match(path, siblings);
  if (!hint.empty()) return hint;
  // A misspelled section ("rolout.batch_size"): the same leaf under the closest section.
  return closest_match(path, spec_key_paths());
}

const std::vector<std::string>& node_fields() {
  static const std::vector<std::string> kFields = {"name", "host", "kind", "devices", "memory_gb"};
  return kFields;
}

json default_spec_json() {
  json out = json::object();
  for (const auto& k : spec_keys())
    out[json::json_pointer("/" + join(split(k.path, '.'), "/"))] = k.default_value;
  return out;
}

std::string spec_markdown() {
  std::ostringstream md;
  md << "# Job spec reference\n\n"
        "<!-- Generated by `rlhf spec --markdown` from the key table in core/spec_schema.cpp."
        " Do not edit by hand: a test fails when this file differs from the table. -->\n\n"
        "A job spec is one JSON object, nested by the dotted paths below (`--set "
        "rollout.n_samples_per_prompt=8` overrides one value). Every key is optional; "
        "unknown keys are errors. Comments (`//`) are allowed.\n\n"
        "**Paths** (type `path`): a relative path written in a spec file is relative to the "
        "directory of that file, so `examples/ppo_tiny.json` runs the same from any working "
        "directory; a relative path given with `--set` is relative to the current directory, "
        "as on any command line. Absolute paths and built-in sources (`synthetic:NAME`, "
        "`preset:NAME`) are taken as they are.\n";
  std::string section;
  for (const auto& k : spec_keys()) {
    std::string top = split(k.path, '.').front();
    const bool top_level = k.path.find('.') == std::string::npos;
    std::string group = top_level ? "top level" : top;
    if (group != section) {
      section = group;
      md << "\n## " << section << "\n\n";
      if (top_level)
        md << "Keys at the top of the spec, in no section: `{\"kind\": \"dpo\", \"name\": "
              "\"my-run\", ...}`.\n\n";
      md << "| key | type | default | allowed | description |\n"
         << "| --- | --- | --- | --- | --- |\n";
    }
    std::string allowed = k.expectation();
    if (allowed.rfind("an ", 0) == 0) allowed = allowed.substr(3);
    if (allowed.rfind("a ", 0) == 0) allowed = allowed.substr(2);
    std::string def = k.default_value.dump();
    std::string doc = k.doc;
    for (auto* s : {&def, &allowed, &doc}) {
      std::string escaped;
      for (char c : *s) escaped += (c == '|') ? std::string("\\|") : std::string(1, c);
      *s = escaped;
    }
    md << "| `" << k.path << "` | " << key_type_name(k.type) << " | `" << def << "` | " << allowed
       << " | " << doc << " |\n";
  }
  return md.str();
}

}  // namespace rlhf
