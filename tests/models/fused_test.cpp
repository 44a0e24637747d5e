// Fused projections (issue 32.2): a model whose q/k/v and gate/up maps run as one GEMM each
// computes what the unfused model computes (dense, KV-cached and tensor-parallel forwards,
// LoRA adapters on the parts, merged or not), lists the same HF tensors and exports the same
// bytes.
#include <ATen/CPUGeneratorImpl.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include "../support/collective.h"
#include "core/errors.h"
#include "core/text.h"
#include "models/causal_lm.h"
#include "models/kv_cache.h"
#include "models/lora.h"
#include "models/pretrained.h"
#include "test_util.h"

namespace rlhf::models {
namespace {

namespace fs = std::filesystem;

// FP32 throughout: a fused GEMM sums each output over the same K inputs as the part's own
// GEMM, but the BLAS may block the two shapes differently, so values agree to rounding.
constexpr double kFp32Tolerance = 1e-5;

// Llama-shaped (no biases, GQA 4:2) or Qwen2-shaped (q/k/v biases) tiny configs.
ModelConfig shaped(const std::string& model_type) {
  ModelConfig c = preset_config("tiny");
  c.torch_dtype = "float32";
  c.model_type = model_type;
  c.qkv_bias = model_type == "qwen2";
  return c;
}

// A model drawn from `seed`, biases and norms set away from zeros and ones (so a bias in the
// wrong rows shows).
std::shared_ptr<CausalLM> drawn(const ModelConfig& c, uint64_t seed) {
  auto m = std::make_shared<CausalLM>(c);
  m->init_weights(seed);
  torch::NoGradGuard no_grad;
  auto gen = at::detail::createCPUGenerator(seed + 100);
  for (auto& [name, t] : m->state_tensors())
    if (t.dim() == 1)
      t.copy_(torch::randn(t.sizes(), gen) * 0.1 + (ends_with(name, "norm.weight") ? 1 : 0));
  return m;
}

// A copy of `from` (the same tensors by HF name), fused.
std::shared_ptr<CausalLM> fused_copy(CausalLM& from) {
  auto m = std::make_shared<CausalLM>(from.config());
  torch::NoGradGuard no_grad;
  for (auto& [name, t] : from.state_tensors()) m->hf_tensor(name).copy_(t);
  m->fuse_projections();
  return m;
}

torch::Tensor ids_of(const ModelConfig& c, int64_t B, int64_t T, uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  return torch::randint(c.vocab_size, {B, T}, gen, torch::kInt64);
}

std::string bytes_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

class Fused : public ::testing::TestWithParam<std::string> {};

// The module tree has one qkv_proj and one gate_up_proj per layer; the HF view is unchanged.
TEST_P(Fused, ListsTheUnfusedTensorsAndFusesEachLayer) {
  auto plain = drawn(shaped(GetParam()), 1);
  auto fused = fused_copy(*plain);
  const auto a = plain->state_tensors(), b = fused->state_tensors();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);  // names in HF order
    EXPECT_TRUE(torch::equal(a[i].second, b[i].second)) << a[i].first;
  }
  int qkv = 0, gate_up = 0, parts = 0;
  for (const auto& p : fused->named_parameters()) {
    qkv += p.key().find("self_attn.qkv_proj.weight") != std::string::npos;
    gate_up += p.key().find("mlp.gate_up_proj.weight") != std::string::npos;
    parts += p.key().find("q_proj") != std::string::npos ||
             p.key().find("gate_proj") != std::string::npos;
  }
  EXPECT_EQ(qkv, fused->num_layers());
  EXPECT_EQ(gate_up, fused->num_layers());
  EXPECT_EQ(parts, 0);
  // An HF-named tensor is a view of the fused one: writing it changes the fused weight.
  torch::NoGradGuard no_grad;
  fused->hf_tensor("model.layers.1.self_attn.k_proj.weight").fill_(0.5);
  auto* layer = fused->layers->ptr(1)->as<DecoderLayerImpl>();
  const int64_t q_rows = fused->config().num_attention_heads * fused->config().head_dim;
  EXPECT_TRUE(layer->self_attn->named_parameters()["qkv_proj.weight"]
                  .narrow(0, q_rows, 1)
                  .eq(0.5)
                  .all()
                  .item<bool>());
  EXPECT_THROW(fused->hf_tensor("model.layers.0.self_attn.qkv_proj.weight"), InputError);
}

