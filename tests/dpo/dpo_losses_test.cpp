// Golden tests of the DPO-family (DPO, cDPO, IPO, hinge, SimPO, ORPO, KTO), reward-model and SFT
// losses on hand-checked values (computed in double, rounded to 6 digits; FP32 tolerance 1e-5
// absolute).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "dpo/losses.h"

namespace rlhf::dpo {
namespace {

constexpr double kTol = 1e-5;

PairLogProbs pair(float pc, float pr, float rc, float rr) {
  PairLogProbs lp;
  lp.chosen = torch::tensor({pc});
  lp.rejected = torch::tensor({pr});
  lp.ref_chosen = torch::tensor({rc});
  lp.ref_rejected = torch::tensor({rr});
  return lp;
}

PairLogProbs kto_rows_as_pair() {
  return pair(-1, -3, -2, -2);
}

TEST(DpoLoss, SigmoidAndRewards) {
  DpoLossConfig c;  // beta 0.1
  // h = (-1 - -2) - (-1.5 - -1.5) = 1; loss = log(1 + exp(-0.1)).
  auto r = dpo_loss(c, pair(-1, -2, -1.5f, -1.5f));
  EXPECT_NEAR(r.loss.item<double>(), 0.644397, kTol);
  EXPECT_NEAR(r.chosen_rewards[0].item<double>(), 0.05, kTol);
  EXPECT_NEAR(r.rejected_rewards[0].item<double>(), -0.05, kTol);
  EXPECT_NEAR(r.accuracy.item<double>(), 1.0, kTol);
  EXPECT_NEAR(r.margin.item<double>(), 0.1, kTol);
}

TEST(DpoLoss, ConservativeLabelSmoothing) {
  DpoLossConfig c;
  c.label_smoothing = 0.2;  // 0.8 * log(1 + e^-0.1) + 0.2 * log(1 + e^0.1)
  EXPECT_NEAR(dpo_loss(c, pair(-1, -2, -1.5f, -1.5f)).loss.item<double>(), 0.664397, kTol);
}

TEST(DpoLoss, IpoHingeSimpo) {
  DpoLossConfig c;
  c.type = DpoLossType::kIpo;  // (1 - 1/(2*0.1))^2 = 16
  EXPECT_NEAR(dpo_loss(c, pair(-1, -2, -1.5f, -1.5f)).loss.item<double>(), 16.0, 1e-4);
  c.type = DpoLossType::kHinge;  // relu(1 - 0.1)
  EXPECT_NEAR(dpo_loss(c, pair(-1, -2, -1.5f, -1.5f)).loss.item<double>(), 0.9, kTol);
  c.type = DpoLossType::kSimpo;  // averages -0.5 and -1.0; beta 2, gamma 0.5: -logsig(0.5)
  c.beta = 2.0;
  c.simpo_gamma = 0.5;
  PairLogProbs lp;
  lp.chosen = torch::tensor({-0.5f});
  lp.rejected = torch::tensor({-1.0f});
  EXPECT_NEAR(dpo_loss(c, lp).loss.item<double>(), 0.474077, kTol);
  EXPECT_FALSE(needs_reference(DpoLossType::kSimpo));
  EXPECT_TRUE(needs_reference(DpoLossType::kIpo));
}

TEST(DpoLoss, NllTermOnChosenPerToken) {
  DpoLossConfig c;
  c.nll_loss_coef = 1.0;
  auto lp = pair(-4, -2, -4, -2);  // h = 0: log 2
  lp.chosen_tokens = torch::tensor({2.0f});
  EXPECT_NEAR(dpo_loss(c, lp).loss.item<double>(), std::log(2.0) + 2.0, kTol);
}

TEST(DpoLoss, GradientRaisesChosenAndLowersRejected) {
  DpoLossConfig c;
  auto lp = pair(-1, -2, -1, -2);
  lp.chosen.set_requires_grad(true);
  lp.rejected.set_requires_grad(true);
  dpo_loss(c, lp).loss.backward();
  // d/dpc [-logsig(beta h)] = -beta * sigmoid(-beta h) = -0.05 at h = 0.
  EXPECT_NEAR(lp.chosen.grad()[0].item<double>(), -0.05, kTol);
  EXPECT_NEAR(lp.rejected.grad()[0].item<double>(), 0.05, kTol);
}

TEST(DpoLoss, OrpoIsSftNllPlusLambdaOddsRatio) {
  // ORPO on length-normalised log-probs -0.5 (chosen) and -1.0 (rejected), lambda 0.1:
  //   log odds(-0.5) = -0.5 - log(1 - e^-0.5) = 0.432752
  //   log odds(-1.0) = -1.0 - log(1 - e^-1)   = -0.541325
  //   L_OR = log(1 + exp(-(0.432752 + 0.541325))) = 0.320300
  //   loss = 0.5 (NLL per token of chosen) + 0.1 * 0.320300 = 0.532030
  // Gradient: d/dc = -1 - 0.1 * sigmoid(-0.974077) / (1 - e^-0.5) = -1.069654,
  //           d/dr = 0.1 * sigmoid(-0.974077) / (1 - e^-1) = 0.043357.
  DpoLossConfig c;
  c.type = DpoLossType::kOrpo;
  c.orpo_lambda = 0.1;
  PairLogProbs lp;
  lp.chosen = torch::tensor({-0.5f}, torch::requires_grad());
  lp.rejected = torch::tensor({-1.0f}, torch::requires_grad());
  DpoLossResult r = dpo_loss(c, lp);
  EXPECT_NEAR(r.loss.item<double>(), 0.532030, kTol);
  EXPECT_NEAR(r.chosen_rewards[0].item<double>(), -0.05, kTol);  // beta * avg log-prob, as TRL
  r.loss.backward();
  EXPECT_NEAR(lp.chosen.grad()[0].item<double>(), -1.069654, kTol);
  EXPECT_NEAR(lp.rejected.grad()[0].item<double>(), 0.043357, kTol);
  EXPECT_FALSE(needs_reference(DpoLossType::kOrpo));
  EXPECT_EQ(parse_dpo_loss("orpo"), DpoLossType::kOrpo);
}

TEST(DpoLoss, OrpoStaysFiniteWhenChosenIsCertain) {
  // avg log-prob 0 (p = 1) has infinite log odds; capped at log p = -1e-6 it is about 13.8,
  // so the loss is finite and near 0 NLL + 0.1 * log(1 + e^-(13.8 + 0.54)).
  DpoLossConfig c;
  c.type = DpoLossType::kOrpo;
  PairLogProbs lp;
  lp.chosen = torch::tensor({0.0f}, torch::requires_grad());
  lp.rejected = torch::tensor({-1.0f});
  DpoLossResult r = dpo_loss(c, lp);
  EXPECT_TRUE(std::isfinite(r.loss.item<double>()));
  EXPECT_NEAR(r.loss.item<double>(), 0.1 * std::log1p(std::exp(-(13.815511 + 0.541325))), 1e-5);
  r.loss.backward();
  EXPECT_TRUE(std::isfinite(lp.chosen.grad()[0].item<double>()));
}

KtoLogProbs kto_rows() {
  // Row 0 desirable, log-ratio -1 - -2 = 1; row 1 undesirable, log-ratio -3 - -2 = -1.
  // Mismatched pairs: policy - ref = 1 and 0, so z0 = 0.5.
  KtoLogProbs lp;
  lp.policy = torch::tensor({-1.0f, -3.0f});
  lp.ref = torch::tensor({-2.0f, -2.0f});
  lp.desirable = torch::tensor({true, false});
  lp.policy_kl = torch::tensor({-2.0f, -4.0f});
  lp.ref_kl = torch::tensor({-3.0f, -4.0f});
  return lp;
}

TEST(KtoLoss, DesirableAndUndesirableAgainstTheKlReferencePoint) {
  // beta 0.1: desirable 1 - sigmoid(0.1 * (1 - 0.5)) = 0.487503,
  //           undesirable 1 - sigmoid(0.1 * (0.5 + 1)) = 0.462570; mean 0.475036.
  KtoLossConfig c;
  KtoLogProbs lp = kto_rows();
  KtoLossResult r = kto_loss(c, lp);
  EXPECT_NEAR(r.kl.item<double>(), 0.5, kTol);
  EXPECT_NEAR(r.loss.item<double>(), 0.475036, kTol);
  ASSERT_EQ(r.chosen_rewards.numel(), 1);
  ASSERT_EQ(r.rejected_rewards.numel(), 1);
  EXPECT_NEAR(r.chosen_rewards[0].item<double>(), 0.1, kTol);
  EXPECT_NEAR(r.rejected_rewards[0].item<double>(), -0.1, kTol);
  // Weights 2 and 0.5: (2 * 0.487503 + 0.5 * 0.462570) / 2 = 0.603145.
  c.desirable_weight = 2.0;
  c.undesirable_weight = 0.5;
  EXPECT_NEAR(kto_loss(c, lp).loss.item<double>(), 0.603145, kTol);
}

TEST(KtoLoss, ReferencePointClampedAtZero) {
  // Mismatched pairs with policy below reference: mean KL -1.5 clamps to 0; both rows then
  // lose 1 - sigmoid(0.1) = 0.475021.
  KtoLossConfig c;
  KtoLogProbs lp = kto_rows();
  lp.policy_kl = torch::tensor({-4.0f, -5.0f});
  KtoLossResult r = kto_loss(c, lp);
  EXPECT_NEAR(r.kl.item<double>(), 0.0, kTol);
  EXPECT_NEAR(r.loss.item<double>(), 0.475021, kTol);
}

TEST(KtoLoss, AGivenReferencePointStandsForTheWholeBatch) {
  // Rows split into two micro batches, each given the whole batch's z0 = 0.5: their mean loss
  // is the whole batch's 0.475036, and the reported kl is z0 in both. Estimated per micro
  // batch instead, z0 would be 1 and 0: losses 0.5 and 0.475021 (mean 0.487510).
  KtoLogProbs whole = kto_rows();
  const torch::Tensor z0 = kto_reference_point((whole.policy_kl - whole.ref_kl).mean());
  EXPECT_NEAR(z0.item<double>(), 0.5, kTol);
  double sum = 0;
  for (int64_t i = 0; i < 2; ++i) {
    KtoLogProbs part;
    part.policy = whole.policy.slice(0, i, i + 1);
    part.ref = whole.ref.slice(0, i, i + 1);
    part.desirable = whole.desirable.slice(0, i, i + 1);
    part.z0 = z0;  // no mismatched rows needed
    KtoLossResult r = kto_loss(KtoLossConfig{}, part);
    EXPECT_NEAR(r.kl.item<double>(), 0.5, kTol);
    sum += r.loss.item<double>();
  }
  EXPECT_NEAR(sum / 2, 0.475036, kTol);
  // The reference point is clamped at 0 and carries no gradient.
  torch::Tensor negative = torch::tensor(-1.5, torch::requires_grad());
  EXPECT_EQ(kto_reference_point(negative).item<double>(), 0.0);
  EXPECT_FALSE(kto_reference_point(negative).requires_grad());
  KtoLogProbs neither = kto_rows();
  neither.policy_kl = torch::Tensor();
  EXPECT_THROW(kto_loss(KtoLossConfig{}, neither), c10::Error);
}

TEST(KtoLoss, GradientFlowsThroughRowsNotThroughTheReferencePoint) {
  // d/dpolicy_0 = -beta * s (1 - s) / N with s = sigmoid(0.05): -0.012492;
  // d/dpolicy_1 = +beta * s (1 - s) / N with s = sigmoid(0.15): 0.012430; z0 is detached.
  KtoLogProbs lp = kto_rows();
  lp.policy.set_requires_grad(true);
  lp.policy_kl.set_requires_grad(true);
  kto_loss(KtoLossConfig{}, lp).loss.backward();
  EXPECT_NEAR(lp.policy.grad()[0].item<double>(), -0.012492, kTol);
  EXPECT_NEAR(lp.policy.grad()[1].item<double>(), 0.012430, kTol);
  EXPECT_FALSE(lp.policy_kl.grad().defined() && lp.policy_kl.grad().abs().sum().item<double>() > 0);
  EXPECT_TRUE(needs_reference(DpoLossType::kKto));
  EXPECT_THROW(dpo_loss(DpoLossConfig{DpoLossType::kKto}, kto_rows_as_pair()), std::exception);
}

TEST(RmLoss, PairwiseAndLogExp) {
  auto c = torch::tensor({2.0f}), r = torch::tensor({1.0f});
  EXPECT_NEAR(rm_loss(RmLossType::kSigmoid, c, r).item<double>(), 0.313262, kTol);
  EXPECT_NEAR(rm_loss(RmLossType::kLogExp, c, r).item<double>(), 0.313262, kTol);
  EXPECT_NEAR(rm_loss(RmLossType::kSigmoid, c, r, torch::tensor({0.5f})).item<double>(), 0.474077,
              kTol);
  EXPECT_THROW(parse_rm_loss("hinge"), std::exception);
}

TEST(RmLoss, LogExpDoesNotOverflowOnALargeGap) {
  // log(1 + exp(x)) = x + log(1 + exp(-x)): for x = 200 that is 200 + 1e-87, i.e. 200 in FP32,
  // where exp(200) alone overflows to inf. For x = -200 it is exp(-200), 0 in FP32. Mean of
  // the two: 100. Gradient d/dx = sigmoid(x): 1 and 0, halved by the mean.
  auto c = torch::tensor({0.0f, 0.0f}, torch::requires_grad());
  auto r = torch::tensor({200.0f, -200.0f});
  torch::Tensor loss = rm_loss(RmLossType::kLogExp, c, r);
  EXPECT_NEAR(loss.item<double>(), 100.0, kTol);
  loss.backward();
  EXPECT_NEAR(c.grad()[0].item<double>(), -0.5, kTol);
  EXPECT_NEAR(c.grad()[1].item<double>(), 0.0, kTol);
}

TEST(SftLoss, MeanNllOverResponseTokens) {
  auto lp = torch::tensor({-1.0f, -2.0f, -3.0f}).reshape({1, 3});
  auto mask = torch::tensor({0.0f, 1.0f, 1.0f}).reshape({1, 3});
  EXPECT_NEAR(sft_loss(lp, mask).item<double>(), 2.5, kTol);
}

}  // namespace
}  // namespace rlhf::dpo
