#include "ppo/spec_keys.h"

#include "core/spec_check.h"
#include "engine/spec_keys.h"
#include "envs/spec_keys.h"
#include "ppo/reward_shaping.h"
#include "rewards/spec_keys.h"

namespace rlhf::ppo {

using nlohmann::json;

namespace {

void add_keys(KeyTable& t) {
  t.choice("algo.advantage.estimator", "gae",
           {"gae", "reinforce", "rloo", "reinforce_baseline", "group_norm", "grpo", "dr_grpo"},
           "Advantage estimator; grpo is an alias of group_norm.");
  t.number("algo.advantage.gamma", 1.0, 0, 1, "Discount factor.");
  t.number("algo.advantage.lambd", 0.95, 0, 1, "GAE lambda.");
  t.number("algo.kl.init_coef", 0.01, 0, kUnbounded,
           "Initial KL coefficient (0: no reference model).");
  t.choice("algo.kl.estimator", "k1", {"k1", "k2", "k3"},
           "KL estimator on log_probs - log_probs_ref.");
  t.number("algo.kl.target", 0.0, 0, kUnbounded, "Adaptive KL target (0: fixed coefficient).");
  t.integer("algo.kl.horizon", 10000, 1, kUnbounded, "Adaptive KL controller horizon.");
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
  t.number("algo.rollout_correction_cap", 2.0, 1, kUnbounded,
           "tis: the cap C of the weight min(pi_old / pi_rollout, C) (veRL's default 2).");
  t.boolean("algo.dynamic_sampling", false,
            "DAPO dynamic sampling: drop the prompts whose samples all got the same score (no "
            "group-relative signal), refilled up to rollout.max_refill_batches. Needs "
            "reward.rule or reward.remote_url and rollout.n_samples_per_prompt >= 2.");

  t.number("actor.eps_clip", 0.2, 0, 10, "PPO ratio clip.", true);
  t.number("actor.eps_clip_low", 0.0, 0, 10, "Lower ratio clip (0: actor.eps_clip).");
  t.number("actor.eps_clip_high", 0.0, 0, 10, "Upper ratio clip (0: actor.eps_clip).");
  t.number("actor.dual_clip", 0.0, 0, kUnbounded, "Dual-clip constant c > 1 (0: off).");
  t.choice("actor.policy_loss", "ppo", {"ppo", "gspo"},
           "Importance ratio of the clipped policy loss: ppo, one per token; gspo, one per "
           "sequence, exp of the mean log-ratio over its tokens, clipped as a whole (GSPO, as "
           "OpenRLHF's policy_loss_type; the paper clips to [1 - 3e-4, 1 + 4e-4]).");
  t.choice("actor.loss_agg", "auto", {"auto", "token_mean", "seq_mean", "token_sum_norm"},
           "Loss aggregation of the policy and value losses: token_mean over all action "
           "tokens; seq_mean per sequence, then over sequences; token_sum_norm sums over "
           "tokens and divides by sequences x rollout.max_new_tokens (Dr. GRPO). auto: "
           "token_sum_norm for dr_grpo, token_mean otherwise.");
  t.number("actor.entropy_coef", 0.0, 0, kUnbounded, "Entropy bonus coefficient.");
  t.boolean("actor.offload_optimizer_while_generating", false,
            "With rollout.colocate_with actor on cuda nodes: the actor's FP32 master weights, "
            "AdamW moments and gradient shards move to pinned host memory while the rollout "
            "generates and the weights sync, and come back to train (a host round trip of 16 "
            "bytes per parameter of the shard per step; actor.adam_offload keeps them on the "
            "host for good instead). A no-op on cpu nodes (host memory is the same memory), on "
            "GPUs of its own, with actor.adam_offload and with algo.async_steps 1.");

  t.number("critic.value_clip", 0.5, 0, kUnbounded, "Value clip around the old values (0: off).");

  t.integer("eval.steps", 0, 0, kUnbounded,
            "Also evaluate the held-out set (data.eval_dataset) every N training steps "
            "(OpenRLHF's eval_steps); 0: only before and after training.");
  t.integer("eval.n_samples", 0, 0, 1024,
            "ppo: sampled responses per held-out prompt (at rollout.temperature) beside the "
            "greedy one, for eval/pass_rate_sampled (0: greedy only).");
  t.string("eval.accuracy_source", "",
           "ppo: the reward source whose full score (>= 1) counts as correct in eval/accuracy "
           "(empty: the first source).");
  t.integer("eval.max_samples", 0, 0, kUnbounded,
            "ppo: evaluate at most this many held-out prompts (0: all).");
}

AdvantageEstimator estimator(const json& r) {
  return parse_advantage_estimator(r.at(spec_pointer("algo.advantage.estimator")));
}

// Roles of a ppo job, in start-up order: actor, critic (gae), reward (a reward model
// source), ref (a KL term, unless the LoRA actor is its own reference), rollout.
std::optional<RoleUse> roles(const json& r) {
  if (r.at("kind") != "ppo") return std::nullopt;
  RoleUse use{{Role::kActor}, {Role::kActor}};
  if (uses_critic(estimator(r))) {
    use.used.push_back(Role::kCritic);
    use.trained.push_back(Role::kCritic);
  }
  if (rewards::uses_reward_model(r)) use.used.push_back(Role::kReward);
  const double kl = r.at(spec_pointer("algo.kl.init_coef")).get<double>();
  if ((kl > 0 || r.at(spec_pointer("algo.kl.use_loss")).get<bool>()) &&
      !engine::actor_is_reference(r))
    use.used.push_back(Role::kRef);
  use.used.push_back(Role::kRollout);
  return use;
}

// A ppo job's samples per step split into train.batch_size; group estimators and dynamic
// sampling compare a prompt's samples; some reward must exist.
void check_samples(SpecCheck& v) {
  std::vector<SpecProblem> problems;
  const json sources = rewards::reward_sources(v.resolved, &problems);
  // An environment (env.*) may be the only source: its rewards are summed per trajectory.
  if (sources.empty() && problems.empty() && !envs::has_environment(v.resolved))
    v.problem("reward",
              "a ppo job needs a reward source: reward.model, reward.rule, reward.python, "
              "reward.remote_url, reward.sources or an environment (env.*)");
  const int64_t n = v.integer("rollout.n_samples_per_prompt");
  const int64_t rb = v.integer("rollout.batch_size"), train_bs = v.integer("train.batch_size");
  if (v.ok({"train.batch_size", "train.micro_batch_size", "rollout.batch_size",
            "rollout.n_samples_per_prompt"}) &&
      (rb * n) % train_bs != 0)
    v.problem("rollout.batch_size", std::to_string(rb) +
                                        " prompts x rollout.n_samples_per_prompt (" +
                                        std::to_string(n) + ") = " + std::to_string(rb * n) +
                                        " samples is not a multiple of train.batch_size (" +
                                        std::to_string(train_bs) + ")");
  const std::string est = v.str("algo.advantage.estimator");
  if (uses_group_baseline(estimator(v.resolved)) && n < 2 && v.ok({"rollout.n_samples_per_prompt"}))
    v.problem("rollout.n_samples_per_prompt",
              "is 1, but the " + est +
                  " estimator compares samples of the same prompt: set it to 2 or more");
  if (v.ok({"algo.dynamic_sampling", "reward.rule", "reward.remote_url", "reward.sources"}) &&
      v.flag("algo.dynamic_sampling")) {
    if (rewards::uses_reward_model(v.resolved))
      v.problem("algo.dynamic_sampling",
                "needs the scores before scoring: use rule, python or remote reward sources (a "
                "reward model is not supported with dynamic sampling)");
    if (v.ok({"rollout.n_samples_per_prompt"}) && n < 2)
      v.problem("algo.dynamic_sampling",
                "compares the samples of a prompt: set rollout.n_samples_per_prompt to 2 or more");
  }
}

void check_ppo(SpecCheck& v) {
  const double dual = v.real("actor.dual_clip");
  if (v.ok({"actor.dual_clip"}) && dual != 0 && dual <= 1)
    v.problem("actor.dual_clip",
              "expected 0 (off) or a number > 1, found " + v.at("actor.dual_clip").dump());
  if (v.ok({"algo.kl.target", "algo.kl.init_coef"}) && v.real("algo.kl.target") > 0 &&
      v.real("algo.kl.init_coef") == 0)
    v.problem("algo.kl.target", "an adaptive KL target needs algo.kl.init_coef > 0");
  if (v.kind() == "ppo") check_samples(v);
}

std::string why_unused(const json& r, Role role) {
  return role == Role::kCritic && r.at("kind") == "ppo" ? "only the gae estimator uses a critic"
                                                        : "";
}

}  // namespace

SpecSection spec_section() {
  SpecSection s;
  s.owner = "ppo";
  s.keys = add_keys;
  s.roles = roles;
  s.rules = check_ppo;
  s.why_unused = why_unused;
  return s;
}

}  // namespace rlhf::ppo
