// The offline jobs' operations (DPO and its family, KTO, SFT, reward-model training) as
// typed requests and replies (transport/operation.h); the worker side is
// actors/offline_operations.cpp. Rows travel as tensors "sequences", "attention_mask" and
// "loss_mask" [N, T] (pair jobs: chosen and rejected interleaved).
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "dpo/losses.h"
#include "engine/worker_ops.h"
#include "transport/operation.h"

namespace rlhf::dpo {
// The loss configs on the wire, the loss type by its spec name.
void to_json(nlohmann::json& j, const DpoLossConfig& c);
void from_json(const nlohmann::json& j, DpoLossConfig& c);
RLHF_WIRE_STRUCT(KtoLossConfig, "kto loss", beta, desirable_weight, undesirable_weight)
}  // namespace rlhf::dpo

namespace rlhf::ops {

// Which rows a forward works on: all of them (a scatter's micro batch), or with rank_share
// this rank's share of the request (a call_all on a trained, possibly ZeRO-3, group), in
// chunks of `chunk` rows (0: all at once).
struct RowSelection {
  bool rank_share = false;
  int64_t chunk = 0;
};
RLHF_WIRE_STRUCT(RowSelection, "rows", rank_share, chunk)

struct SequenceLogProbsReply {};  // tensors "log_probs" [N] (sums over the response), "tokens"
RLHF_WIRE_EMPTY(SequenceLogProbsReply, "sequence_log_probs reply")

// Each row's response log-prob sum; with `reference`, with the LoRA adapters off (a LoRA
// actor is its own reference).
struct SequenceLogProbs {
  static constexpr const char* kName = "sequence_log_probs";
  using Reply = SequenceLogProbsReply;
  RowSelection rows;
  bool reference = false;
};
RLHF_WIRE_STRUCT(SequenceLogProbs, "sequence_log_probs", rows, reference)

struct SequenceScoresReply {};  // tensor "scores" [N] FP32
RLHF_WIRE_EMPTY(SequenceScoresReply, "sequence_scores reply")

// A reward model's score of each row (its value head at the last attended token).
struct SequenceScores {
  static constexpr const char* kName = "sequence_scores";
  using Reply = SequenceScoresReply;
  RowSelection rows;
};
RLHF_WIRE_STRUCT(SequenceScores, "sequence_scores", rows)

// An offline optimizer step: the trainer's figures, the rows this rank trained, and the
// means over its micro batches of the loss's own figures (accuracy, margins, kl, tokens).
struct OfflineStepReply {
  StepFigures metrics;
  int64_t rows = 0;
  std::map<std::string, double> means;
};
RLHF_WIRE_STRUCT(OfflineStepReply, "offline step reply", metrics, rows, means)

// Every offline train step walks this rank's share of the request in grad_accum_steps
// micro batches of micro_batch_size units (pairs for pair jobs).
// train_dpo: tensor "ref_log_probs" [N] (absent for simpo and orpo).
struct TrainDpo {
  static constexpr const char* kName = "train_dpo";
  using Reply = OfflineStepReply;
  int64_t micro_batch_size = 0;
  dpo::DpoLossConfig loss;
};
RLHF_WIRE_STRUCT(TrainDpo, "train_dpo", micro_batch_size, loss)

// train_kto: rows interleaved (labelled row, mismatched KL row); tensors "ref_log_probs" [N]
// and "desirable" [N/2].
struct TrainKto {
  static constexpr const char* kName = "train_kto";
  using Reply = OfflineStepReply;
  int64_t micro_batch_size = 0;
  dpo::KtoLossConfig loss;
};
RLHF_WIRE_STRUCT(TrainKto, "train_kto", micro_batch_size, loss)

// train_sft: the mean NLL of the response tokens.
struct TrainSft {
  static constexpr const char* kName = "train_sft";
  using Reply = OfflineStepReply;
  int64_t micro_batch_size = 0;
};
RLHF_WIRE_STRUCT(TrainSft, "train_sft", micro_batch_size)

// train_rm: rows interleaved chosen/rejected; optional tensor "margin" [N/2].
struct TrainRm {
  static constexpr const char* kName = "train_rm";
  using Reply = OfflineStepReply;
  int64_t micro_batch_size = 0;
  dpo::RmLossType loss = dpo::RmLossType::kSigmoid;
};
void to_json(nlohmann::json& j, const TrainRm& r);
void from_json(const nlohmann::json& j, TrainRm& r);

}  // namespace rlhf::ops
