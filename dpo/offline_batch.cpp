#include "dpo/offline_batch.h"

#include <algorithm>

namespace rlhf::dpo {

namespace {

// A row's tokens, which of them are response tokens, and the packed segment (example) each
// belongs to: the attention mask's value, 1 unless examples are packed.
struct Row {
  std::vector<int64_t> ids;
  std::vector<uint8_t> is_response;
  std::vector<int64_t> segment;

  void append(const std::vector<int64_t>& part, bool response, int64_t segment_id = 1) {
    ids.insert(ids.end(), part.begin(), part.end());
    is_response.insert(is_response.end(), part.size(), response ? 1 : 0);
    segment.insert(segment.end(), part.size(), segment_id);
  }
  // An example's prompt and response; a conversation's response trains only where its
  // response_mask says the model wrote the token.
  void append(const TokenizedExample& e, int64_t segment_id = 1) {
    append(e.prompt, false, segment_id);
    const size_t start = ids.size();
    append(e.response, true, segment_id);
    if (!e.response_mask.empty()) {
      TORCH_CHECK(e.response_mask.size() == e.response.size(), "response_mask has ",
                  e.response_mask.size(), " entries for ", e.response.size(), " tokens");
      std::copy(e.response_mask.begin(), e.response_mask.end(), is_response.begin() + start);
    }
  }
  int64_t segments() const { return segment.empty() ? 0 : segment.back(); }
};

RowTensors to_tensors(const std::vector<Row>& rows, int64_t pad_id) {
  int64_t t = 2;
  for (const auto& r : rows) t = std::max<int64_t>(t, static_cast<int64_t>(r.ids.size()));
  const int64_t n = static_cast<int64_t>(rows.size());
  RowTensors out;
  out.sequences = torch::full({n, t}, pad_id, torch::kLong);
  out.attention_mask = torch::zeros({n, t}, torch::kLong);
  out.loss_mask = torch::zeros({n, t - 1}, torch::kFloat32);
  auto seq = out.sequences.accessor<int64_t, 2>();
  auto att = out.attention_mask.accessor<int64_t, 2>();
  auto loss = out.loss_mask.accessor<float, 2>();
  for (int64_t i = 0; i < n; ++i) {
    const Row& r = rows[static_cast<size_t>(i)];
    for (size_t j = 0; j < r.ids.size(); ++j) {
      seq[i][static_cast<int64_t>(j)] = r.ids[j];
      att[i][static_cast<int64_t>(j)] = r.segment[j];
      // Position j-1 predicts token j: a loss term when token j is a response token.
      if (j >= 1 && r.is_response[j]) loss[i][static_cast<int64_t>(j) - 1] = 1.0f;
    }
  }
  return out;
}

}  // namespace

int64_t RowTensors::tokens() const {
  return (attention_mask != 0).sum().item<int64_t>();
}

RowTensors single_rows(const std::vector<const TokenizedExample*>& examples, int64_t pad_id) {
  std::vector<Row> rows(examples.size());
  for (size_t i = 0; i < examples.size(); ++i) {
    rows[i].append(*examples[i]);
  }
  return to_tensors(rows, pad_id);
}

RowTensors pair_rows(const std::vector<const TokenizedExample*>& examples, int64_t pad_id) {
  std::vector<Row> rows(2 * examples.size());
  for (size_t i = 0; i < examples.size(); ++i) {
    rows[2 * i].append(examples[i]->prompt, false);
    rows[2 * i].append(examples[i]->response, true);
    rows[2 * i + 1].append(examples[i]->prompt, false);
    rows[2 * i + 1].append(examples[i]->rejected, true);
  }
  return to_tensors(rows, pad_id);
}

RowTensors packed_rows(const std::vector<const TokenizedExample*>& examples, int64_t max_len,
                       int64_t row_multiple, int64_t pad_id) {
  // First fit, in order: each bin is the examples of one row.
  std::vector<std::vector<const TokenizedExample*>> bins;
  std::vector<size_t> used;  // tokens per bin
  for (const TokenizedExample* e : examples) {
    const size_t len = e->prompt.size() + e->response.size();
    size_t b = 0;
    while (b < bins.size() && used[b] + len > static_cast<size_t>(max_len)) ++b;
    if (b == bins.size()) {
      bins.emplace_back();
      used.push_back(0);
    }
    bins[b].push_back(e);
    used[b] += len;
  }
  const int64_t m = std::max<int64_t>(1, row_multiple);
  const int64_t total = std::max<int64_t>(1, (static_cast<int64_t>(bins.size()) + m - 1) / m * m);
  // Rows the multiple adds are filled by splitting the fullest bins first: an all-padding
  // micro batch would add a zero loss to the step's average and shrink its gradient.
  while (static_cast<int64_t>(bins.size()) < total) {
    auto most = std::max_element(bins.begin(), bins.end(),
                                 [](const auto& a, const auto& b) { return a.size() < b.size(); });
    if (most == bins.end() || most->size() < 2) break;
    const TokenizedExample* moved = most->back();
    most->pop_back();
    bins.push_back({moved});
  }
  // Fewer examples than rows: spread the real rows evenly among the filler ones. A filler
  // row attends to one pad token: a row with no attended token would make the attention
  // softmax all -inf (NaN), and NaN * 0 is still NaN in the loss.
  std::vector<Row> rows(static_cast<size_t>(total), Row{{pad_id}, {0}, {1}});
  const auto real = static_cast<int64_t>(bins.size());
  for (int64_t b = 0; b < real; ++b) {
    Row& row = rows[static_cast<size_t>(b * total / real)];
    row = Row{};
    int64_t segment = 0;
    for (const TokenizedExample* e : bins[static_cast<size_t>(b)]) {
      row.append(*e, ++segment);
    }
  }
  return to_tensors(rows, pad_id);
}

}  // namespace rlhf::dpo
