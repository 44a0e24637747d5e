// Expert parallelism's token dispatch (models/expert_parallel.h) over a real Gloo group of 2
// and 4 ranks (threads of this process, each its own group member and its own copy of the
// model): each rank runs only its range of a sparse layer's experts on the pairs every rank
// routed to them. Against the single-rank block on all ranks' tokens at once (FP32): the
// outputs, the tokens' and the routing weights' gradients and each local expert's gradients
// within 1e-6 of scale (the same rows reach the same expert in the same order: measured equal).
#include "models/expert_parallel.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <thread>

#include "models/causal_lm.h"
#include "models/routes.h"
#include "test_util.h"
#include "transport/collective_group.h"

namespace rlhf::models {
namespace {

namespace fs = std::filesystem;
using testing::relative_error;

SparseMoeImpl& first_block(CausalLM& model) {
  return *sparse_blocks(model).at(0);
}

struct Result {
  torch::Tensor out, token_grad, weight_grad;
  std::vector<torch::Tensor> expert_grads;  // every expert's gate/up/down, flattened
};

// Output and gradients of loss = sum(out * probe) for `tokens` through `block`'s experts:
// `run` computes the routed sum from the tokens and routes (whole block or dispatched).
template <typename Run>
Result run_block(SparseMoeImpl& block, const torch::Tensor& x, const torch::Tensor& probe,
                 Run run) {
  block.zero_grad();
  const torch::Tensor tokens = x.clone().requires_grad_(true);
  Routes routes = block.route(tokens.detach());
  routes.weights = routes.weights.detach().requires_grad_(true);
  Result r;
  r.out = run(tokens, routes);
  (r.out * probe).sum().backward();
  r.token_grad = tokens.grad();
  r.weight_grad = routes.weights.grad();
  for (const auto& p : block.named_children()["experts"]->parameters())
    r.expert_grads.push_back(p.grad().defined() ? p.grad().reshape({-1})
                                                : torch::zeros({p.numel()}));
  return r;
}

// Rank r has counts[r] tokens (0 too: it still joins every exchange).
void expect_dispatch_equals_whole_block(const std::vector<int64_t>& counts) {
  const int ranks = static_cast<int>(counts.size());
  SCOPED_TRACE(std::to_string(ranks) + " ranks");
  torch::set_num_threads(1);
  const auto config = preset_config("tiny-moe");  // 8 experts, top-2
  const int64_t H = config.hidden_size, E = config.moe.num_experts;
  auto gen = at::detail::createCPUGenerator(11);
  std::vector<torch::Tensor> xs, probes;
  for (int r = 0; r < ranks; ++r) {
    xs.push_back(torch::randn({counts[r], H}, gen));
    probes.push_back(torch::randn({counts[r], H}, gen));
  }
  CausalLM whole(config);
  whole.init_weights(5);
  auto& block = first_block(whole);
  const Result ref = run_block(block, torch::cat(xs), torch::cat(probes),
                               [&](const torch::Tensor& t, const Routes& routes) {
                                 return block.experts_forward(t, routes);
                               });
  const fs::path store = fs::temp_directory_path() /
                         ("rlhf_ep_" + std::to_string(::getpid()) + "_" + std::to_string(ranks));
  fs::remove(store);
  std::vector<Result> got(static_cast<size_t>(ranks));
  std::vector<std::string> errors(static_cast<size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      try {
        transport::CollectiveConfig c;
        c.rank = r;
        c.size = ranks;
        c.store_path = store.string();
        c.timeout = std::chrono::seconds(60);
        auto group = transport::make_collective_group(c);
        CausalLM mine(config);  // the same weights: init_weights draws from its own seed
        mine.init_weights(5);
        auto& b = first_block(mine);
        const int64_t per = E / ranks;
        std::vector<ExpertImpl*> local;
        for (int64_t e = r * per; e < (r + 1) * per; ++e)
          local.push_back(b.experts[e]->as<ExpertImpl>());
        got[r] = run_block(b, xs[r], probes[r], [&](const torch::Tensor& t, const Routes& routes) {
          return expert_parallel_forward(t, routes, local, r * per, E, false, *group);
        });
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  fs::remove(store);
  for (int r = 0; r < ranks; ++r) ASSERT_EQ(errors[r], "") << "rank " << r;
  int64_t row = 0;
  const int64_t per_expert = static_cast<int64_t>(ref.expert_grads.size()) / E;  // 3 maps each
  double worst = 0;
  for (int r = 0; r < ranks; ++r) {
    const int64_t n = xs[r].size(0);
    if (n == 0) {
      EXPECT_EQ(got[r].out.numel(), 0);
    } else {
      for (double e : {relative_error(got[r].out, ref.out.narrow(0, row, n)),
                       relative_error(got[r].token_grad, ref.token_grad.narrow(0, row, n)),
                       relative_error(got[r].weight_grad, ref.weight_grad.narrow(0, row, n))}) {
        EXPECT_LT(e, 1e-6) << "rank " << r;
        worst = std::max(worst, e);
      }
    }
    // Rank r's experts got the gradient of every rank's pairs routed to them.
    const int64_t per = E / ranks;
    for (int64_t e = r * per; e < (r + 1) * per; ++e)
      for (int64_t m = 0; m < per_expert; ++m) {
        const size_t i = static_cast<size_t>(e * per_expert + m);
        const double err = relative_error(got[r].expert_grads[i], ref.expert_grads[i]);
        EXPECT_LT(err, 1e-6) << "rank " << r << " expert " << e;
        worst = std::max(worst, err);
      }
    row += n;
  }
  std::cout << "[ measured ] expert parallel over " << ranks
            << " ranks vs the whole block: worst relative error " << worst << std::endl;
}

TEST(ExpertParallel, DispatchedExpertsEqualTheWholeBlockForwardAndBackward) {
  expect_dispatch_equals_whole_block({3, 5});
  expect_dispatch_equals_whole_block({3, 5, 7, 9});
  expect_dispatch_equals_whole_block({0, 6});  // a rank without tokens serves the other's
}

}  // namespace
}  // namespace rlhf::models
