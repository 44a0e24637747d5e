// PPO's train steps as typed requests and replies (transport/operation.h); the worker side
// is actors/train_operations.cpp. The loss settings travel whole (ppo::PolicyLossConfig).
#pragma once

#include <cstdint>

#include "engine/worker_ops.h"
#include "ppo/kl.h"
#include "ppo/losses.h"
#include "transport/operation.h"

namespace rlhf::ppo {
// PolicyLossConfig on the wire: ratio, clip_low, clip_high, dual_clip, aggregation,
// norm_len, correction {mode, cap}; enums by their spec names.
void to_json(nlohmann::json& j, const PolicyLossConfig& c);
void from_json(const nlohmann::json& j, PolicyLossConfig& c);
}  // namespace rlhf::ppo

namespace rlhf::ops {

// How a train step walks its rows: micro batches of micro_batch_size rows (grad_accum_steps
// of them per rank, the role's config), each forwarded in parts of at most max_tokens (rows
// x padded length; 0: whole) or, with packing, as packed rows of at most max_tokens tokens.
struct TrainBatching {
  int64_t action_len = 0;
  int64_t micro_batch_size = 0;
  int64_t max_tokens = 0;
  bool packing = false;
};
RLHF_WIRE_STRUCT(TrainBatching, "batching", action_len, micro_batch_size, max_tokens, packing)

struct TrainActorReply {
  StepFigures metrics;
  double clip_frac = 0;  // means over the micro batches
  double approx_kl = 0;
  double kl_loss = 0;
  double aux_loss = 0;  // the load-balancing loss (mixtures of experts; 0 for a dense model)
  double gkd_loss = 0;  // GKD's divergence, token mean (0 without gkd_coef)
};
RLHF_WIRE_STRUCT(TrainActorReply, "train_actor reply", metrics, clip_frac, approx_kl, kl_loss,
                 aux_loss, gkd_loss)

// One optimizer step of the PPO policy loss over this rank's share of the global batch.
// Tensors: "sequences", "attention_mask", "action_mask", "log_probs_old", "advantages",
// "log_probs_behaviour" (with a rollout correction) and "log_probs_ref" (with
// kl_loss_coef > 0: OpenRLHF's use_kl_loss, the term kl_loss_coef x masked_mean(kl)).
// Log-probs at `temperature`, the sampling one.
struct TrainActor {
  static constexpr const char* kName = "train_actor";
  using Reply = TrainActorReply;
  TrainBatching batching;
  ppo::PolicyLossConfig policy;
  double kl_loss_coef = 0;
  ppo::KlEstimator kl_estimator = ppo::KlEstimator::kK1;
  double temperature = 1.0;
  // Routing replay: every forward (and checkpointed recompute) runs the rollout's experts,
  // tensor "routes" [B, T, S, k] (models/routes.h).
  bool replay_routes = false;
  // Mixtures of experts: loss += aux_loss_coef x the load-balancing loss (models::AuxLoss).
  double aux_loss_coef = 0;
  // GKD (algo.distill.gkd.*): loss += gkd_coef x the token mean of ppo::gkd_divergence with
  // gkd_beta, against the teacher's top-k: tensors "teacher_top_ids" [B, A, k] int64,
  // "teacher_top_log_probs" [B, A, k] FP32 and "teacher_top_rest" [B, A] FP32 (the teacher's
  // LogProbs with top_k).
  double gkd_coef = 0;
  double gkd_beta = 0.5;
};
void to_json(nlohmann::json& j, const TrainActor& r);
void from_json(const nlohmann::json& j, TrainActor& r);

struct TrainCriticReply {
  StepFigures metrics;
};
RLHF_WIRE_STRUCT(TrainCriticReply, "train_critic reply", metrics)

// One optimizer step of the clipped value loss (value_clip) on this rank's rows, aggregated
// as the policy loss is (OpenRLHF's ValueLoss follows token_level_loss too). Tensors:
// "sequences", "attention_mask", "action_mask", "values_old", "returns".
struct TrainCritic {
  static constexpr const char* kName = "train_critic";
  using Reply = TrainCriticReply;
  TrainBatching batching;
  double value_clip = 0;
  ppo::LossAggregation aggregation = ppo::LossAggregation::kTokenMean;
  int64_t norm_len = 0;
};
void to_json(nlohmann::json& j, const TrainCritic& r);
void from_json(const nlohmann::json& j, TrainCritic& r);

}  // namespace rlhf::ops
