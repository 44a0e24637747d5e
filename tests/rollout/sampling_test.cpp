// Sampling on fixed logits: warper semantics (top-k, top-p), the statistics of the draws,
// reproducibility per (seed, row), and parameter validation.
#include "rollout/sampling.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <vector>

#include "core/errors.h"

namespace rlhf::rollout {
namespace {

// Probabilities of 10 tokens, placed in a shuffled order so that sorting matters.
const std::vector<double> kProbs = {0.3, 0.2, 0.15, 0.1, 0.08, 0.07, 0.05, 0.03, 0.01, 0.01};
const std::vector<int64_t> kPlace = {7, 2, 9, 0, 5, 3, 8, 1, 6, 4};  // kProbs[i] is token kPlace[i]

torch::Tensor fixed_logits(int64_t rows) {
  auto logits = torch::empty({10}, torch::kFloat32);
  for (size_t i = 0; i < kProbs.size(); ++i)
    logits[kPlace[i]] = std::log(kProbs[i]) + 3.0;  // shift: irrelevant
  return logits.unsqueeze(0).repeat({rows, 1});
}

std::vector<int64_t> all_rows(int64_t n) {
  std::vector<int64_t> r(n);
  for (int64_t i = 0; i < n; ++i) r[i] = i;
  return r;
}

// Draws `rows` x `calls` tokens and counts them per token id.
std::vector<int64_t> histogram(const SamplingParams& params, int64_t rows, int64_t calls) {
  Sampler sampler(params, rows);
  std::vector<int64_t> counts(10, 0);
  auto logits = fixed_logits(rows);
  for (int64_t c = 0; c < calls; ++c) {
    auto tokens = sampler.sample(logits, all_rows(rows)).tokens;
    for (int64_t i = 0; i < rows; ++i) ++counts[tokens[i].item<int64_t>()];
  }
  return counts;
}

// Pearson's chi-square of `counts` against `expected` probabilities over the tokens listed.
double chi_square(const std::vector<int64_t>& counts,
                  const std::vector<std::pair<int64_t, double>>& expected, int64_t total) {
  double chi = 0;
  for (const auto& [token, p] : expected) {
    const double e = p * static_cast<double>(total);
    chi += (counts[token] - e) * (counts[token] - e) / e;
  }
  return chi;
}

TEST(Sampling, TopPKeepsTheSmallestNucleusAndMatchesItsRenormalisedDistribution) {
  SamplingParams params;
  params.top_p = 0.6;  // masses before each sorted token: 0, .3, .5, .65 -> keep the first three
  params.seed = 11;
  const int64_t rows = 2000, calls = 10, total = rows * calls;
  auto counts = histogram(params, rows, calls);
  // Outside the nucleus the probability is exactly 0: not a single draw may land there.
  for (size_t i = 3; i < kProbs.size(); ++i)
    EXPECT_EQ(counts[kPlace[i]], 0) << "token " << kPlace[i];
  const double mass = 0.3 + 0.2 + 0.15;
  std::vector<std::pair<int64_t, double>> expected = {
      {kPlace[0], 0.3 / mass}, {kPlace[1], 0.2 / mass}, {kPlace[2], 0.15 / mass}};
  // 2 degrees of freedom: P(chi2 > 13.82) = 0.001 for a correct sampler. The seed is fixed,
  // so this is deterministic; the bound says how far off a correct sampler could be.
  EXPECT_LT(chi_square(counts, expected, total), 13.82);
  // The returned log-probs are those of the renormalised nucleus.
  auto lp = sampling_log_probs(fixed_logits(1), params)[0];
  for (const auto& [token, p] : expected) EXPECT_NEAR(lp[token].item<double>(), std::log(p), 1e-5);
  EXPECT_TRUE(std::isinf(lp[kPlace[3]].item<double>()));
}

TEST(Sampling, PlainSamplingMatchesTheModelDistribution) {
  SamplingParams params;  // temperature 1, no top-k/top-p
  params.seed = 3;
  const int64_t rows = 2000, calls = 10, total = rows * calls;
  auto counts = histogram(params, rows, calls);
  std::vector<std::pair<int64_t, double>> expected;
  for (size_t i = 0; i < kProbs.size(); ++i) expected.push_back({kPlace[i], kProbs[i]});
  EXPECT_LT(chi_square(counts, expected, total), 27.88);  // 9 degrees of freedom, p = 0.001
}

TEST(Sampling, TopKNeverLeavesTheKMostLikely) {
  SamplingParams params;
  params.top_k = 2;
  params.temperature = 3.0;  // flatten, so the tail would be drawn often without top-k
  params.seed = 5;
  auto counts = histogram(params, 500, 4);
  EXPECT_GT(counts[kPlace[0]], 0);
  EXPECT_GT(counts[kPlace[1]], 0);
  for (size_t i = 2; i < kProbs.size(); ++i)
    EXPECT_EQ(counts[kPlace[i]], 0) << "token " << kPlace[i];
}

TEST(Sampling, GreedyTakesTheArgmaxAndReportsTheModelLogProb) {
  SamplingParams params;
  params.temperature = 0.0;
  Sampler sampler(params, 3);
  auto out = sampler.sample(fixed_logits(3), all_rows(3));
  for (int64_t i = 0; i < 3; ++i) {
    EXPECT_EQ(out.tokens[i].item<int64_t>(), kPlace[0]);
    EXPECT_NEAR(out.log_probs[i].item<double>(), std::log(0.3), 1e-5);
  }
}

TEST(Sampling, SameSeedAndRowGiveTheSameDrawsWhateverTheBatch) {
  SamplingParams params;
  params.seed = 42;
  Sampler a(params, 8), b(params, 8);
  auto wide = a.sample(fixed_logits(8), all_rows(8)).tokens;
  // Row 5 alone, from a fresh sampler with the same seed: the same draw as in the batch.
  auto alone = b.sample(fixed_logits(1), {5}).tokens;
  EXPECT_EQ(alone[0].item<int64_t>(), wide[5].item<int64_t>());
  params.seed = 43;
  Sampler c(params, 8);
  auto other = c.sample(fixed_logits(8), all_rows(8)).tokens;
  // 8 rows over a 10-token distribution: equal by chance with probability < 0.3^8.
  EXPECT_FALSE(torch::equal(other, wide));
}

TEST(Sampling, BadParametersAreInputErrors) {
  SamplingParams p;
  p.top_p = 0.0;
  EXPECT_THROW(p.validate(), InputError);
  p = {};
  p.top_k = 0;
  EXPECT_THROW(p.validate(), InputError);
  p = {};
  p.temperature = -1;
  EXPECT_THROW(Sampler(p, 1), InputError);
}

}  // namespace
}  // namespace rlhf::rollout
