// Routing replay for a whole model (models/routes.h): recording every sparse layer's routes
// token-major, replaying them (tokens without a route take the router's own), through
// checkpointed recomputes and packed rows, and comparing two sets of routes.
#include "models/routes.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include "models/causal_lm.h"
#include "test_util.h"

namespace rlhf::models {
namespace {

using testing::relative_error;

std::shared_ptr<CausalLM> tiny_moe() {
  auto model = std::make_shared<CausalLM>(preset_config("tiny-moe"));
  model->init_weights(5);
  return model;
}

torch::Tensor ids_of(int64_t B, int64_t T, uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  return torch::randint(1, 256, {B, T}, gen, torch::kInt64);
}

// Each token's experts shifted by one: routes the router did not choose.
torch::Tensor shifted(const torch::Tensor& routes, int64_t experts) {
  return (routes.to(torch::kInt64) + 1).remainder(experts).to(kRouteDtype);
}

TEST(Routes, RecordedRoutesReplayToTheSameForwardAndUnrecordedTokensRouteFreely) {
  auto model = tiny_moe();
  torch::NoGradGuard no_grad;
  const auto ids = ids_of(2, 9, 1), mask = torch::ones_like(ids);
  RouteRecorder::Taken own;
  torch::Tensor logits;
  {
    RouteRecorder recorder(*model);
    logits = model->logits(model->forward(ids, mask));
    own = recorder.take();
  }
  ASSERT_EQ(own.used.sizes(), (std::vector<int64_t>{18, 2, 2}));  // 2 x 9 tokens, 2 layers, top-2
  EXPECT_EQ(own.used.scalar_type(), kRouteDtype);
  EXPECT_TRUE(torch::equal(own.used, own.own)) << "nothing replayed: used = the routers' own";
  const auto other = shifted(own.used, 8);
  {
    RouteReplay replay(*model);
    RouteRecorder recorder(*model);
    replay.set(own.used);
    EXPECT_TRUE(torch::equal(model->logits(model->forward(ids, mask)), logits)) << "to the bit";
    // Tokens 0-8 replay other experts; tokens 9-17 have none recorded (-1): their own.
    auto mixed = other.clone();
    mixed.narrow(0, 9, 9).fill_(-1);
    replay.set(mixed);
    recorder.take();
    const auto moved = model->logits(model->forward(ids, mask));
    const auto got = recorder.take();
    EXPECT_TRUE(torch::equal(got.used.narrow(0, 0, 9), other.narrow(0, 0, 9)));
    EXPECT_TRUE(torch::equal(got.used.narrow(0, 9, 9), own.used.narrow(0, 9, 9)));
    // The routers' own choice, replayed or not: the first sparse layer sees the same input.
    EXPECT_TRUE(torch::equal(got.own.select(1, 0), own.used.select(1, 0)));
    EXPECT_TRUE(torch::equal(got.own.narrow(0, 9, 9), own.used.narrow(0, 9, 9)));
    EXPECT_GT((moved[0] - logits[0]).abs().max().item<double>(), 1e-3);
    // Row 1 attends only to itself: its tokens routed freely give its logits again (FP32;
    // the expert loop sums in another order when fewer tokens share an expert).
    EXPECT_LT((moved[1] - logits[1]).abs().max().item<double>(), 1e-5);
    // Routes for another model shape are refused naming the expected one.
    testing::expect_error<c10::Error>(
        [&] {
          replay.set(torch::zeros({18, 3, 2}, kRouteDtype));
        },
        {"routes are [18, 3, 2]", "expected [tokens, 2 sparse layers, 2]"});
  }
  // The replay ended with its scope.
  EXPECT_TRUE(torch::equal(model->logits(model->forward(ids, mask)), logits));
}

TEST(Routes, ReplayHoldsThroughCheckpointedRecomputesAndPackedRows) {
  // Replayed routes stay set until backward: a checkpointed layer's recompute runs the same
  // experts, so gradients equal the plain forward's (FP32, 1e-6 of scale). Two rows packed
  // end to end (segments 1 and 2) with forward_routes(packed) run exactly the padded rows'
  // routes: log-probs within 1e-5.
  auto model = tiny_moe();
  const auto ids = ids_of(2, 7, 3);
  auto mask = torch::ones_like(ids);
  mask[1].narrow(0, 0, 2).zero_();  // row 1 left-padded by 2
  torch::Tensor routes;
  {
    torch::NoGradGuard no_grad;
    RouteRecorder recorder(*model);
    model->forward(ids, mask);
    routes = shifted(recorder.take().used, 8).view({2, 7, 2, 2});
  }
  auto loss_grads = [&](Checkpointing mode) {
    model->set_checkpointing(mode);
    model->zero_grad();
    RouteReplay replay(*model);
    replay.set(forward_routes(routes, mask, false));
    auto lp = model->next_token_log_probs(model->forward(ids, mask), ids, 4);
    (-(lp * mask.narrow(1, 1, 6)).sum()).backward();
    std::vector<torch::Tensor> grads;
    for (auto& p : model->parameters())  // an expert no token ran has none
      grads.push_back(p.grad().defined() ? p.grad().clone() : torch::zeros_like(p));
    return std::make_pair(lp.detach(), grads);
  };
  const auto [plain_lp, plain] = loss_grads(Checkpointing::kNone);
  const auto [ckpt_lp, ckpt] = loss_grads(Checkpointing::kPerLayer);
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_LT(relative_error(ckpt[i], plain[i]), 1e-6) << i;
  model->set_checkpointing(Checkpointing::kNone);

  torch::NoGradGuard no_grad;
  const auto keep = mask.reshape({-1}) != 0;
  const auto packed_ids = ids.reshape({-1}).index({keep}).view({1, -1});  // 7 + 5 tokens
  const auto segments = (mask * torch::tensor({1, 2}, torch::kInt64).view({2, 1}))
                            .reshape({-1})
                            .index({keep})
                            .view({1, -1});
  RouteReplay replay(*model);
  replay.set(forward_routes(routes, mask, true));
  EXPECT_EQ(forward_routes(routes, mask, true).size(0), 12);
  const auto packed = model->next_token_log_probs(model->forward(packed_ids, segments), packed_ids);
  EXPECT_LT((packed[0].narrow(0, 0, 6) - plain_lp[0]).abs().max().item<double>(), 1e-5);
  EXPECT_LT((packed[0].narrow(0, 7, 4) - plain_lp[1].narrow(0, 2, 4)).abs().max().item<double>(),
            1e-5);
}

TEST(Routes, DifferencesCountTokensWhoseExpertSetDiffersInSomeLayer) {
  // [1 row, 4 tokens, 2 layers, top-2]: token 0 equal; token 1 the same experts in another
  // order (equal); token 2 one layer differs; token 3 unrecorded on one side (not counted).
  auto a = torch::tensor({0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, -1, -1, -1, -1}, kRouteDtype)
               .view({1, 4, 2, 2});
  auto b = a.clone();
  b[0][1][0] = torch::tensor({1, 0}, kRouteDtype);
  b[0][2][1][1] = 5;
  b[0][3].fill_(4);
  const auto [tokens, differ] = count_route_differences(a, b);
  EXPECT_EQ(tokens.item<int64_t>(), 3);
  EXPECT_EQ(differ.item<int64_t>(), 1);
}

}  // namespace
}  // namespace rlhf::models
