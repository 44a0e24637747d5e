// The operations of a worker that holds one role's model (actor, critic, reward, ref), as
// typed requests and replies (transport/operation.h); the worker side is
// actors/model_operations.cpp. PPO's train steps are in ppo/worker_ops.h, the offline jobs'
// in dpo/worker_ops.h, the weight sync to the rollout in rollout/worker_ops.h.
//
// Batches travel as tensors beside the args: "sequences" and "attention_mask" [B, T] int64,
// the last action_len positions of each row being its response.
#pragma once

#include <cstdint>
#include <string>

#include "engine/role_config.h"
#include "engine/trainer.h"
#include "transport/operation.h"
#include "transport/worker_ops.h"

namespace rlhf::ops {

struct InitReply {
  int64_t parameters = 0;  // the model's parameter count
  MemoryReply memory;      // right after loading
};
RLHF_WIRE_STRUCT(InitReply, "init reply", parameters, memory)

// Loads the role's model; a trained or sharded role joins its group's collectives, which
// meet at store_path (a rendezvous file), and a trained one builds its sharded trainer.
struct Init {
  static constexpr const char* kName = "init";
  using Reply = InitReply;
  engine::ModelRoleConfig config;
  std::string store_path;
};
RLHF_WIRE_STRUCT(Init, "init", config, store_path)

// How a scoring forward splits a request's rows: at most max_tokens (rows x padded length)
// per forward (0: all rows at once), and max_rows, the rows of the largest request any rank
// of the group gets, so ranks that gather weights in every forward (ZeRO-3) run as many.
struct ForwardBudget {
  int64_t max_tokens = 0;
  int64_t max_rows = 0;
};
RLHF_WIRE_STRUCT(ForwardBudget, "budget", max_tokens, max_rows)

// Tensors "log_probs" [B, A], "entropy", "ref_log_probs" as asked; with "routes" in the
// request, per row "route_tokens" (tokens the rollout routed), "route_differ" (of those, the
// ones this forward ran on other experts in some layer) and "router_differ" (the ones this
// model's routers would pick otherwise, replayed or not), int64 [B].
struct LogProbsReply {};
RLHF_WIRE_EMPTY(LogProbsReply, "log_probs reply")

// Per-action log-probs of the batch's responses at `temperature` (logits / T; 0 and 1 mean
// none), with `entropy` also the policy's per-token entropy, with `reference` also the
// base model's (LoRA adapters off: a LoRA actor is its own reference). A mixture of experts
// may get the rollout's routes (tensor "routes" [B, T, S, k], rollout/route_log.h): they are
// compared with this forward's and, with `replay_routes`, replayed (routing replay, R3).
struct LogProbs {
  static constexpr const char* kName = "log_probs";
  using Reply = LogProbsReply;
  int64_t action_len = 0;
  ForwardBudget budget;
  double temperature = 1.0;
  bool entropy = false;
  bool reference = false;
  bool replay_routes = false;
  // > 0 (a GKD teacher): also each action position's top_k most likely tokens and their
  // log-probs (models::head_top_k), tensors "top_ids" [B, A, k] int64, "top_log_probs"
  // [B, A, k] FP32 and "top_rest" [B, A] FP32 (the log mass of the other tokens), k capped at
  // the vocabulary.
  int64_t top_k = 0;
};
RLHF_WIRE_STRUCT(LogProbs, "log_probs", action_len, budget, temperature, entropy, reference,
                 replay_routes, top_k)

struct ValuesReply {};  // tensor "values" [B, A]
RLHF_WIRE_EMPTY(ValuesReply, "values reply")

// The critic's value of the state before each action.
struct Values {
  static constexpr const char* kName = "values";
  using Reply = ValuesReply;
  int64_t action_len = 0;
  ForwardBudget budget;
};
RLHF_WIRE_STRUCT(Values, "values", action_len, budget)

struct ScoreReply {};  // tensor "scores" [B] FP32
RLHF_WIRE_EMPTY(ScoreReply, "score reply")

// A reward model's score of each row: its value head at the row's last attended token.
struct Score {
  static constexpr const char* kName = "score";
  using Reply = ScoreReply;
  ForwardBudget budget;
};
RLHF_WIRE_STRUCT(Score, "score", budget)

// A trainer's optimizer step (engine::StepMetrics) as every train operation replies it.
struct StepFigures {
  int64_t step = 0;
  double loss = 0;
  double grad_norm = 0;
  double lr = 0;
  bool skipped = false;
  int64_t peak_tensor_bytes = 0;
  double loss_scale = 1.0;    // FP16: the loss scale the step used (else 1)
  int64_t skipped_steps = 0;  // FP16: steps skipped for overflow so far
};
RLHF_WIRE_STRUCT(StepFigures, "step figures", step, loss, grad_norm, lr, skipped, peak_tensor_bytes,
                 loss_scale, skipped_steps)
StepFigures step_figures(const engine::StepMetrics& metrics);

struct SaveReply {};
RLHF_WIRE_EMPTY(SaveReply, "save reply")

// The trainer's checkpoint into dir (engine::CheckpointOptions).
struct Save {
  static constexpr const char* kName = "save";
  using Reply = SaveReply;
  std::string dir;
  bool save_only_model = false;
  int max_num = 3;
};
RLHF_WIRE_STRUCT(Save, "save", dir, save_only_model, max_num)

struct LoadReply {
  int64_t step = 0;  // optimizer steps the checkpoint had done
};
RLHF_WIRE_STRUCT(LoadReply, "load reply", step)

struct Load {
  static constexpr const char* kName = "load";
  using Reply = LoadReply;
  std::string dir;
};
RLHF_WIRE_STRUCT(Load, "load", dir)

struct ExportHfReply {};
RLHF_WIRE_EMPTY(ExportHfReply, "export_hf reply")

// The trained model in the Hugging Face layout (a LoRA role: its PEFT adapter directory).
struct ExportHf {
  static constexpr const char* kName = "export_hf";
  using Reply = ExportHfReply;
  std::string dir;
};
RLHF_WIRE_STRUCT(ExportHf, "export_hf", dir)

// What moving state to host memory freed, and the device allocator after it (GPU workers;
// 0 on CPU workers).
struct OffloadReply {
  int64_t offloaded_bytes = 0;
  double seconds = 0;
  int64_t cuda_allocated_bytes = 0;
  int64_t cuda_reserved_bytes = 0;
};
RLHF_WIRE_STRUCT(OffloadReply, "offload reply", offloaded_bytes, seconds, cuda_allocated_bytes,
                 cuda_reserved_bytes)

struct RestoreReply {
  int64_t restored_bytes = 0;
  double seconds = 0;
  int64_t cuda_allocated_bytes = 0;
  int64_t cuda_reserved_bytes = 0;
};
RLHF_WIRE_STRUCT(RestoreReply, "restore reply", restored_bytes, seconds, cuda_allocated_bytes,
                 cuda_reserved_bytes)

// The trainer's optimizer state to host memory while a colocated rollout generates, and
// back (Trainer::offload_optimizer_state). Every rank of the role calls it.
struct OffloadOptimizer {
  static constexpr const char* kName = "offload_optimizer";
  using Reply = OffloadReply;
};
RLHF_WIRE_EMPTY(OffloadOptimizer, "offload_optimizer")

struct RestoreOptimizer {
  static constexpr const char* kName = "restore_optimizer";
  using Reply = RestoreReply;
};
RLHF_WIRE_EMPTY(RestoreOptimizer, "restore_optimizer")

}  // namespace rlhf::ops
