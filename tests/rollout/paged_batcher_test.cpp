// The paged batcher on its own (rollout/paged_generation.h): which waiting prompts the next
// prefill admits under the sequence, block, watermark and micro-batch budgets, counted by
// hand; and that a run that preempts returns every block to the pool. Generation's outputs
// against the contiguous cache are generator_test's.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <vector>

#include "models/causal_lm.h"
#include "models/config.h"
#include "models/paged_kv_cache.h"
#include "rollout/paged_generation.h"

namespace rlhf::rollout {
namespace {

constexpr int64_t kBlock = 4;  // tokens per block in every test here

std::shared_ptr<models::CausalLM> tiny_model() {
  torch::set_num_threads(1);
  auto model = std::make_shared<models::CausalLM>(models::preset_config("tiny"));
  model->init_weights(3);
  model->eval();
  return model;
}

// Prompts of the given lengths (token ids 1..len).
std::vector<std::vector<int64_t>> prompts_of(const std::vector<int64_t>& lengths) {
  std::vector<std::vector<int64_t>> out;
  for (int64_t len : lengths) {
    std::vector<int64_t> p(static_cast<size_t>(len));
    for (int64_t i = 0; i < len; ++i) p[static_cast<size_t>(i)] = i + 1;
    out.push_back(p);
  }
  return out;
}

// The prompt indices admissible() would prefill next, with a fresh pool of `blocks` blocks.
std::vector<int64_t> admitted(const std::vector<int64_t>& lengths, int64_t blocks,
                              PagedBatcher::Limits limits) {
  auto model = tiny_model();
  models::PagedKvCache cache(model->config(), blocks, kBlock, torch::kFloat32);
  Sampler sampler(SamplingParams{}, static_cast<int64_t>(lengths.size()) * limits.n_samples);
  PagedBatcher batcher(*model, cache, sampler, nullptr, Generator::DecodeState{},
                       prompts_of(lengths), limits);
  std::vector<int64_t> out;
  for (const auto& w : batcher.admissible()) {
    EXPECT_EQ(w.row, -1);  // nothing was preempted: whole prompts only
    out.push_back(w.prompt);
  }
  // Asking changes nothing: every prompt still waits and every block is free.
  EXPECT_EQ(static_cast<int64_t>(batcher.waiting().size()), static_cast<int64_t>(lengths.size()));
  EXPECT_EQ(cache.free_blocks(), blocks);
  return out;
}

PagedBatcher::Limits limits(int64_t n, int64_t max_seqs, int64_t micro_batch, int64_t watermark) {
  PagedBatcher::Limits l;
  l.n_samples = n;
  l.max_new_tokens = 4;
  l.max_seqs = max_seqs;
  l.micro_batch_size = micro_batch;
  l.watermark = watermark;
  return l;
}

using Prompts = std::vector<int64_t>;

// Blocks of 4 tokens. Pool of 5, prompts of 8, 8 and 4 tokens (2, 2 and 1 blocks): the first
// takes 2 alone (5 free); the second needs 2 + watermark 1 <= 3 free; the third 1 + 1 > 1
// free. Without the watermark the third fits exactly.
TEST(PagedBatcher, AdmitsWhileTheFreeBlocksHoldThePromptAndTheWatermark) {
  EXPECT_EQ(admitted({8, 8, 4}, 5, limits(1, 10, 8, 1)), (Prompts{0, 1}));
  EXPECT_EQ(admitted({8, 8, 4}, 5, limits(1, 10, 8, 0)), (Prompts{0, 1, 2}));
  // Nothing runs: the first prompt may take the whole pool (2 blocks, no watermark).
  EXPECT_EQ(admitted({8}, 2, limits(1, 10, 8, 1)), (Prompts{0}));
  // First come, first served: a prompt of 16 tokens (4 blocks) does not fit 3, and the
  // 1-token prompt behind it waits too.
  EXPECT_EQ(admitted({16, 1}, 3, limits(1, 10, 8, 1)), (Prompts{}));
  EXPECT_EQ(admitted({12, 1}, 3, limits(1, 10, 8, 1)), (Prompts{0}));
}

// A prompt counts its n samples against max_num_seqs; a prefill takes at most
// micro_batch_size items.
TEST(PagedBatcher, AdmitsWithinMaxNumSeqsAndTheMicroBatch) {
  EXPECT_EQ(admitted({1, 1, 1}, 100, limits(4, 6, 8, 1)), (Prompts{0}));     // 4 + 4 > 6
  EXPECT_EQ(admitted({1, 1, 1}, 100, limits(4, 8, 8, 1)), (Prompts{0, 1}));  // 8 + 4 > 8
  EXPECT_EQ(admitted({1, 1, 1}, 100, limits(4, 12, 8, 1)), (Prompts{0, 1, 2}));
  EXPECT_EQ(admitted({1, 1, 1, 1, 1}, 100, limits(1, 10, 2, 1)), (Prompts{0, 1}));
}

// A pool of 8 blocks for 6 prompts x 2 samples of up to 5 + 12 tokens (5 blocks each at full
// length) must preempt; when the run ends nothing waits or runs, every block is back in the
// pool, every row has at least its first token, and the peak stays within the pool.
TEST(PagedBatcher, ARunThatPreemptsReturnsEveryBlock) {
  auto model = tiny_model();
  const int64_t blocks = 8, n = 2, R = 12, rows = 12;
  models::PagedKvCache cache(model->config(), blocks, kBlock, torch::kFloat32);
  SamplingParams params;
  params.seed = 4;
  Sampler sampler(params, rows);
  Generator::DecodeState out;
  out.uniforms = sampler.draws(0, rows, R);
  out.stop_ids = torch::tensor(std::vector<int64_t>{7}, torch::kInt64);
  out.tokens = torch::zeros({rows, R}, torch::kInt64);
  out.log_probs = torch::zeros({rows, R}, torch::kFloat32);
  out.lengths = torch::zeros({rows}, torch::kInt64);
  out.pad = torch::zeros({}, torch::kInt64);
  PagedBatcher::Limits l = limits(n, 6, 6, 1);
  l.max_new_tokens = R;
  l.block_bytes = models::PagedKvCache::block_bytes(model->config(), kBlock, torch::kFloat32);
  PagedBatcher batcher(*model, cache, sampler, nullptr, out, prompts_of({5, 3, 5, 2, 4, 5}), l);
  batcher.run(1);
  EXPECT_GT(batcher.timings().preempted, 0);
  EXPECT_TRUE(batcher.waiting().empty());
  EXPECT_TRUE(batcher.running().empty());
  EXPECT_EQ(cache.free_blocks(), blocks);
  EXPECT_GE(out.lengths.min().item<int64_t>(), 1);
  EXPECT_LE(out.lengths.max().item<int64_t>(), R);
  EXPECT_GT(batcher.timings().kv_peak_bytes, 0);
  EXPECT_LE(batcher.timings().kv_peak_bytes, blocks * l.block_bytes);
}

}  // namespace
}  // namespace rlhf::rollout
