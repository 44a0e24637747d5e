// config.json parsing: the fields the model honours, and clear errors for what it cannot.
#include "models/config.h"

#include "core/errors.h"
#include "models/causal_lm.h"
#include "test_paths.h"
#include "test_util.h"

namespace rlhf::models {
namespace {

using testing::expect_error;

const std::string kFixtures = std::string(RLHF_SOURCE_DIR) + "/tests/fixtures/llama_tiny/";

std::string with(const std::string& extra) {
  return R"({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
      "num_hidden_layers": 2,
             "num_attention_heads": 4, "vocab_size": 100)" +
         extra + "}";
}

TEST(ModelConfig, ReadsTheFixtureConfigs) {
  auto gqa = ModelConfig::from_json_file(kFixtures + "llama_gqa");
  EXPECT_EQ(gqa.num_key_value_heads, 2);
  EXPECT_EQ(gqa.head_dim, 8);  // hidden / heads when not given
  EXPECT_EQ(gqa.head, HeadKind::kLanguageModel);
  EXPECT_FALSE(gqa.qkv_bias);

  auto qwen = ModelConfig::from_json_file(kFixtures + "qwen2_tied_bias/config.json");
  EXPECT_TRUE(qwen.qkv_bias);      // Qwen2 always biases q/k/v ...
  EXPECT_FALSE(qwen.o_proj_bias);  // ... and never o_proj
  EXPECT_TRUE(qwen.tie_word_embeddings);
  EXPECT_DOUBLE_EQ(qwen.rope_theta, 1e6);

  auto value = ModelConfig::from_json_file(kFixtures + "llama3_value");
  EXPECT_EQ(value.head, HeadKind::kValue);
  EXPECT_EQ(value.value_head_prefix, "score");
  EXPECT_EQ(value.head_dim, 16);
  EXPECT_EQ(value.rope_scaling.type, RopeScalingType::kLlama3);
  EXPECT_DOUBLE_EQ(value.rope_scaling.factor, 8.0);
  EXPECT_EQ(value.rope_scaling.original_max_position_embeddings, 32);
  EXPECT_TRUE(value.qkv_bias && value.o_proj_bias && value.mlp_bias);
}

TEST(ModelConfig, DefaultsAndTokenIds) {
  auto c = ModelConfig::from_json_text(
      with(R"(, "eos_token_id": [128001, 128009], "bos_token_id": 1)"), "cfg");
  EXPECT_EQ(c.num_key_value_heads, 4);  // defaults to num_attention_heads
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.eos_token_id, 128001);  // Llama 3 lists several; the first is kept
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_FALSE(c.tie_word_embeddings);  // LlamaConfig's default, not PretrainedConfig's
}

TEST(ModelConfig, MistralSlidingWindowAndQwen2Defaults) {
  auto m = ModelConfig::from_json_text(
      R"({"model_type": "mistral", "architectures": ["MistralForCausalLM"],
      "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
      "num_key_value_heads": 2, "vocab_size": 100, "sliding_window": 4096})",
      "m");
  EXPECT_EQ(m.sliding_window, 4096);
  auto null_window = ModelConfig::from_json_text(R"({"model_type": "mistral", "hidden_size": 64,
      "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100,
      "sliding_window": null})",
                                                 "m");
  EXPECT_EQ(null_window.sliding_window, 0);
  expect_error<InputError>(
      [] {
        ModelConfig::from_json_text(R"({"model_type": "qwen2", "hidden_size": 64,
      "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100,
      "use_sliding_window": true})",
                                    "q");
      },
      {"use_sliding_window"});
}

TEST(ModelConfig, UnsupportedOptionsAreErrorsNamingThem) {
  expect_error<InputError>(
      [] { ModelConfig::from_json_text(R"({"model_type": "gpt2"})", "cfg.json"); },
      {"cfg.json", "model_type \"gpt2\"", "llama, mistral, qwen2"});
  expect_error<InputError>(
      [] {
        ModelConfig::from_json_text(with(R"(, "architectures": ["LlamaForTokenClassification"])"),
                                    "c");
      },
      {"LlamaForTokenClassification"});
  expect_error<InputError>(
      [] { ModelConfig::from_json_text(with(R"(, "hidden_act": "gelu")"), "c"); },
      {"hidden_act \"gelu\""});
  expect_error<InputError>(
      [] {
        ModelConfig::from_json_text(with(R"(, "rope_scaling": {"rope_type": "yarn", "factor": 4})"),
                                    "c");
      },
      {"rope_scaling type \"yarn\""});
  expect_error<InputError>(
      [] {
        ModelConfig::from_json_text(with(R"(, "rope_scaling": {"type": "dynamic", "factor": 2})"),
                                    "c");
      },
      {"\"dynamic\""});
  expect_error<InputError>(
      [] { ModelConfig::from_json_text(with(R"(, "num_key_value_heads": 3)"), "c"); },
      {"multiple of num_key_value_heads"});
  expect_error<InputError>(
      [] { ModelConfig::from_json_text(with(R"(, "attention_dropout": 0.1)"), "c"); },
      {"attention_dropout"});
  expect_error<InputError>(
      [] { ModelConfig::from_json_text(R"({"model_type": "llama", "hidden_size": 64})", "c"); },
      {"missing required key \"intermediate_size\""});
  expect_error<InputError>(
      [] { ModelConfig::from_json_text(with(R"(, "hidden_size": "big")"), "c"); },
      {"\"hidden_size\"", "wrong type"});  // a duplicate key: the last one wins
}

TEST(ModelConfig, JsonRoundTripKeepsEveryField) {
  auto c = ModelConfig::from_json_file(kFixtures + "llama3_value");
  auto back = ModelConfig::from_json_text(c.to_json_text(), "roundtrip");
  EXPECT_EQ(back.to_json_text(), c.to_json_text());
  EXPECT_EQ(back.head, HeadKind::kValue);
  EXPECT_EQ(back.rope_scaling.type, RopeScalingType::kLlama3);
  EXPECT_DOUBLE_EQ(back.rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(back.head_dim, 16);
}

TEST(ModelConfig, PresetParameterCountsMatchTheModel) {
  for (const auto& name : {"tiny", "small"}) {
    ModelConfig c = preset_config(name);
    CausalLM model(c);
    int64_t n = 0;
    for (const auto& p : model.parameters()) n += p.numel();
    EXPECT_EQ(n, c.num_parameters()) << name;
  }
  ModelConfig big = preset_config("100m");
  EXPECT_NEAR(static_cast<double>(big.num_parameters()), 100e6, 5e6);  // "~100M" as promised
  EXPECT_EQ(preset_config("tiny").vocab_size, 288);  // byte tokenizer: 259 ids, rounded up
  expect_error<InputError>([] { preset_config("huge"); }, {"\"huge\"", "tiny, small, 100m"});
}

}  // namespace
}  // namespace rlhf::models
