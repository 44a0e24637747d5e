// Micro batches by token count (OpenRLHF's/veRL's dynamic batch size) and sequence packing
// (OpenRLHF's packing_samples): how a micro batch of padded rows is cut into forwards of at
// most a token budget, and how rows are packed end to end into one row of segments and
// their per-action results mapped back. It computes no losses and runs no model.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace rlhf::engine {

using RowRange = std::pair<int64_t, int64_t>;  // rows [first, second)

// Ranges of per = max(1, max_tokens / t) rows over `rows` rows of padded length t (one range
// of every row when max_tokens is 0), padded with empty ranges {rows, rows} up to the count
// `at_least` rows would need: every rank of a group whose forwards gather weights then runs
// the same number of forwards.
std::vector<RowRange> budget_ranges(int64_t rows, int64_t t, int64_t max_tokens,
                                    int64_t at_least = 0);

// Consecutive groups of rows whose tokens (attention_mask != 0, [B, T]) add up to at most
// max_tokens; a row longer than the budget is a group of its own.
std::vector<RowRange> token_groups(const torch::Tensor& attention_mask, int64_t max_tokens);

// Rows of a padded batch packed end to end into one row.
struct PackedRows {
  torch::Tensor ids;       // [1, L] int64: each row's tokens (attention_mask != 0), in order
  torch::Tensor segments;  // [1, L] int64: k for the tokens of the k-th row (1-based)
  // [n, A] int64: for each action position (the last A columns of the padded rows), the
  // index into the packed next-token results [L - 1] of the same prediction (0 where the
  // padded position holds no token).
  torch::Tensor action_index;
};

// sequences, attention_mask: [n, T] on any device; the last `action_len` columns are the
// actions. Positions follow the mask's running count, as the padded forward's do.
PackedRows pack_rows(const torch::Tensor& sequences, const torch::Tensor& attention_mask,
                     int64_t action_len);

// packed [1, L - 1] (next-token log-probs, or the values of the states before each next
// token) -> [n, A], 0 where `action_mask` [n, A] is 0.
torch::Tensor unpack_actions(const torch::Tensor& packed, const PackedRows& rows,
                             const torch::Tensor& action_mask);

}  // namespace rlhf::engine