// Dense forward with padding, then a KV-cached prefill + decode: the same logits.
TEST_P(Fused, SameLogitsAsUnfusedDenseAndCached) {
  auto plain = drawn(shaped(GetParam()), 2);
  auto fused = fused_copy(*plain);
  torch::NoGradGuard no_grad;
  const auto ids = ids_of(plain->config(), 3, 9, 4);
  auto mask = torch::ones({3, 9}, torch::kInt64);
  mask[1].narrow(0, 0, 3).zero_();  // left padding
  const auto want = plain->logits(plain->forward(ids, mask));
  const auto got = fused->logits(fused->forward(ids, mask));
  EXPECT_LT((got - want).abs().max().item<double>(), kFp32Tolerance);
  for (auto* m : {plain.get(), fused.get()}) m->eval();
  KvCache cp(plain->config(), 3, 12, torch::kFloat32), cf(fused->config(), 3, 12, torch::kFloat32);
  const auto p1 = plain->logits(plain->forward(ids, mask, {}, &cp));
  const auto f1 = fused->logits(fused->forward(ids, mask, {}, &cf));
  EXPECT_LT((f1 - p1).abs().max().item<double>(), kFp32Tolerance);
  const auto next = ids_of(plain->config(), 3, 1, 5);
  const auto mask2 = torch::cat({mask, torch::ones({3, 1}, torch::kInt64)}, 1);
  const auto p2 = plain->logits(plain->forward(next, mask2, {}, &cp));
  const auto f2 = fused->logits(fused->forward(next, mask2, {}, &cf));
  EXPECT_LT((f2 - p2).abs().max().item<double>(), kFp32Tolerance);
}

// save_pretrained of a fused model writes the unfused model's files byte for byte.
TEST_P(Fused, ExportIsBitIdenticalToTheUnfusedExport) {
  auto plain = drawn(shaped(GetParam()), 3);
  auto fused = fused_copy(*plain);
  testing::TempDir dir;
  save_pretrained(*plain, dir / "plain", 1 << 16);  // several shards and an index
  save_pretrained(*fused, dir / "fused", 1 << 16);
  int files = 0;
  for (const auto& entry : fs::directory_iterator(dir / "plain")) {
    const auto name = entry.path().filename().string();
    EXPECT_TRUE(bytes_of(entry.path().string()) == bytes_of(dir / ("fused/" + name))) << name;
    ++files;
  }
  EXPECT_GE(files, 3);  // config.json, the index and at least one shard
  // And it loads back (unfused) to the same logits.
  LoadOptions load;
  load.dtype = torch::kFloat32;
  auto back = load_pretrained(dir / "fused", load);
  torch::NoGradGuard no_grad;
  const auto ids = ids_of(plain->config(), 2, 5, 6);
  EXPECT_TRUE(
      torch::equal(back->logits(back->forward(ids, {})), plain->logits(plain->forward(ids, {}))));
}

// LoRA adapters on every part (q, k, v, gate, up and the rest) of a fused base: the same
// logits as on the unfused base, adapters on, off, and merged into the fused tensors.
TEST_P(Fused, LoraOnTheFusedBaseEqualsLoraOnTheUnfusedOne) {
  auto plain = drawn(shaped(GetParam()), 4);
  auto fused = fused_copy(*plain);
  LoraConfig config;
  config.rank = 4;
  for (auto* m : {plain.get(), fused.get()}) {
    apply_lora(*m, config, 7);
    torch::NoGradGuard no_grad;
    auto gen = at::detail::createCPUGenerator(8);
    for (auto& [name, linear] : m->decoder_linears())
      linear->lora->B.copy_(torch::randn(linear->lora->B.sizes(), gen) * 0.05);  // B != 0
  }
  torch::NoGradGuard no_grad;
  const auto ids = ids_of(plain->config(), 2, 7, 9);
  auto logits = [&](CausalLM& m, bool adapters) {
    m.set_adapters_enabled(adapters);
    auto out = m.logits(m.forward(ids, {}));
    m.set_adapters_enabled(true);
    return out;
  };
  auto max_diff = [](const torch::Tensor& a, const torch::Tensor& b) {
    return (a - b).abs().max().item<double>();
  };
  const auto want = logits(*plain, true);
  EXPECT_GT(max_diff(want, logits(*plain, false)), 1e-3);  // the adapters matter
  EXPECT_LT(max_diff(logits(*fused, true), want), kFp32Tolerance);
  EXPECT_LT(max_diff(logits(*fused, false), logits(*plain, false)), kFp32Tolerance);
  merge_adapters(*fused);  // W += scale B A, written through the parts' aliases
  EXPECT_LT(max_diff(logits(*fused, true), want), kFp32Tolerance);
  EXPECT_FALSE(torch::equal(fused->hf_tensor("model.layers.0.self_attn.v_proj.weight"),
                            plain->hf_tensor("model.layers.0.self_attn.v_proj.weight")));
  unmerge_adapters(*fused);
  EXPECT_LT(max_diff(logits(*fused, false), logits(*plain, false)), kFp32Tolerance);
}

