// A weight sync into a rollout model with fused projections (issue 32.2): the wire format is
// the unfused model's (HF names and shapes, the same layout hash), each received q/k/v or
// gate/up tensor lands in its rows of the fused tensor, and the result equals a fresh load,
// whole or as tensor-parallel shards. Ranks run on threads over real Gloo groups.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "../support/collective.h"
#include "models/causal_lm.h"
#include "models/pretrained.h"
#include "models/tensor_parallel.h"
#include "rollout/weight_sync.h"

namespace rlhf::rollout {
namespace {

namespace fs = std::filesystem;

std::string fresh_dir(const std::string& name) {
  const auto dir =
      fs::temp_directory_path() / ("rlhf_fused_sync_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

// Qwen2-shaped (q/k/v biases), FP32, drawn from `seed` with biases away from zero.
std::shared_ptr<models::CausalLM> drawn(uint64_t seed) {
  models::ModelConfig c = models::preset_config("tiny");
  c.model_type = "qwen2";
  c.qkv_bias = true;
  auto m = std::make_shared<models::CausalLM>(c);
  m->init_weights(seed);
  torch::NoGradGuard no_grad;
  for (auto& [name, t] : m->state_tensors())
    if (name.find("_proj.bias") != std::string::npos) t.normal_(0.0, 0.1);
  return m;
}

// A fused model (a TP shard when tp.size > 1) loaded from `from`'s tensors.
std::unique_ptr<models::CausalLM> fused_from(const models::CausalLM& from_config_model,
                                             const models::WeightSource& source,
                                             models::TensorParallel tp = {}) {
  auto m = std::make_unique<models::CausalLM>(from_config_model.config(),
                                              models::Materialize::kDeferred, tp);
  models::load_whole(*m, source, torch::kFloat32, torch::kCPU);
  m->fuse_projections();
  return m;
}

// Runs rank(r) for r in [0, n) on threads; returns each rank's exception text ("" if none).
template <typename Fn>
std::vector<std::string> on_threads(int n, Fn rank) {
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        rank(r);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

void expect_same_tensors(models::CausalLM& got, models::CausalLM& want, const std::string& who) {
  const auto a = got.state_tensors(), b = want.state_tensors();
  ASSERT_EQ(a.size(), b.size()) << who;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first) << who;
    EXPECT_TRUE(torch::equal(a[i].second, b[i].second)) << who << ' ' << a[i].first;
  }
}

// FP32 on the wire: the synced fused model equals a fused fresh load of the actor's weights,
// tensor for tensor and logit for logit (bitwise: the same values in the same fused layout).
TEST(FusedWeightSync, SyncIntoAFusedModelEqualsAFreshLoad) {
  const auto dir = fresh_dir("whole");
  auto actor = drawn(1);
  auto stale = drawn(2);
  auto rollout = fused_from(*stale, models::TensorsSource(stale->state_tensors()));
  SyncOptions options;
  options.wire_dtype = torch::kFloat32;
  options.bucket_bytes = 4096;  // tensors split across buckets
  const auto errors = on_threads(2, [&](int r) {
    auto group = test::join_group(dir + "/sync.store", r, 2, std::chrono::seconds(60));
    if (r == 0) {
      ModelWeights source(*actor);
      send_weights(source, group.get(), 3, options);
    } else {
      EXPECT_EQ(receive_weights(*rollout, *group).version, 3);
    }
  });
  for (const auto& e : errors) ASSERT_EQ(e, "");
  ASSERT_TRUE(rollout->fused_projections());
  auto fresh = fused_from(*actor, models::TensorsSource(actor->state_tensors()));
  expect_same_tensors(*rollout, *fresh, "whole");
  torch::NoGradGuard no_grad;
  const auto ids =
      torch::arange(12, torch::kInt64).remainder(actor->config().vocab_size).view({2, 6});
  EXPECT_TRUE(torch::equal(rollout->logits(rollout->forward(ids, {})),
                           fresh->logits(fresh->forward(ids, {}))));
  fs::remove_all(dir);
}

// Tensor parallel 2: the actor scatters each rank's slices; each fused shard ends equal to a
// fused shard loaded fresh from the actor's weights.
TEST(FusedWeightSync, TensorParallelFusedShardsEqualFreshShards) {
  const auto dir = fresh_dir("tp");
  auto actor = drawn(3);
  auto stale = drawn(4);
  const models::TensorsSource actor_source(actor->state_tensors());
  const models::TensorsSource stale_source(stale->state_tensors());
  SyncOptions options;
  options.wire_dtype = torch::kFloat32;
  options.bucket_bytes = 8192;
  options.tensor_parallel_size = 2;
  std::vector<std::unique_ptr<models::CausalLM>> synced(2), fresh(2);
  const auto errors = on_threads(3, [&](int g) {
    if (g == 0) {
      auto group = test::join_group(dir + "/sync.store", 0, 3, std::chrono::seconds(60));
      ModelWeights source(*actor);
      send_weights(source, group.get(), 5, options);
      return;
    }
    models::TensorParallel tp;
    tp.rank = g - 1;
    tp.size = 2;
    tp.group = test::join_group(dir + "/tp.store", tp.rank, 2, std::chrono::seconds(60));
    auto shard = fused_from(*stale, stale_source, tp);
    auto group = test::join_group(dir + "/sync.store", g, 3, std::chrono::seconds(60));
    receive_weights(*shard, *group);
    synced[static_cast<size_t>(tp.rank)] = std::move(shard);
    fresh[static_cast<size_t>(tp.rank)] = fused_from(*actor, actor_source, tp);
  });
  for (const auto& e : errors) ASSERT_EQ(e, "");
  for (int r = 0; r < 2; ++r)
    expect_same_tensors(*synced[static_cast<size_t>(r)], *fresh[static_cast<size_t>(r)],
                        "TP rank " + std::to_string(r));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace rlhf::rollout
