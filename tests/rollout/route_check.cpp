#include "tests/rollout/route_check.h"

#include <gtest/gtest.h>

#include "models/routes.h"

namespace rlhf::rollout::route_check {

int64_t expect_routes_of_a_fresh_forward(models::CausalLM& model, const GenerationOutput& out) {
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(out.routes.defined());
  if (!out.routes.defined()) return 0;
  const int64_t N = out.sequences.size(0), T = out.sequences.size(1);
  EXPECT_EQ(out.routes.size(0), N);
  EXPECT_EQ(out.routes.size(1), T);
  int64_t compared = 0;
  for (int64_t i = 0; i < N; ++i) {
    const auto keep = out.attention_mask[i].nonzero().squeeze(1);
    const auto ids = out.sequences[i].index_select(0, keep).view({1, -1});
    const int64_t L = ids.size(1);
    models::RouteRecorder recorder(model);
    model.forward(ids, torch::ones_like(ids));
    const auto fresh = recorder.take().used.view({1, L, out.routes.size(2), out.routes.size(3)});
    const auto rolled = out.routes[i].index_select(0, keep).unsqueeze(0);
    const auto recorded = (rolled >= 0).all(-1).all(-1)[0];  // [L]
    const int64_t fed = out.response_lengths[i].item<int64_t>() > 0 ? L - 1 : L;
    EXPECT_TRUE(recorded.narrow(0, 0, fed).all().item<bool>()) << "row " << i;
    if (fed < L) EXPECT_FALSE(recorded[L - 1].item<bool>()) << "row " << i << ": its last token";
    const auto padding = out.attention_mask[i] == 0;
    EXPECT_TRUE((out.routes[i].index({padding}) == -1).all().item<bool>()) << "row " << i;
    const auto [tokens, differ] = models::count_route_differences(rolled, fresh);
    EXPECT_EQ(tokens.item<int64_t>(), fed) << "row " << i;
    EXPECT_EQ(differ.item<int64_t>(), 0) << "row " << i;
    compared += tokens.item<int64_t>();
  }
  return compared;
}

}  // namespace rlhf::rollout::route_check
