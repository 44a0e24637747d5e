// Token-budget ranges and sequence packing; see token_budget.h.
#include "engine/token_budget.h"

#include <algorithm>

namespace rlhf::engine {

std::vector<RowRange> budget_ranges(int64_t rows, int64_t t, int64_t max_tokens, int64_t at_least) {
  const int64_t per = max_tokens > 0 ? std::max<int64_t>(1, max_tokens / std::max<int64_t>(1, t))
                                     : std::max<int64_t>(1, rows);
  std::vector<RowRange> out;
  for (int64_t b = 0; b < rows; b += per) out.push_back({b, std::min(rows, b + per)});
  const int64_t count = max_tokens > 0 ? (std::max(rows, at_least) + per - 1) / per : 1;
  while (static_cast<int64_t>(out.size()) < count) out.push_back({rows, rows});
  return out;
}

std::vector<RowRange> token_groups(const torch::Tensor& attention_mask, int64_t max_tokens) {
  TORCH_CHECK(attention_mask.dim() == 2, "token_groups: attention_mask must be [B, T], got ",
              attention_mask.sizes());
  const auto lengths = (attention_mask != 0).sum(1).to(torch::kCPU, torch::kLong).contiguous();
  const int64_t* len = lengths.data_ptr<int64_t>();
  const int64_t rows = lengths.size(0);
  std::vector<RowRange> out;
  int64_t begin = 0, tokens = 0;
  for (int64_t b = 0; b < rows; ++b) {
    if (b > begin && tokens + len[b] > max_tokens) {
      out.push_back({begin, b});
      begin = b;
      tokens = 0;
    }
    tokens += len[b];
  }
  if (rows > begin) out.push_back({begin, rows});
  return out;
}

PackedRows pack_rows(const torch::Tensor& sequences, const torch::Tensor& attention_mask,
                     int64_t action_len) {
  TORCH_CHECK(sequences.dim() == 2 && sequences.sizes() == attention_mask.sizes(),
              "pack_rows: sequences and attention_mask must be [n, T], got ", sequences.sizes(),
              " and ", attention_mask.sizes());
  const int64_t n = sequences.size(0), T = sequences.size(1);
  TORCH_CHECK(action_len >= 1 && action_len < T, "pack_rows: action_len must be in [1, T)");
  const torch::Tensor present = attention_mask != 0;                  // [n, T]
  const torch::Tensor lengths = present.sum(1);                       // [n]
  const torch::Tensor offsets = lengths.cumsum(0) - lengths;          // [n] row starts
  const torch::Tensor rank = present.to(torch::kLong).cumsum(1) - 1;  // [n, T]
  const torch::Tensor where = (offsets.unsqueeze(1) + rank).masked_fill(~present, 0);  // [n, T]
  PackedRows out;
  out.ids = sequences.masked_select(present).unsqueeze(0);  // row-major: row by row, in order
  const auto segment_of_row = torch::arange(1, n + 1, lengths.options().dtype(torch::kLong));
  out.segments = segment_of_row.repeat_interleave(lengths).unsqueeze(0);
  // The prediction of the token at packed position q is at q - 1 of the next-token results.
  const torch::Tensor actions = where.narrow(1, T - action_len, action_len);  // [n, A]
  out.action_index =
      (actions - 1).clamp_min(0).masked_fill(~present.narrow(1, T - action_len, action_len), 0);
  return out;
}

torch::Tensor unpack_actions(const torch::Tensor& packed, const PackedRows& rows,
                             const torch::Tensor& action_mask) {
  TORCH_CHECK(packed.dim() == 2 && packed.size(0) == 1, "unpack_actions: expected [1, L - 1], got ",
              packed.sizes());
  const torch::Tensor flat = packed.squeeze(0);
  torch::Tensor out =
      flat.index_select(0, rows.action_index.reshape({-1})).view(rows.action_index.sizes());
  return out.masked_fill(action_mask == 0, 0);
}

}  // namespace rlhf::engine
