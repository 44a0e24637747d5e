// Tensor-parallel shards of a checkpoint (models/tensor_parallel.h): two ranks in threads of
// this process over a real Gloo group load only their slices from the safetensors files and
// together compute the whole model's logits.
#include "models/tensor_parallel.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <future>
#include <thread>

#include "core/errors.h"
#include "models/causal_lm.h"
#include "models/pretrained.h"
#include "tests/models/test_util.h"
#include "transport/collective_group.h"

namespace rlhf::models {
namespace {

TEST(TensorParallel, ShardsLoadTheirSlicesAndComputeTheWholeModelsLogits) {
  torch::set_num_threads(1);
  testing::TempDir dir;
  ModelConfig config = preset_config("small");
  config.qkv_bias = true;     // column-parallel biases are split
  config.o_proj_bias = true;  // a row-parallel bias is added once, after the sum
  config.mlp_bias = true;
  CausalLM whole(config);
  whole.init_weights(5);
  {
    torch::NoGradGuard no_grad;
    for (auto& p : whole.parameters())
      if (p.dim() == 1) p.normal_(0.0, 0.1);  // biases and norms that are not zeros and ones
  }
  save_pretrained(whole, dir / "model", 1 << 20);  // several safetensors shards
  const auto ids = torch::randint(0, config.vocab_size, {3, 7}, torch::kInt64);
  torch::Tensor expected;
  {
    torch::NoGradGuard no_grad;
    expected = whole.logits(whole.forward(ids, {}));
  }

  const int tp = 2;
  auto run_rank = [&](int rank) {
    torch::set_num_threads(1);
    transport::CollectiveConfig cc;
    cc.rank = rank;
    cc.size = tp;
    cc.store_path = dir / "tp.store";
    TensorParallel parallel{rank, tp, transport::make_collective_group(cc)};
    LoadOptions load;
    load.dtype = torch::kFloat32;
    auto shard = load_pretrained(dir / "model", load, parallel);
    EXPECT_EQ(shard->layers->ptr(0)->as<DecoderLayerImpl>()->self_attn->q_proj->weight.size(0),
              config.num_attention_heads * config.head_dim / tp);
    EXPECT_EQ(shard->layers->ptr(0)->as<DecoderLayerImpl>()->mlp->down_proj->weight.size(1),
              config.intermediate_size / tp);
    EXPECT_EQ(shard->embed_tokens->weight.size(0), config.vocab_size / tp);
    EXPECT_EQ(shard->shard_config().num_key_value_heads, config.num_key_value_heads / tp);
    // Exactly rank r's rows / columns of the checkpoint.
    auto q = whole.layers->ptr(1)->as<DecoderLayerImpl>()->self_attn->o_proj->weight;
    EXPECT_TRUE(
        torch::equal(shard->layers->ptr(1)->as<DecoderLayerImpl>()->self_attn->o_proj->weight,
                     q.narrow(1, rank * q.size(1) / tp, q.size(1) / tp)));
    torch::NoGradGuard no_grad;
    return shard->logits(shard->forward(ids, {}));
  };
  auto other = std::async(std::launch::async, run_rank, 1);
  const auto mine = run_rank(0);
  const auto theirs = other.get();
  ASSERT_EQ(mine.sizes(), expected.sizes());
  EXPECT_TRUE(torch::equal(mine, theirs));  // every rank holds the full vocabulary's logits
  // FP32; the row-parallel sums add in another order.
  EXPECT_LT((mine - expected).abs().max().item<double>(), 1e-5);
}

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
}

}  // namespace
}  // namespace rlhf::models
