// Token rows for offline jobs (dpo, sft, rm): tokenized examples in, the tensors the
// workers' offline operations read out (actors/offline_operations.h has the layout).
// Rows are right-padded to the longest row of the batch; pair jobs interleave chosen and
// rejected rows. Packing several SFT examples per row is here too. No tokenizer, no I/O.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <vector>

namespace rlhf::dpo {

// One prompt with one response (SFT) or two (preference pair), as token ids; the
// response already ends with EOS when the tokenizer has one.
struct TokenizedExample {
  std::vector<int64_t> prompt;
  std::vector<int64_t> response;  // sft: the target; pairs: the chosen response
  std::vector<int64_t> rejected;  // pairs only
  double margin = 0.0;            // pairs: reward-model margin (data.margin_key)
  bool desirable = true;          // kto: the row's label (its `rejected` is a KL row's response)
  // sft conversations (data.multiturn): 1 where a response token is the model's (an assistant
  // turn and its end-of-turn token), 0 where a tool or user turn wrote it (context, no loss),
  // as the rollout's action mask. Empty: every response token is trained.
  std::vector<uint8_t> response_mask;
};

struct RowTensors {
  torch::Tensor sequences;       // [N, T] int64 prompt + response, right-padded with pad_id
  torch::Tensor attention_mask;  // [N, T] int64: 0 padding, k >= 1 the k-th example of the row
  torch::Tensor loss_mask;       // [N, T-1] float: 1 where token t+1 is a response token

  int64_t rows() const { return sequences.size(0); }
  int64_t tokens() const;  // attended tokens in all rows
};

// One row per example (its prompt + response). T = the longest row (at least 2).
RowTensors single_rows(const std::vector<const TokenizedExample*>& examples, int64_t pad_id);
// Two rows per example: 2i = prompt + chosen, 2i+1 = prompt + rejected.
RowTensors pair_rows(const std::vector<const TokenizedExample*>& examples, int64_t pad_id);
// Examples laid end to end in rows of at most `max_len` tokens (first fit, in order); the
// row count is rounded up to a multiple of `row_multiple` by splitting the fullest rows
// (every row holds an example while there are enough), else with empty rows (all padding,
// no loss) spread evenly between the real ones.
// The loss mask covers each example's response tokens only (its response_mask's ones). The
// attention mask numbers the examples of a row 1, 2, ... so the model keeps them apart: each
// attends only to itself and its positions restart at 0 (a block-diagonal causal mask), which gives
// every example the same loss as on a row of its own.
RowTensors packed_rows(const std::vector<const TokenizedExample*>& examples, int64_t max_len,
                       int64_t row_multiple, int64_t pad_id);

}  // namespace rlhf::dpo
