// Which slice of each parameter a tensor-parallel rank holds (models/tensor_parallel.h).
// Shards loading and computing across real processes: tests/rollout/weight_sync_test.cpp.
#include "models/tensor_parallel.h"

#include <gtest/gtest.h>

#include "core/errors.h"
#include "models/config.h"
#include "tests/models/test_util.h"

namespace rlhf::models {
namespace {

TEST(TensorParallel, SizesTheModelCannotSplitAreNamed) {
  const ModelConfig config = preset_config("small");  // 8 heads, 4 kv heads
  testing::expect_error<InputError>(
      [&] { check_tensor_parallel(config, 8, "rollout.tensor_parallel_size"); },
      {"rollout.tensor_parallel_size", "num_key_value_heads (4)"});
  testing::expect_error<InputError>([&] { check_tensor_parallel(config, 3, "x"); },
                                    {"num_attention_heads (8)"});
  EXPECT_NO_THROW(check_tensor_parallel(config, 4, "x"));
  EXPECT_EQ(tensor_parallel_dim("model.layers.0.self_attn.o_proj.weight"), 1);
  EXPECT_EQ(tensor_parallel_dim("model.layers.0.self_attn.o_proj.bias"), -1);
  EXPECT_EQ(tensor_parallel_dim("model.layers.0.mlp.up_proj.weight"), 0);
  EXPECT_EQ(tensor_parallel_dim("model.layers.0.input_layernorm.weight"), -1);
  EXPECT_EQ(tensor_parallel_dim("lm_head.weight"), 0);
  // Qwen3's per-head q/k norms act on head_dim: every rank holds them whole.
  EXPECT_EQ(tensor_parallel_dim("model.layers.0.self_attn.q_norm.weight"), -1);
  EXPECT_EQ(tensor_parallel_dim("model.layers.0.self_attn.k_norm.weight"), -1);
  EXPECT_EQ(tensor_parallel_shape("model.layers.0.self_attn.k_norm.weight", {128}, 4),
            (std::vector<int64_t>{128}));
}

}  // namespace
}  // namespace rlhf::models
