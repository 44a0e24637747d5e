// The PPO driver's settings, filled from the job spec (the driver passes each worker only
// its own role config; see engine/role_config.h).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/spec.h"
#include "ppo/advantages.h"
#include "ppo/kl.h"
#include "ppo/losses.h"

namespace rlhf::ppo {

struct PpoConfig {
  // Rollout.
  int64_t rollout_batch_size = 1024;     // prompts per step
  int64_t rollout_micro_batch_size = 8;  // prompts per generate call on one engine
  int tensor_parallel_size = 1;          // rollout workers per engine
  int64_t n_samples_per_prompt = 1;
  int64_t max_new_tokens = 1024;
  double temperature = 1.0;
  double top_p = 1.0;
  int64_t top_k = -1;
  std::vector<int64_t> stop_token_ids;
  int64_t max_turns = 1;  // rollout.max_turns: model turns per trajectory
  // The spec's env object (env.builtin / env.python / env.url and their settings) when it
  // names an environment; null otherwise (single-turn, no environment).
  nlohmann::json environment;
  int64_t prompt_max_len = 1024;
  // Training.
  int64_t train_batch_size = 128;
  int64_t train_micro_batch_size = 4;
  int64_t max_tokens_per_micro_batch = 0;  // token budget of one forward (0: off)
  bool packing_samples = false;            // with a budget: training packs sequences
  int64_t max_epochs = 1;
  int64_t num_episodes = 1;
  int64_t max_steps = 0;  // 0: until the episodes are done
  uint64_t seed = 42;
  // Algorithm.
  AdvantageConfig advantage;
  KlEstimator kl_estimator = KlEstimator::kK1;
  double kl_init_coef = 0.01;
  double kl_target = 0.0;
  int64_t kl_horizon = 10000;
  bool kl_use_loss = false;
  double distill_coef = 0;  // algo.distill.coef: the teacher's per-token reverse-KL weight
  // algo.distill.gkd.*: GKD's divergence weight in the actor's loss (0: off), its beta, and
  // the teacher's tokens per position (ppo/kl.h gkd_divergence).
  double gkd_coef = 0, gkd_beta = 0.5, gkd_lambda = 1.0;
  int64_t gkd_top_k = 64;
  // actor.policy_loss, eps_clip*, dual_clip, loss_agg (resolved: never "auto"; the critic's
  // loss follows it), algo.rollout_correction and its cap.
  PolicyLossConfig policy;
  double value_clip = 0.5;
  // DAPO.
  int64_t overlong_buffer_len = 0;  // soft length penalty over the last N tokens (0: off)
  double overlong_penalty_factor = 1.0;
  int64_t max_staleness = 0;       // algo.max_staleness: 0 = on-policy
  bool partial_rollout = true;     // rollout.partial_rollout: in-flight weight updates
  bool streaming = false;          // rollout.streaming: scoring starts on finished groups
  bool dynamic_sampling = false;   // drop groups whose samples all score the same
  int64_t max_refill_batches = 0;  // extra batches generated to refill dropped groups
  bool routing_replay = false;     // algo.routing_replay: the actor runs the rollout's experts
  bool routing_stats = false;      // algo.routing_stats (or routing_replay): routes compared
  double aux_loss_coef = 0;        // actor.aux_loss_coef: the MoE load-balancing loss's weight
  // (Checkpoints and logging are the job runtime's: runtime/job_runtime.h.)

  static PpoConfig from_spec(const JobSpec& spec);

  int64_t samples_per_step() const { return rollout_batch_size * n_samples_per_prompt; }
  // Optimizer steps per PPO step: epochs x global batches over the step's samples.
  int64_t optimizer_steps_per_step() const {
    return max_epochs * (samples_per_step() / train_batch_size);
  }
};

}  // namespace rlhf::ppo
