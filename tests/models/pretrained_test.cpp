// HF directories: save -> load is bit-exact (single and sharded), and a checkpoint that
// does not fit the config is one error listing every bad tensor.
#include "models/pretrained.h"

#include <fstream>

#include "core/errors.h"
#include "test_util.h"

namespace rlhf::models {
namespace {

using testing::expect_error;
using testing::TempDir;

std::shared_ptr<CausalLM> tiny(HeadKind head, torch::Dtype dtype, uint64_t seed) {
  ModelConfig c = preset_config("tiny");
  c.head = head;
  auto m = std::make_shared<CausalLM>(c);
  m->init_weights(seed);
  m->to(dtype);
  return m;
}

void expect_same_weights(CausalLM& a, CausalLM& b) {
  auto ta = a.state_tensors(), tb = b.state_tensors();
  ASSERT_EQ(ta.size(), tb.size());
  for (size_t i = 0; i < ta.size(); ++i) {
    EXPECT_EQ(ta[i].first, tb[i].first);
    EXPECT_EQ(ta[i].second.scalar_type(), tb[i].second.scalar_type()) << ta[i].first;
    EXPECT_TRUE(torch::equal(ta[i].second, tb[i].second)) << ta[i].first;
  }
}

TEST(Pretrained, SaveLoadRoundTripIsBitExact) {
  for (auto dtype : {torch::kBFloat16, torch::kFloat32}) {
    for (auto head : {HeadKind::kLanguageModel, HeadKind::kValue}) {
      TempDir dir;
      auto model = tiny(head, dtype, 11);
      save_pretrained(*model, dir.str());
      auto loaded = load_pretrained(dir.str());  // dtype from config.json's torch_dtype
      EXPECT_EQ(loaded->config().head, head);
      expect_same_weights(*model, *loaded);
    }
  }
}

TEST(Pretrained, ShardedSaveLoadsBackAndConvertsDtype) {
  TempDir dir;
  auto model = tiny(HeadKind::kLanguageModel, torch::kBFloat16, 12);
  save_pretrained(*model, dir.str(), /*max_shard_bytes=*/64 << 10);  // ~260 KB -> 5 shards
  ASSERT_TRUE(std::filesystem::exists(dir / kIndexFileName));
  EXPECT_FALSE(std::filesystem::exists(dir / kSingleFileName));
  expect_same_weights(*model, *load_pretrained(dir.str()));
  LoadOptions fp32;
  fp32.dtype = torch::kFloat32;
  auto wide = load_pretrained(dir.str(), fp32);
  EXPECT_EQ(wide->dtype(), torch::kFloat32);
  EXPECT_TRUE(
      torch::equal(wide->embed_tokens->weight.to(torch::kBFloat16), model->embed_tokens->weight));
}

TEST(Pretrained, MismatchedCheckpointListsEveryProblem) {
  TempDir dir;
  auto model = tiny(HeadKind::kLanguageModel, torch::kFloat32, 13);
  save_pretrained(*model, dir.str());
  NamedTensors tensors;
  for (auto& [name, t] : model->state_tensors()) {
    if (name == "model.norm.weight") continue;                                  // missing
    if (name == "model.layers.1.mlp.up_proj.weight") t = torch::zeros({3, 3});  // wrong shape
    tensors.emplace_back(name, t);
  }
  tensors.emplace_back("model.layers.7.extra.weight", torch::zeros({2}));  // unexpected
  save_checkpoint(dir.str(), tensors);
  expect_error<InputError>(
      [&] { load_pretrained(dir.str()); },
      {dir.str(), "missing tensors: model.norm.weight",
       "unexpected tensors: model.layers.7.extra.weight",
       "model.layers.1.mlp.up_proj.weight [3, 3] in model.safetensors, model expects [176, 64]"});
}

TEST(Pretrained, TruncatedWeightsAreAnErrorNamingTheFile) {
  TempDir dir;
  save_pretrained(*tiny(HeadKind::kLanguageModel, torch::kBFloat16, 14), dir.str());
  const std::string file = dir / kSingleFileName;
  std::filesystem::resize_file(file, std::filesystem::file_size(file) / 2);
  expect_error<InputError>([&] { load_pretrained(dir.str()); }, {file, "truncated"});
  std::ofstream(dir / "config.json") << "{\"model_type\": \"llama\"";
  expect_error<InputError>([&] { load_pretrained(dir.str()); },
                           {dir / "config.json", "not valid JSON"});
}

TEST(Pretrained, CriticCanStartFromAnActorCheckpoint) {
  TempDir dir;
  auto actor = tiny(HeadKind::kLanguageModel, torch::kFloat32, 15);
  save_pretrained(*actor, dir.str());
  LoadOptions opts;
  opts.head = HeadKind::kValue;
  auto critic = load_pretrained(dir.str(), opts);  // lm_head ignored, score freshly initialised
  EXPECT_EQ(critic->config().head, HeadKind::kValue);
  EXPECT_TRUE(torch::equal(critic->embed_tokens->weight, actor->embed_tokens->weight));
  // OpenRLHF's critic init, the same values whichever way (and on whichever rank) it is made.
  EXPECT_TRUE(torch::equal(critic->value_head->weight, value_head_init(critic->config())));
  EXPECT_NEAR(critic->value_head->weight.std().item<double>(), 1.0 / 65, 0.3 / 65);  // H = 64
  // Without the override a missing head is an error.
  auto reward = tiny(HeadKind::kValue, torch::kFloat32, 16);
  TempDir dir2;
  save_pretrained(*reward, dir2.str());
  opts.head = HeadKind::kLanguageModel;
  expect_error<InputError>([&] { load_pretrained(dir2.str(), opts); },
                           {"missing tensors: lm_head.weight"});
}

// A deferred model holds no weights at all (placeholders of 0 elements) and still knows
// every parameter's full shape, the same as the allocated model's, for every head layout.
TEST(Pretrained, DeferredModelAllocatesNothingAndKnowsItsShapes) {
  for (auto head : {HeadKind::kLanguageModel, HeadKind::kValue}) {
    for (bool tied : {false, true}) {
      ModelConfig c = preset_config("tiny");
      c.head = head;
      c.tie_word_embeddings = tied;
      c.qkv_bias = true;  // Qwen2's biases are parameters too
      CausalLM allocated(c), deferred(c, Materialize::kDeferred);
      auto named = allocated.state_tensors();
      const auto& shapes = deferred.parameter_shapes();
      ASSERT_EQ(named.size(), shapes.size());
      for (size_t i = 0; i < named.size(); ++i) {
        EXPECT_EQ(named[i].first, shapes[i].first);
        EXPECT_EQ(named[i].second.sizes().vec(), shapes[i].second) << shapes[i].first;
      }
      for (const auto& p : deferred.parameters()) EXPECT_EQ(p.numel(), 0);
    }
  }
}

// Every rank reads its slices straight from the mapping: any [begin, begin + count) of any
// tensor equals the same elements of the whole loaded tensor, converted to the asked dtype
// (bit-exact: one rounding either way). Out-of-range requests name the tensor.
TEST(Pretrained, SlicesReadFromTheCheckpointEqualTheWholeTensor) {
  TempDir dir;
  auto model = tiny(HeadKind::kLanguageModel, torch::kBFloat16, 17);
  save_pretrained(*model, dir.str(), /*max_shard_bytes=*/64 << 10);
  PretrainedSource source(dir.str());
  EXPECT_EQ(source.dtype(), torch::kBFloat16);
  for (const auto& [name, tensor] : model->state_tensors()) {
    const auto flat = tensor.reshape({-1});
    const int64_t n = flat.numel();
    for (auto [begin, count] :
         std::vector<std::pair<int64_t, int64_t>>{{0, n}, {n / 3, n / 2}, {n - 1, 1}, {n / 2, 0}}) {
      for (auto dtype : {torch::kFloat32, torch::kBFloat16}) {
        auto got = source.read(name, begin, count, dtype, torch::kCPU);
        EXPECT_EQ(got.scalar_type(), dtype);
        EXPECT_TRUE(torch::equal(got, flat.narrow(0, begin, count).to(dtype))) << name;
      }
    }
  }
  expect_error<c10::Error>(
      [&] { source.read("model.norm.weight", 60, 10, torch::kFloat32, torch::kCPU); },
      {"model.norm.weight", "has 64 elements", "[60, 70)"});
  // A critic from this actor checkpoint reads its fresh head from value_head_init.
  LoadOptions critic;
  critic.head = HeadKind::kValue;
  PretrainedSource as_critic(dir.str(), critic);
  EXPECT_TRUE(torch::equal(as_critic.read("score.weight", 0, 64, torch::kFloat32, torch::kCPU),
                           value_head_init(as_critic.config()).reshape({-1})));
}

}  // namespace
}  // namespace rlhf::models
