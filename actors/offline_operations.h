// The offline-training operations of a model worker (dpo, sft and rm jobs), registered on
// the same ModelRole as the PPO operations:
//   sequence_log_probs  per-row sums of response-token log-probs and the token counts (the
//                       reference pass of DPO; held-out evaluation and SFT eval loss)
//   sequence_scores     per-row reward (value head at each row's last token)
//   train_dpo           one optimizer step of a DPO-family loss on interleaved pairs
//   train_kto           one optimizer step of KTO on (labelled row, mismatched KL row) pairs
//   train_sft           one optimizer step of the masked next-token loss
//   train_rm            one optimizer step of the pairwise reward-model loss
// Batch layout (built by the driver, dpo/offline_batch.h): sequences [N, T] right-padded,
// attention_mask [N, T], loss_mask [N, T-1] (1 where token t+1 is a response token); pair
// jobs interleave rows: 2i = chosen, 2i+1 = rejected. Data loading stays with the driver.
#pragma once

#include <memory>

#include "actors/model_operations.h"
#include "actors/operation_registry.h"

namespace rlhf {

void add_offline_operations(OperationRegistry& registry, std::shared_ptr<ModelRole> role);

}  // namespace rlhf
