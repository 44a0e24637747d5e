// Token rows of offline jobs (layout, loss masks, packing) and the reference log-prob
// cache (keys follow content, store/find round trip, damaged files are misses).
#include "dpo/offline_batch.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "dpo/ref_cache.h"
#include "test_paths.h"

namespace rlhf::dpo {
namespace {

namespace fs = std::filesystem;

std::vector<int64_t> row(const torch::Tensor& t, int64_t i) {
  torch::Tensor r = t[i].to(torch::kLong).contiguous();
  return {r.data_ptr<int64_t>(), r.data_ptr<int64_t>() + r.numel()};
}

TEST(OfflineBatch, PairRowsInterleaveAndMaskOnlyResponseTokens) {
  TokenizedExample a{{1, 2}, {3, 4, 5}, {6}};
  TokenizedExample b{{7}, {8}, {9, 10, 11, 12}};
  RowTensors r = pair_rows({&a, &b}, /*pad_id=*/0);
  ASSERT_EQ(r.sequences.sizes(), (std::vector<int64_t>{4, 5}));  // longest row: 7 + 9..12
  EXPECT_EQ(row(r.sequences, 0), (std::vector<int64_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(row(r.sequences, 1), (std::vector<int64_t>{1, 2, 6, 0, 0}));
  EXPECT_EQ(row(r.sequences, 2), (std::vector<int64_t>{7, 8, 0, 0, 0}));
  EXPECT_EQ(row(r.sequences, 3), (std::vector<int64_t>{7, 9, 10, 11, 12}));
  EXPECT_EQ(row(r.attention_mask, 1), (std::vector<int64_t>{1, 1, 1, 0, 0}));
  // loss_mask[t] = 1 when token t+1 is a response token: [N, T-1].
  ASSERT_EQ(r.loss_mask.sizes(), (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(row(r.loss_mask, 0), (std::vector<int64_t>{0, 1, 1, 1}));
  EXPECT_EQ(row(r.loss_mask, 1), (std::vector<int64_t>{0, 1, 0, 0}));
  EXPECT_EQ(row(r.loss_mask, 2), (std::vector<int64_t>{1, 0, 0, 0}));
  EXPECT_EQ(row(r.loss_mask, 3), (std::vector<int64_t>{1, 1, 1, 1}));
  EXPECT_EQ(r.tokens(), 5 + 3 + 2 + 5);
}

// SFT conversations (data.multiturn): only the model's tokens of the response carry loss, in
// single rows and packed rows alike; the tool's turn (5, 6) is context.
TEST(OfflineBatch, ConversationResponseMaskKeepsTheLossOnTheModelsTokens) {
  TokenizedExample conv{{1, 2}, {3, 4, 5, 6, 7, 8}, {}};
  conv.response_mask = {1, 1, 0, 0, 1, 1};
  TokenizedExample plain{{9}, {10, 11}, {}};
  RowTensors r = single_rows({&conv, &plain}, /*pad_id=*/0);
  EXPECT_EQ(row(r.loss_mask, 0), (std::vector<int64_t>{0, 1, 1, 0, 0, 1, 1}));
  EXPECT_EQ(row(r.loss_mask, 1), (std::vector<int64_t>{1, 1, 0, 0, 0, 0, 0}));
  r = packed_rows({&plain, &conv}, 16, 1, /*pad_id=*/0);
  ASSERT_EQ(r.rows(), 1);
  EXPECT_EQ(row(r.sequences, 0), (std::vector<int64_t>{9, 10, 11, 1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(row(r.loss_mask, 0), (std::vector<int64_t>{1, 1, 0, 0, 1, 1, 0, 0, 1, 1}));
  TokenizedExample bad{{1}, {2, 3}, {}};
  bad.response_mask = {1};
  EXPECT_THROW(single_rows({&bad}, 0), c10::Error);
}

TEST(OfflineBatch, PackedRowsFitExamplesAndPadTheRowCount) {
  TokenizedExample a{{1, 2}, {3, 4}, {}}, b{{5}, {6, 7}, {}}, c{{8, 9, 10}, {11}, {}};
  // max_len 7: a (4) + b (3) share a row, c (4) starts the next; 2 rows are a multiple of 2.
  RowTensors r = packed_rows({&a, &b, &c}, 7, 2, /*pad_id=*/0);
  ASSERT_EQ(r.rows(), 2);
  EXPECT_EQ(row(r.sequences, 0), (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(row(r.loss_mask, 0), (std::vector<int64_t>{0, 1, 1, 0, 1, 1}));
  EXPECT_EQ(row(r.sequences, 1), (std::vector<int64_t>{8, 9, 10, 11, 0, 0, 0}));
  EXPECT_EQ(row(r.loss_mask, 1), (std::vector<int64_t>{0, 0, 1, 0, 0, 0}));
  // The attention mask numbers the examples of a row: a is segment 1, b segment 2.
  EXPECT_EQ(row(r.attention_mask, 0), (std::vector<int64_t>{1, 1, 1, 1, 2, 2, 2}));
  EXPECT_EQ(row(r.attention_mask, 1), (std::vector<int64_t>{1, 1, 1, 1, 0, 0, 0}));
  EXPECT_EQ(r.tokens(), 7 + 4);

  // A multiple of 4: the shared row is split first (every example gets a row of its own),
  // then one filler row, after the real ones.
  r = packed_rows({&a, &b, &c}, 7, 4, /*pad_id=*/0);
  ASSERT_EQ(r.rows(), 4);
  EXPECT_EQ(row(r.sequences, 0), (std::vector<int64_t>{1, 2, 3, 4}));
  EXPECT_EQ(row(r.sequences, 1), (std::vector<int64_t>{8, 9, 10, 11}));
  EXPECT_EQ(row(r.sequences, 2), (std::vector<int64_t>{5, 6, 7, 0}));
  // Filler rows attend to one pad token (no all-masked softmax) and carry no loss.
  EXPECT_EQ(row(r.attention_mask, 3), (std::vector<int64_t>{1, 0, 0, 0}));
  EXPECT_EQ(r.loss_mask[3].sum().item<float>(), 0.0f);

  // Two examples over 4 rows: real rows spread out (rows 0 and 2), so two micro batches of
  // two rows both hold one example rather than one holding only padding.
  r = packed_rows({&a, &c}, 7, 4, /*pad_id=*/0);
  ASSERT_EQ(r.rows(), 4);
  EXPECT_GT(r.loss_mask[0].sum().item<float>(), 0.0f);
  EXPECT_EQ(r.loss_mask[1].sum().item<float>(), 0.0f);
  EXPECT_GT(r.loss_mask[2].sum().item<float>(), 0.0f);
  EXPECT_EQ(r.loss_mask[3].sum().item<float>(), 0.0f);
}

TEST(RefCache, KeyFollowsRowsAndModel) {
  TokenizedExample a{{1, 2}, {3, 4}, {5}};
  TokenizedExample a2{{1, 2}, {3, 4}, {6}};
  const std::string k = rows_key(pair_rows({&a}, 0), "m|bf16");
  EXPECT_EQ(k, rows_key(pair_rows({&a}, 0), "m|bf16"));
  EXPECT_NE(k, rows_key(pair_rows({&a2}, 0), "m|bf16"));  // one token differs
  EXPECT_NE(k, rows_key(pair_rows({&a}, 0), "m|fp32"));   // another reference model
}

TEST(RefCache, StoreThenFindAndDamagedFilesAreMisses) {
  const fs::path dir =
      fs::path(RLHF_BINARY_DIR) / "test-runs" / ("ref-cache-" + std::to_string(getpid()));
  fs::remove_all(dir);
  RefLogProbCache cache(dir.string());
  EXPECT_FALSE(cache.find("abc", 4).has_value());
  torch::Tensor lp = torch::tensor({-1.5f, -2.25f, -0.5f, -3.0f});
  cache.store("abc", lp, {{"split", "train"}});
  auto hit = cache.find("abc", 4);
  ASSERT_TRUE(hit.has_value());
  EXPECT_TRUE(torch::equal(*hit, lp));             // exact: FP32 stored as is
  EXPECT_FALSE(cache.find("abc", 5).has_value());  // row count differs: not this dataset
  std::ofstream(cache.file("abc"), std::ios::trunc) << "garbage";
  EXPECT_FALSE(cache.find("abc", 4).has_value());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace rlhf::dpo