INSTANTIATE_TEST_SUITE_P(Shapes, Fused, ::testing::Values("llama", "qwen2"));

// to(dtype) moves the fused tensors; the HF views and the parts' aliases follow them.
TEST(FusedProjections, FollowTheModelAcrossDtypes) {
  auto plain = drawn(shaped("qwen2"), 5);
  auto fused = fused_copy(*plain);
  fused->to(torch::kFloat64);
  plain->to(torch::kFloat64);
  for (auto& [name, linear] : fused->decoder_linears()) {
    EXPECT_EQ(linear->weight.scalar_type(), torch::kFloat64) << name;
    EXPECT_TRUE(torch::equal(linear->weight, plain->hf_tensor(name + ".weight"))) << name;
  }
  torch::NoGradGuard no_grad;
  const auto ids = ids_of(plain->config(), 2, 6, 10);
  EXPECT_LT((fused->logits(fused->forward(ids, {})) - plain->logits(plain->forward(ids, {})))
                .abs()
                .max()
                .item<double>(),
            1e-10);
}

TEST(FusedProjections, RefuseDeferredWeightsAndLoadingAfterFusion) {
  CausalLM deferred(shaped("llama"), Materialize::kDeferred);
  testing::expect_error<c10::Error>([&] { deferred.fuse_projections(); }, {"fuse after loading"});
  auto fused = fused_copy(*drawn(shaped("llama"), 6));
  testing::expect_error<c10::Error>(
      [&] {
        load_whole(*fused, TensorsSource(fused->state_tensors()), torch::kFloat32, torch::kCPU);
      },
      {"load first, then fuse_projections"});
}

// Tensor parallelism 2 (two ranks on threads, a real Gloo group): each rank fuses its own
// q/k/v and gate/up slices, and the fused shards' logits equal the whole unfused model's.
TEST(FusedProjections, TensorParallelShardsFuseTheirSlices) {
  ModelConfig c = shaped("qwen2");
  c.o_proj_bias = c.mlp_bias = true;
  auto whole = drawn(c, 11);
  const auto ids = ids_of(c, 2, 6, 12);
  torch::Tensor want;
  {
    torch::NoGradGuard no_grad;
    want = whole->logits(whole->forward(ids, {}));
  }
  testing::TempDir dir;
  const TensorsSource source(whole->state_tensors());
  torch::Tensor got[2];
  std::string error[2];
  auto rank = [&](int r) {
    try {
      TensorParallel tp;
      tp.rank = r;
      tp.size = 2;
      tp.group = test::join_group(dir / "tp.store", r, 2, std::chrono::seconds(60));
      CausalLM shard(c, Materialize::kDeferred, tp);
      load_whole(shard, source, torch::kFloat32, torch::kCPU);
      shard.fuse_projections();
      // The rank's HF view is its slice of each tensor.
      for (auto& [name, t] : shard.state_tensors())
        if (!torch::equal(t, tensor_parallel_slice(name, whole->hf_tensor(name), r, 2)))
          throw std::runtime_error(name + " is not rank " + std::to_string(r) + "'s slice");
      torch::NoGradGuard no_grad;
      got[r] = shard.logits(shard.forward(ids, {}));
    } catch (const std::exception& e) {
      error[r] = e.what();
    }
  };
  std::thread other(rank, 1);
  rank(0);
  other.join();
  for (int r = 0; r < 2; ++r) ASSERT_EQ(error[r], "") << "rank " << r;
  EXPECT_TRUE(torch::equal(got[0], got[1]));
  EXPECT_LT((got[0] - want).abs().max().item<double>(), kFp32Tolerance);
}

}  // namespace
}  // namespace rlhf::models
