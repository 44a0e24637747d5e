// Golden tests of the PPO-family math: hand-checked cases, and random inputs against plain
// scalar loops written independently of the vectorised code. All FP32; tolerance 1e-5
// absolute unless stated (hand values were computed in double and rounded to 6 digits).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <random>

#include "ppo/advantages.h"
#include "ppo/kl.h"
#include "ppo/losses.h"
#include "ppo/reward_shaping.h"

namespace rlhf::ppo {
namespace {

constexpr double kTol = 1e-5;

torch::Tensor t2(std::vector<std::vector<float>> rows) {
  std::vector<float> flat;
  for (auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
  return torch::tensor(flat).reshape({static_cast<int64_t>(rows.size()), -1});
}

void expect_near(const torch::Tensor& got, const torch::Tensor& want, double tol = kTol) {
  ASSERT_EQ(got.sizes(), want.sizes());
  EXPECT_TRUE(torch::allclose(got.to(torch::kFloat64), want.to(torch::kFloat64), 0, tol))
      << "got\n"
      << got << "\nwant\n"
      << want;
}

TEST(Kl, EstimatorsTable) {
  auto lp = t2({{0.0f, -1.0f, 20.0f, -20.0f}});
  auto ref = torch::zeros_like(lp);
  expect_near(approx_kl(lp, ref, KlEstimator::kK1), t2({{0, -1, 10, -10}}));  // clamped
  expect_near(approx_kl(lp, ref, KlEstimator::kK2), t2({{0, 0.5f, 10, 10}}));
  // k3 = exp(-r) - 1 + r: r = -1 -> e - 2 = 0.718282; r = 20 -> 19 (>10, clamped).
  expect_near(approx_kl(lp, ref, KlEstimator::kK3), t2({{0, 0.718282f, 10, 10}}));
  EXPECT_THROW(parse_kl_estimator("k4"), std::exception);
}

TEST(Kl, AdaptiveControllerMatchesZieglerUpdate) {
  KlController adaptive(0.1, 6.0, 10000);
  adaptive.update(3.0, 512);  // error clipped to -0.2: 0.1 * (1 - 0.2 * 512 / 10000)
  EXPECT_NEAR(adaptive.value(), 0.098976, 1e-9);
  adaptive.update(6.6, 1000);  // error +0.1: * (1 + 0.1 * 0.1)
  EXPECT_NEAR(adaptive.value(), 0.098976 * 1.01, 1e-9);
  KlController fixed(0.1, 0.0, 10000);
  fixed.update(100.0, 512);
  EXPECT_EQ(fixed.value(), 0.1);
}

TEST(Kl, BatchKlIsTheMeanOfPerSequenceMeans) {
  // Row 0: tokens 1, 2 -> 1.5; row 1: token 4 -> 4; mean 2.75. (A token mean, 7 / 3 = 2.333,
  // is what the driver logged before; the masked-out 9s must not count.)
  auto kl = t2({{1, 2, 9}, {4, 9, 9}});
  auto mask = t2({{1, 1, 0}, {1, 0, 0}});
  EXPECT_NEAR(sequence_mean_kl(kl, mask), 2.75, kTol);
  // A sequence without action tokens counts as 0 (no NaN): (1.5 + 0) / 2.
  EXPECT_NEAR(sequence_mean_kl(kl, t2({{1, 1, 0}, {0, 0, 0}})), 0.75, kTol);
}

TEST(GroupBaseline, HandTable) {
  auto s = torch::tensor({1.0f, 2.0f, 3.0f, 4.0f});
  expect_near(apply_group_baseline(s, 2, AdvantageEstimator::kRloo),
              torch::tensor({-1.0f, 1.0f, -1.0f, 1.0f}));
  expect_near(apply_group_baseline(s, 2, AdvantageEstimator::kReinforceBaseline),
              torch::tensor({-0.5f, 0.5f, -0.5f, 0.5f}));
  expect_near(apply_group_baseline(s, 2, AdvantageEstimator::kDrGrpo),
              torch::tensor({-0.5f, 0.5f, -0.5f, 0.5f}));
  // GRPO: unbiased std of {1, 2} is 0.707107.
  expect_near(apply_group_baseline(s, 2, AdvantageEstimator::kGroupNorm),
              torch::tensor({-0.707107f, 0.707107f, -0.707107f, 0.707107f}));
  // RLOO with n = 3: r_i - mean of the other two.
  expect_near(apply_group_baseline(torch::tensor({1.0f, 2.0f, 6.0f}), 3, AdvantageEstimator::kRloo),
              torch::tensor({-3.0f, -1.5f, 4.5f}));
  // Identical scores give zero advantage under group_norm (std + 1e-9 guards 0/0).
  expect_near(apply_group_baseline(torch::tensor({1.0f, 1.0f}), 2, AdvantageEstimator::kGroupNorm),
              torch::tensor({0.0f, 0.0f}));
  expect_near(apply_group_baseline(s, 2, AdvantageEstimator::kGae), s);
}

TEST(GroupBaseline, AliasesAndProperties) {
  EXPECT_EQ(parse_advantage_estimator("grpo"), AdvantageEstimator::kGroupNorm);
  EXPECT_TRUE(uses_critic(AdvantageEstimator::kGae));
  EXPECT_FALSE(uses_critic(AdvantageEstimator::kRloo));
  EXPECT_TRUE(whitens_advantages(AdvantageEstimator::kReinforceBaseline));
  EXPECT_FALSE(whitens_advantages(AdvantageEstimator::kGroupNorm));
}

TEST(RewardShaping, ScoreAtLastActionTokenMinusKl) {
  auto mask = t2({{1, 1, 0}, {1, 1, 1}, {0, 1, 0}});
  auto idx = last_action_index(mask);
  EXPECT_EQ(idx[0].item<int64_t>(), 1);
  EXPECT_EQ(idx[1].item<int64_t>(), 2);
  EXPECT_EQ(idx[2].item<int64_t>(), 1);
  auto kl = t2({{0.1f, 0.2f, 0.0f}, {0.0f, 0.1f, 0.3f}, {0, 0, 0}});
  auto r = shape_rewards(torch::tensor({5.0f, -20.0f, 1.0f}), kl, mask, 0.5, -10, 10);
  // Row 1's score is clipped to -10.
  expect_near(r, t2({{-0.05f, 4.9f, 0.0f}, {0.0f, -0.05f, -10.15f}, {0, 1, 0}}));
}

TEST(Dapo, OverlongPenaltyTable) {
  // L_max 16, buffer 4: expected 12. len 10, 12 -> 0; 13 -> -1/4; 15 -> -3/4; 16 -> -1;
  // times factor 0.5. Buffer 0 is off.
  auto len = torch::tensor({10, 12, 13, 15, 16}, torch::kLong);
  expect_near(overlong_penalty(len, 16, 4, 0.5),
              torch::tensor({0.0f, 0.0f, -0.125f, -0.375f, -0.5f}));
  expect_near(overlong_penalty(len, 16, 0, 0.5), torch::zeros({5}));
  // A buffer of the whole budget: expected 0, every token counts, capped at the buffer.
  expect_near(overlong_penalty(len, 16, 16, 1.0),
              torch::tensor({-0.625f, -0.75f, -0.8125f, -0.9375f, -1.0f}));
  EXPECT_THROW(overlong_penalty(len, 16, 17, 1.0), std::exception);
}

TEST(Dapo, DynamicSamplingKeepsGroupsWithDistinctScores) {
  // Groups of 3: {1, 1, 1} no signal, {0, 1, 0} kept, {0, 0, 0} no signal, {0.5, 0.5, 0.25}
  // kept.
  auto s = torch::tensor({1.0f, 1.0f, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.5f, 0.5f, 0.25f});
  auto kept = groups_with_distinct_scores(s, 3);
  ASSERT_EQ(kept.numel(), 2);
  EXPECT_EQ(kept[0].item<int64_t>(), 1);
  EXPECT_EQ(kept[1].item<int64_t>(), 3);
  EXPECT_EQ(groups_with_distinct_scores(torch::ones({4}), 2).numel(), 0);
}

TEST(Gae, HandCases) {
  auto mask = t2({{1, 1}});
  auto ar = gae(t2({{0.5f, 0.25f}}), t2({{0, 1}}), mask, 1.0, 0.5);
  // t=1: delta = 1 - 0.25 = 0.75; t=0: delta = 0.25 - 0.5 = -0.25, A = -0.25 + 0.5*0.75.
  expect_near(ar.advantages, t2({{0.125f, 0.75f}}));
  expect_near(ar.returns, t2({{0.625f, 1.0f}}));
  ar = gae(t2({{0.5f, 0.25f}}), t2({{0, 1}}), mask, 0.9, 1.0);
  expect_near(ar.advantages, t2({{0.4f, 0.75f}}));
}

TEST(Returns, DiscountedAndMasked) {
  expect_near(cumulative_returns(t2({{1, 2, 3, 7}}), t2({{1, 1, 1, 0}}), 0.5),
              t2({{2.75f, 3.5f, 3.0f, 0.0f}}));
}

TEST(Whiten, MeanAndVarianceOverActionTokensOnly) {
  auto w = whiten(t2({{1, 2, 3, 100}}), t2({{1, 1, 1, 0}}));
  const float s = 1.224745f;  // 1 / sqrt(2/3)
  expect_near(w, t2({{-s, 0, s, 98 * s}}), 1e-4);
}

// Independent scalar references for random-input checks.
std::vector<double> row(const torch::Tensor& t, int64_t b) {
  auto r = t[b].to(torch::kFloat64).contiguous();
  return std::vector<double>(r.data_ptr<double>(), r.data_ptr<double>() + r.numel());
}

TEST(Gae, RandomInputsMatchScalarLoop) {
  torch::manual_seed(1);
  const int64_t B = 5, A = 9;
  auto values = torch::randn({B, A}), rewards = torch::randn({B, A});
  auto lengths = torch::randint(1, A + 1, {B});
  auto mask = (torch::arange(A).unsqueeze(0) < lengths.unsqueeze(1)).to(torch::kFloat32);
  const double gamma = 0.97, lambd = 0.9;
  auto ar = gae(values, rewards, mask, gamma, lambd);
  for (int64_t b = 0; b < B; ++b) {
    auto v = row(values, b), r = row(rewards, b), m = row(mask, b);
    std::vector<double> adv(A, 0.0);
    double next_adv = 0, next_v = 0;
    for (int64_t t = A - 1; t >= 0; --t) {
      double vt = v[t] * m[t], rt = r[t] * m[t];
      double delta = rt + gamma * next_v - vt;
      adv[t] = delta + gamma * lambd * next_adv;
      next_adv = adv[t];
      next_v = vt;
    }
    for (int64_t t = 0; t < A; ++t) {
      EXPECT_NEAR(ar.advantages[b][t].item<double>(), adv[t], 1e-4) << b << "," << t;
      EXPECT_NEAR(ar.returns[b][t].item<double>(), adv[t] + v[t] * m[t], 1e-4);
    }
  }
}

TEST(GroupBaseline, RandomInputsMatchScalarLoop) {
  torch::manual_seed(2);
  const int64_t P = 6, n = 4;
  auto scores = torch::randn({P * n});
  auto rloo = apply_group_baseline(scores, n, AdvantageEstimator::kRloo);
  auto grpo = apply_group_baseline(scores, n, AdvantageEstimator::kGroupNorm);
  auto s = row(scores.unsqueeze(0), 0);
  for (int64_t p = 0; p < P; ++p) {
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += s[p * n + i];
    double mean = sum / n, ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += (s[p * n + i] - mean) * (s[p * n + i] - mean);
    double std_unbiased = std::sqrt(ss / (n - 1));
    for (int64_t i = 0; i < n; ++i) {
      double x = s[p * n + i];
      EXPECT_NEAR(rloo[p * n + i].item<double>(), x - (sum - x) / (n - 1), 1e-5);
      EXPECT_NEAR(grpo[p * n + i].item<double>(), (x - mean) / (std_unbiased + 1e-9), 1e-4);
    }
  }
}

// Multi-turn trajectories (issue 31): the action mask has 0s between turns (the environment's
// tokens). A mask with interior gaps, and the tensors compacted to the model's tokens only.
struct Trajectories {
  torch::Tensor mask;                // [B, A] with gaps
  std::vector<torch::Tensor> where;  // per row: indices of its model tokens
};

Trajectories gapped_trajectories() {
  Trajectories t;
  t.mask = t2({{1, 1, 0, 0, 1, 1, 1, 0, 1, 0},
               {1, 0, 0, 0, 1, 1, 0, 0, 0, 0},
               {1, 1, 1, 1, 1, 1, 0, 0, 0, 0}});
  for (int64_t b = 0; b < t.mask.size(0); ++b) t.where.push_back(t.mask[b].nonzero().squeeze(1));
  return t;
}

// GAE over a trajectory equals GAE over its model tokens alone (veRL's multi-turn
// compute_gae_advantage_return skips the environment's tokens), and is 0 at the gaps; the
// same for discounted returns. FP32; 1e-5.
TEST(Gae, EnvironmentTokensAreSkippedAsIfAbsent) {
  const Trajectories t = gapped_trajectories();
  torch::manual_seed(4);
  const auto values = torch::randn(t.mask.sizes()), rewards = torch::randn(t.mask.sizes());
  const auto ar = gae(values, rewards, t.mask, 0.9, 0.8);
  const auto returns = cumulative_returns(rewards, t.mask, 0.7);
  for (int64_t b = 0; b < t.mask.size(0); ++b) {
    const auto idx = t.where[b];
    const auto ones = torch::ones({1, idx.size(0)});
    const auto compact = gae(values[b].index_select(0, idx).unsqueeze(0),
                             rewards[b].index_select(0, idx).unsqueeze(0), ones, 0.9, 0.8);
    expect_near(ar.advantages[b].index_select(0, idx), compact.advantages[0]);
    expect_near(ar.returns[b].index_select(0, idx), compact.returns[0]);
    expect_near(returns[b].index_select(0, idx),
                cumulative_returns(rewards[b].index_select(0, idx).unsqueeze(0), ones, 0.7)[0]);
  }
  expect_near(ar.advantages * (1 - t.mask), torch::zeros(t.mask.sizes()));
  expect_near(returns * (1 - t.mask), torch::zeros(t.mask.sizes()));
  // GRPO: every model token of a trajectory carries its group-normalised score.
  AdvantageConfig c;
  c.estimator = AdvantageEstimator::kGroupNorm;
  c.n_samples_per_prompt = 3;
  const auto scores = torch::tensor({1.0f, 0.0f, 0.5f});
  const auto out = compute_advantages(c, scores, {}, 0.0, {}, t.mask);
  const auto normed = (scores - scores.mean()) / (scores.std() + 1e-6);
  expect_near(out.advantages * t.mask, normed.unsqueeze(1) * t.mask, 1e-4);
}

// The losses ignore the environment's tokens: changing log-probs, old log-probs, values,
// returns, advantages and entropies there moves no loss, KL or entropy, and gives them no
// gradient (token and sequence aggregation, GSPO's sequence ratio).
TEST(PolicyLoss, EnvironmentTokensMoveNoLoss) {
  const Trajectories t = gapped_trajectories();
  torch::manual_seed(5);
  const auto off = 1 - t.mask;
  const auto lp = torch::randn(t.mask.sizes()) * 0.1 - 1,
             old = torch::randn(t.mask.sizes()) * 0.1 - 1;
  const auto adv = torch::randn(t.mask.sizes()), noise = torch::randn(t.mask.sizes()) * 5;
  for (PolicyRatio ratio : {PolicyRatio::kToken, PolicyRatio::kSequence}) {
    for (LossAggregation agg : {LossAggregation::kTokenMean, LossAggregation::kSeqMean}) {
      PolicyLossConfig c;
      c.ratio = ratio;
      c.aggregation = agg;
      const auto base = policy_loss(c, lp, old, adv, t.mask);
      auto moved_lp = (lp + noise * off).requires_grad_(true);
      const auto moved =
          policy_loss(c, moved_lp, old - 0.5 * noise * off, adv + noise * off, t.mask);
      EXPECT_NEAR(moved.loss.item<double>(), base.loss.item<double>(), kTol);
      EXPECT_NEAR(moved.approx_kl.item<double>(), base.approx_kl.item<double>(), kTol);
      moved.loss.backward();
      EXPECT_EQ((moved_lp.grad() * off).abs().max().item<double>(), 0.0);
      EXPECT_GT((moved_lp.grad() * t.mask).abs().max().item<double>(), 0.0);
    }
  }
  const auto v = torch::randn(t.mask.sizes()), ret = torch::randn(t.mask.sizes());
  EXPECT_NEAR(
      value_loss(v + noise * off, v, ret + noise * off, t.mask, 0.2, LossAggregation::kTokenMean)
          .item<double>(),
      value_loss(v, v, ret, t.mask, 0.2, LossAggregation::kTokenMean).item<double>(), kTol);
  const auto entropy = torch::rand(t.mask.sizes());
  EXPECT_NEAR(masked_entropy(entropy + noise.abs() * off, t.mask).item<double>(),
              masked_entropy(entropy, t.mask).item<double>(), kTol);
  const auto ref = torch::randn(t.mask.sizes()) * 0.1 - 1;
  const auto kl = approx_kl(lp, ref, KlEstimator::kK3) * t.mask;
  const auto kl_moved = approx_kl(lp + noise * off, ref, KlEstimator::kK3) * t.mask;
  EXPECT_NEAR(sequence_mean_kl(kl_moved, t.mask), sequence_mean_kl(kl, t.mask), kTol);
}

TEST(ComputeAdvantages, GrpoForcesGammaOneAndSkipsWhitening) {
  AdvantageConfig c;
  c.estimator = AdvantageEstimator::kGroupNorm;
  c.gamma = 0.5;  // ignored for group estimators, as OpenRLHF
  c.n_samples_per_prompt = 2;
  auto mask = t2({{1, 1, 1}, {1, 1, 0}, {1, 0, 0}, {1, 1, 1}});
  auto out = compute_advantages(c, torch::tensor({1.0f, 0.0f, 1.0f, 1.0f}), {}, 0.0, {}, mask);
  // Every action token of a row carries its group-normalised score (gamma 1, no KL).
  expect_near(
      out.advantages * mask,
      t2({{0.707107f, 0.707107f, 0.707107f}, {-0.707107f, -0.707107f, 0}, {0, 0, 0}, {0, 0, 0}}));
}

TEST(ComputeAdvantages, ReinforceBaselineIsOpenRlhfsReinforcePlusPlusBaseline) {
  // OpenRLHF's reinforce_baseline: r - mean of the prompt's group, gamma forced to 1, returns
  // as advantages, then whitened over every action token of the batch. Scores 1, 3 (one
  // prompt, n = 2): baselined -1, +1; row 0 has 2 tokens, row 1 one. Returns: -1, -1 | 1.
  // Mean -1/3, biased variance 8/9, std 0.942809: -0.707107, -0.707107 | 1.414214.
  AdvantageConfig c;
  c.estimator = AdvantageEstimator::kReinforceBaseline;
  c.gamma = 0.5;  // forced to 1, as OpenRLHF
  c.n_samples_per_prompt = 2;
  auto mask = t2({{1, 1}, {1, 0}});
  auto out = compute_advantages(c, torch::tensor({1.0f, 3.0f}), {}, 0.0, {}, mask);
  expect_near(out.advantages * mask, t2({{-0.707107f, -0.707107f}, {1.414214f, 0}}));
}

TEST(ComputeAdvantages, GaeWhitensOverActionTokens) {
  AdvantageConfig c;  // gae
  torch::manual_seed(3);
  auto mask = t2({{1, 1, 1, 0}, {1, 1, 1, 1}});
  auto out = compute_advantages(c, torch::tensor({1.0f, -1.0f}), torch::rand({2, 4}) * 0.1, 0.1,
                                torch::randn({2, 4}), mask);
  auto m = mask.to(torch::kBool);
  auto sel = out.advantages.masked_select(m);
  EXPECT_NEAR(sel.mean().item<double>(), 0.0, 1e-5);
  EXPECT_NEAR(sel.var(/*unbiased=*/false).item<double>(), 1.0, 1e-4);
}

TEST(PolicyLoss, ClippedSurrogateTable) {
  PolicyLossConfig c;  // eps 0.2
  auto mask = t2({{1}});
  auto lp = torch::full({1, 1}, std::log(1.5f));
  auto old = torch::zeros({1, 1});
  // ratio 1.5, A = +1: min(1.5, 1.2) = 1.2 -> loss -1.2, clipped.
  auto r = policy_loss(c, lp, old, t2({{1}}), mask);
  EXPECT_NEAR(r.loss.item<double>(), -1.2, kTol);
  EXPECT_NEAR(r.clip_frac.item<double>(), 1.0, kTol);
  EXPECT_NEAR(r.approx_kl.item<double>(), -std::log(1.5), kTol);
  // ratio 1.5, A = -1: min(-1.5, -1.2) = -1.5 -> loss 1.5, not clipped.
  r = policy_loss(c, lp, old, t2({{-1}}), mask);
  EXPECT_NEAR(r.loss.item<double>(), 1.5, kTol);
  EXPECT_NEAR(r.clip_frac.item<double>(), 0.0, kTol);
  // Separate clips: eps_high 0.4 lets ratio 1.5 through up to 1.4.
  c.clip_high = 0.4;
  EXPECT_NEAR(policy_loss(c, lp, old, t2({{1}}), mask).loss.item<double>(), -1.4, kTol);
  // Dual clip c = 3, ratio 5, A = -1: max(min(-5, -1.2), -3) = -3 -> loss 3.
  c = PolicyLossConfig{};
  c.dual_clip = 3.0;
  auto lp5 = torch::full({1, 1}, std::log(5.0f));
  EXPECT_NEAR(policy_loss(c, lp5, old, t2({{-1}}), mask).loss.item<double>(), 3.0, 1e-4);
}

TEST(PolicyLoss, TokenVersusSequenceAggregation) {
  // ratio 1 everywhere: per-token loss = -A.
  auto mask = t2({{1, 1, 0}, {1, 0, 0}});
  auto adv = t2({{-1, -2, -9}, {-3, -9, -9}});
  auto zeros = torch::zeros({2, 3});
  PolicyLossConfig c;
  EXPECT_NEAR(policy_loss(c, zeros, zeros, adv, mask).loss.item<double>(), 2.0, kTol);
  c.aggregation = LossAggregation::kSeqMean;
  EXPECT_NEAR(policy_loss(c, zeros, zeros, adv, mask).loss.item<double>(), 2.25, kTol);
}

TEST(PolicyLoss, DrGrpoConstantNormalisation) {
  // Same tokens as above: per-token loss 1, 2 | 3 on the action mask. Dr. GRPO (TRL
  // loss_type="dr_grpo"): sum 6 / (2 sequences x 4 = max_new_tokens) = 0.75, whatever the
  // responses' lengths.
  auto mask = t2({{1, 1, 0}, {1, 0, 0}});
  auto adv = t2({{-1, -2, -9}, {-3, -9, -9}});
  auto zeros = torch::zeros({2, 3});
  PolicyLossConfig c;
  c.aggregation = LossAggregation::kTokenSumNorm;
  c.norm_len = 4;
  EXPECT_NEAR(policy_loss(c, zeros, zeros, adv, mask).loss.item<double>(), 0.75, kTol);
  // Gradient of each token's log-prob: -A / (B x L) = -A / 8, the same weight for every
  // token (a token mean would give -A / 3, a sequence mean -A / (2 x length)).
  auto lp = zeros.clone().set_requires_grad(true);
  policy_loss(c, lp, zeros, adv, mask).loss.backward();
  expect_near(lp.grad(), t2({{0.125f, 0.25f, 0}, {0.375f, 0, 0}}));
  c.norm_len = 0;
  EXPECT_THROW(policy_loss(c, zeros, zeros, adv, mask), std::exception);
}

TEST(LossAggregation, AutoIsDrGrpoNormalisationOnlyForDrGrpo) {
  EXPECT_EQ(resolve_loss_aggregation("auto", "dr_grpo"), "token_sum_norm");
  EXPECT_EQ(resolve_loss_aggregation("auto", "group_norm"), "token_mean");
  EXPECT_EQ(resolve_loss_aggregation("auto", "gae"), "token_mean");
  EXPECT_EQ(resolve_loss_aggregation("seq_mean", "dr_grpo"), "seq_mean");
  EXPECT_EQ(parse_loss_aggregation("token_sum_norm"), LossAggregation::kTokenSumNorm);
  EXPECT_THROW(parse_loss_aggregation("auto"), std::exception);  // resolved before parsing
}

TEST(PolicyLoss, GspoSequenceRatioIsClippedPerSequence) {
  // Row 0: token log-ratios ln 1.5, ln 1.5 -> s = 1.5, A = +1: clipped to 1.2, loss -1.2 at
  // both tokens. Row 1: log-ratios 0.1, -0.1 (and a masked 5) -> s = exp(0) = 1, A = -1:
  // loss +1 at both tokens. Token mean: (-2.4 + 2) / 4 = -0.1. (Per-token PPO would clip
  // row 1's ratios e^0.1 = 1.105 and e^-0.1 = 0.905 nowhere and give a different value.)
  PolicyLossConfig c;
  c.ratio = PolicyRatio::kSequence;
  const float l15 = std::log(1.5f);
  auto lp = t2({{l15, l15, 0}, {0.1f, -0.1f, 5}}).set_requires_grad(true);
  auto old = torch::zeros({2, 3});
  auto adv = t2({{1, 1, 1}, {-1, -1, -1}});
  auto mask = t2({{1, 1, 0}, {1, 1, 0}});
  auto r = policy_loss(c, lp, old, adv, mask);
  EXPECT_NEAR(r.loss.item<double>(), -0.1, kTol);
  EXPECT_NEAR(r.clip_frac.item<double>(), 0.5, kTol);  // row 0's two tokens of four
  r.loss.backward();
  // Row 0 clipped: no gradient. Row 1: loss = (2 tokens x s) / 4 with ds/dlp_t = s / 2 = 0.5:
  // 0.25 per token; the masked token gets none.
  expect_near(lp.grad(), t2({{0, 0, 0}, {0.25f, 0.25f, 0}}));
  EXPECT_EQ(parse_policy_ratio("gspo"), PolicyRatio::kSequence);
  EXPECT_THROW(parse_policy_ratio("grpo"), std::exception);
}

TEST(PolicyLoss, GradientFlowsOnlyThroughUnclippedTokens) {
  PolicyLossConfig c;
  auto lp = torch::tensor({std::log(1.5f), 0.0f}).reshape({1, 2}).set_requires_grad(true);
  auto r = policy_loss(c, lp, torch::zeros({1, 2}), t2({{1, 1}}), t2({{1, 1}}));
  r.loss.backward();
  // Token 0 is clipped (zero gradient); token 1: d(-ratio * A / 2)/d lp = -0.5.
  EXPECT_NEAR(lp.grad()[0][0].item<double>(), 0.0, kTol);
  EXPECT_NEAR(lp.grad()[0][1].item<double>(), -0.5, kTol);
}

// Rollout/trainer mismatch, by hand. One row of 4 tokens (the last masked). The rollout
// sampled with log-probs behav = 0; the trainer's recomputed (old, AReaL's proximal) log-probs
// differ by ln 1 | ln 3 | ln 0.25 | 7, so pi_old / pi_rollout = 1 | 3 | 0.25 | e^7 (masked);
// the policy moved token 0 by ln 1.5 since. Advantages 1 | 1 | 2 | 5; eps 0.2; token mean.
struct MismatchCase {
  torch::Tensor behav = torch::zeros({1, 4});
  torch::Tensor old = t2({{0, std::log(3.0f), std::log(0.25f), 7}});
  torch::Tensor lp = t2({{std::log(1.5f), std::log(3.0f), std::log(0.25f), 7}});
  torch::Tensor adv = t2({{1, 1, 2, 5}});
  torch::Tensor mask = t2({{1, 1, 1, 0}});
};

TEST(RolloutCorrection, PolicyLossOfEachModeByHand) {
  MismatchCase k;
  PolicyLossConfig c;
  // Against old: r = 1.5 | 1 | 1. Token 0 clipped to 1.2: per-token loss -1.2 | -1 | -2.
  // none: (-1.2 - 1 - 2) / 3 = -1.4 (the behaviour log-probs are not read).
  EXPECT_NEAR(policy_loss(c, k.lp, k.old, k.adv, k.mask, k.behav).loss.item<double>(), -1.4, kTol);
  // tis, C = 2: w = 1 | min(3, 2) | 0.25: (-1.2 - 2 - 0.5) / 3 = -1.233333.
  c.correction.mode = RolloutCorrection::kTis;
  auto lp = k.lp.clone().set_requires_grad(true);
  auto r = policy_loss(c, lp, k.old, k.adv, k.mask, k.behav);
  EXPECT_NEAR(r.loss.item<double>(), -1.233333, kTol);
  EXPECT_NEAR(r.clip_frac.item<double>(), 1.0 / 3, kTol);
  // The weight is a constant: d loss / d lp_t = -w_t r_t A_t / 3 where unclipped.
  r.loss.backward();
  expect_near(lp.grad(), t2({{0, -0.666667f, -0.166667f, 0}}));
  // decoupled (AReaL): w = 1 | 3 | 0.25 untruncated: (-1.2 - 3 - 0.5) / 3 = -1.566667.
  c.correction.mode = RolloutCorrection::kDecoupled;
  lp = k.lp.clone().set_requires_grad(true);
  r = policy_loss(c, lp, k.old, k.adv, k.mask, k.behav);
  EXPECT_NEAR(r.loss.item<double>(), -1.566667, kTol);
  r.loss.backward();
  expect_near(lp.grad(), t2({{0, -1, -0.166667f, 0}}));
  // Clipping against the rollout instead (today's async_steps 1 without a correction): token
  // 1's ratio 3 is clipped to 1.2 and loses its gradient, token 2's is 0.25:
  // (-1.2 - 1.2 - 0.5) / 3 = -0.966667. The decoupled objective clips against pi_prox.
  c.correction.mode = RolloutCorrection::kNone;
  lp = k.lp.clone().set_requires_grad(true);
  r = policy_loss(c, lp, k.behav, k.adv, k.mask);
  EXPECT_NEAR(r.loss.item<double>(), -0.966667, kTol);
  r.loss.backward();
  expect_near(lp.grad(), t2({{0, 0, -0.166667f, 0}}));
  // A correction without the rollout's log-probs is a programming error.
  c.correction.mode = RolloutCorrection::kTis;
  EXPECT_THROW(policy_loss(c, k.lp, k.old, k.adv, k.mask), std::exception);
}

TEST(RolloutCorrection, WeightsAndMismatchFigures) {
  MismatchCase k;
  RolloutCorrectionConfig c;
  // Masked tokens get weight 1 (e^7 would otherwise reach the loss as inf * 0 in worse cases).
  expect_near(rollout_correction_weights(c, k.old, k.behav, k.mask), t2({{1, 1, 1, 1}}));
  c.mode = RolloutCorrection::kTis;
  expect_near(rollout_correction_weights(c, k.old, k.behav, k.mask), t2({{1, 2, 0.25f, 1}}));
  c.cap = 5;
  expect_near(rollout_correction_weights(c, k.old, k.behav, k.mask), t2({{1, 3, 0.25f, 1}}));
  c.cap = 2;
  // k3 = r - 1 - ln r at r = 1 | 3 | 0.25: (0 + 0.901388 + 0.636294) / 3 = 0.512561.
  auto m = measure_rollout_mismatch(c, k.old, k.behav, k.mask);
  EXPECT_NEAR(m.kl, 0.512561, kTol);
  EXPECT_NEAR(m.weight_mean, 3.25 / 3, kTol);
  EXPECT_NEAR(m.weight_max, 2.0, kTol);
  EXPECT_NEAR(m.truncated, 1.0 / 3, kTol);
  c.mode = RolloutCorrection::kDecoupled;
  m = measure_rollout_mismatch(c, k.old, k.behav, k.mask);
  EXPECT_NEAR(m.kl, 0.512561, kTol);
  EXPECT_NEAR(m.weight_mean, 4.25 / 3, kTol);
  EXPECT_NEAR(m.weight_max, 3.0, kTol);
  EXPECT_EQ(m.truncated, 0.0);
  c.mode = RolloutCorrection::kNone;
  m = measure_rollout_mismatch(c, k.old, k.behav, k.mask);
  EXPECT_NEAR(m.kl, 0.512561, kTol);
  EXPECT_EQ(m.weight_mean, 1.0);
  // Identical engines: no mismatch at all.
  EXPECT_EQ(measure_rollout_mismatch(c, k.old, k.old, k.mask).kl, 0.0);
  // The on-policy BF16 gap is ~1e-4 nats a token: k3 = e^x - 1 - x = 5.000167e-9 at x = 1e-4
  // must not drown in FP32 rounding (6e-8 near 1). FP64 inputs; tolerance 1e-13.
  auto opt = torch::TensorOptions().dtype(torch::kFloat64);
  auto m64 = measure_rollout_mismatch(c, torch::full({1, 2}, 1e-4, opt), torch::zeros({1, 2}, opt),
                                      torch::ones({1, 2}));
  EXPECT_NEAR(m64.kl, std::expm1(1e-4) - 1e-4, 1e-13);
  EXPECT_GT(m64.kl, 4.99e-9);
  EXPECT_EQ(parse_rollout_correction("decoupled"), RolloutCorrection::kDecoupled);
  try {
    parse_rollout_correction("tiss");
    ADD_FAILURE() << "accepted tiss";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("algo.rollout_correction"), std::string::npos) << e.what();
  }
}

TEST(ValueLoss, ClippedAndPlain) {
  auto mask = t2({{1}});
  // V_clip = 0 + clip(1, -0.5, 0.5) = 0.5: max((0.5-2)^2, (1-2)^2) = 2.25; times 0.5.
  EXPECT_NEAR(value_loss(t2({{1}}), t2({{0}}), t2({{2}}), mask, 0.5, LossAggregation::kTokenMean)
                  .item<double>(),
              1.125, kTol);
  EXPECT_NEAR(value_loss(t2({{1}}), t2({{0}}), t2({{2}}), mask, 0.0, LossAggregation::kTokenMean)
                  .item<double>(),
              0.5, kTol);
}

TEST(ValueLoss, FollowsTheAggregationSetting) {
  // V = 0, no clip: squared errors 1, 9 | 4 on the action mask (the 7s are masked out).
  auto mask = t2({{1, 1, 0}, {1, 0, 0}});
  auto v = torch::zeros({2, 3});
  auto ret = t2({{1, 3, 7}, {2, 7, 7}});
  auto loss = [&](LossAggregation agg, int64_t len) {
    return value_loss(v, v, ret, mask, 0.0, agg, len).item<double>();
  };
  EXPECT_NEAR(loss(LossAggregation::kTokenMean, 0), 0.5 * 14.0 / 3.0, kTol);       // 2.333333
  EXPECT_NEAR(loss(LossAggregation::kSeqMean, 0), 0.5 * (5.0 + 4.0) / 2.0, kTol);  // 2.25
  EXPECT_NEAR(loss(LossAggregation::kTokenSumNorm, 4), 0.5 * 14.0 / 8.0, kTol);    // 0.875
}

}  // namespace
}  // namespace rlhf::ppo
