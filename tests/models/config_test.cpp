// config.json parsing: the fields the model honours, and clear errors for what it cannot.
#include "models/config.h"

#include <algorithm>

#include "core/errors.h"
#include "models/causal_lm.h"
#include "models/family.h"
#include "models/param_layout.h"
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
      {"cfg.json", "model_type \"gpt2\"", "llama, mistral, qwen2, qwen3"});
  // Mixtures of experts rlhf does not implement are refused as such, not as unknown types.
  expect_error<InputError>(
      [] { ModelConfig::from_json_text(R"({"model_type": "olmoe"})", "moe.json"); },
      {"moe.json", "model_type \"olmoe\"", "mixture-of-experts", "routing is not implemented"});
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

TEST(ModelConfig, RopeAndDtypeAsTransformers5ReadsThem) {
  // transformers 5 writes rope_parameters (theta inside) and "dtype".
  auto c = ModelConfig::from_json_text(
      with(R"(, "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0},
               "dtype": "bfloat16", "torch_dtype": "float16")"),
      "c");
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.rope_scaling.type, RopeScalingType::kNone);
  EXPECT_EQ(c.torch_dtype, "bfloat16");  // "dtype" wins over the older "torch_dtype"
  // A non-empty rope_scaling wins over rope_parameters; the top-level rope_theta fills in
  // a dict without one.
  c = ModelConfig::from_json_text(
      with(R"(, "rope_theta": 1000.0, "rope_scaling": {"type": "linear", "factor": 2.0},
               "rope_parameters": {"rope_type": "default", "rope_theta": 7.0})"),
      "c");
  EXPECT_EQ(c.rope_scaling.type, RopeScalingType::kLinear);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1000.0);
  // llama3 without original_max_position_embeddings: max_position_embeddings (as HF).
  c = ModelConfig::from_json_text(
      with(R"(, "max_position_embeddings": 64, "rope_parameters": {"rope_type": "llama3",
               "rope_theta": 1e4, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0})"),
      "c");
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 64);
  expect_error<InputError>(
      [] {
        ModelConfig::from_json_text(
            with(R"(, "rope_parameters": {"full_attention": {"rope_type": "default"}})"), "c");
      },
      {"rope_parameters", "per-layer-type", "\"full_attention\""});
  expect_error<InputError>(
      [] { ModelConfig::from_json_text(with(R"(, "partial_rotary_factor": 0.5)"), "c"); },
      {"partial_rotary_factor"});
}

TEST(ModelConfig, BiasesOnlyWhereTransformersHasThem) {
  // MistralAttention and MistralMLP have no biases whatever attention_bias says; Qwen2's
  // MLP has none; Llama honours both keys.
  const std::string sizes = R"("hidden_size": 64, "intermediate_size": 128,
      "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100,
      "attention_bias": true, "mlp_bias": true})";
  auto mistral = ModelConfig::from_json_text(R"({"model_type": "mistral", )" + sizes, "m");
  EXPECT_FALSE(mistral.qkv_bias || mistral.o_proj_bias || mistral.mlp_bias);
  auto qwen = ModelConfig::from_json_text(R"({"model_type": "qwen2", )" + sizes, "q");
  EXPECT_TRUE(qwen.qkv_bias);
  EXPECT_FALSE(qwen.o_proj_bias || qwen.mlp_bias);
  auto llama = ModelConfig::from_json_text(R"({"model_type": "llama", )" + sizes, "l");
  EXPECT_TRUE(llama.qkv_bias && llama.o_proj_bias && llama.mlp_bias);
}

TEST(ModelConfig, Qwen3AsQwen3ConfigReadsIt) {
  // Qwen3Config: head_dim defaults to 128 (not hidden_size / heads), attention_bias biases
  // q/k/v and o_proj alike, every layer has per-head q/k norms; its sliding-window keys are
  // Qwen2's and refused the same way.
  const std::string sizes = R"("model_type": "qwen3", "hidden_size": 64,
      "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
      "vocab_size": 100)";
  auto plain = ModelConfig::from_json_text("{" + sizes + "}", "q");
  EXPECT_EQ(plain.head_dim, 128);
  EXPECT_TRUE(plain.qk_norm);
  EXPECT_FALSE(plain.qkv_bias || plain.o_proj_bias || plain.mlp_bias);
  EXPECT_EQ(plain.architectures, std::vector<std::string>{"Qwen3ForCausalLM"});
  auto biased = ModelConfig::from_json_text(
      "{" + sizes + R"(, "head_dim": 32, "attention_bias": true, "mlp_bias": true})", "q");
  EXPECT_EQ(biased.head_dim, 32);
  EXPECT_TRUE(biased.qkv_bias && biased.o_proj_bias);
  EXPECT_FALSE(biased.mlp_bias);  // Qwen3MLP has no bias
  auto back = ModelConfig::from_json_text(biased.to_json_text(), "round trip");
  EXPECT_EQ(back.to_json_text(), biased.to_json_text());
  EXPECT_TRUE(back.qk_norm && back.qkv_bias && back.o_proj_bias);
  auto value = ModelConfig::from_json_text(
      "{" + sizes + R"(, "architectures": ["Qwen3ForSequenceClassification"], "num_labels": 1})",
      "v");
  EXPECT_EQ(value.head, HeadKind::kValue);
  expect_error<InputError>(
      [&] { ModelConfig::from_json_text("{" + sizes + R"(, "use_sliding_window": true})", "q"); },
      {"use_sliding_window", "qwen3"});
  expect_error<InputError>(
      [&] {
        ModelConfig::from_json_text(
            "{" + sizes + R"(, "layer_types": ["full_attention", "sliding_attention"]})", "q");
      },
      {"layer_types[1]", "qwen3"});
  // The per-head norms belong to qwen3 alone: a config built in code cannot disagree.
  ModelConfig llama = preset_config("tiny");
  llama.qk_norm = true;
  expect_error<InputError>([&] { llama.validate("built"); }, {"built", "qk_norm"});
  ModelConfig qwen3 = plain;
  qwen3.qk_norm = false;
  expect_error<InputError>([&] { qwen3.validate("built"); }, {"qk_norm", "qwen3"});
}

// Each family is a file (models/families/) that reads its own fields and says what each layer
// is made of; the layer the model builds and the layout the loader and planner read are both
// that LayerSpec, named as transformers names the parameters.
TEST(ModelFamily, EachFamilyBuildsItsLayersAsItsLayerSpecSays) {
  EXPECT_EQ(model_family_names(),
            (std::vector<std::string>{"llama", "mistral", "qwen2", "qwen3", "gemma3_text",
                                      "qwen3_moe", "qwen2_moe", "mixtral"}));
  struct Expected {
    std::string type;
    LayerSpec spec;
  };
  // With attention_bias and mlp_bias both true in the file.
  const std::vector<Expected> table = {
      {"llama", {true, true, true, false}},       {"mistral", {false, false, false, false}},
      {"qwen2", {true, false, false, false}},     {"qwen3", {true, true, false, true}},
      {"gemma3_text", {true, true, false, true}}, {"qwen3_moe", {true, true, false, true}},
      {"qwen2_moe", {true, false, false, false}}, {"mixtral", {false, false, false, false}}};
  for (const auto& e : table) {
    const auto c = ModelConfig::from_json_text(
        R"({"model_type": ")" + e.type + R"(", "hidden_size": 32, "intermediate_size": 64,
            "num_hidden_layers": 2, "num_attention_heads": 4, "head_dim": 8, "vocab_size": 50,
            "attention_bias": true, "mlp_bias": true, "num_experts": 4, "num_local_experts": 4,
            "num_experts_per_tok": 2, "moe_intermediate_size": 16,
            "shared_expert_intermediate_size": 24})",
        e.type);
    EXPECT_EQ(model_family(e.type, "t").causal_lm_class(), c.architectures.at(0));
    for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer) {
      const LayerSpec got = layer_spec(c, layer);
      EXPECT_EQ(got.qkv_bias, e.spec.qkv_bias) << e.type;
      EXPECT_EQ(got.o_proj_bias, e.spec.o_proj_bias) << e.type;
      EXPECT_EQ(got.mlp_bias, e.spec.mlp_bias) << e.type;
      EXPECT_EQ(got.qk_norm, e.spec.qk_norm) << e.type;
    }
    // The model's parameters of layer 1 are exactly the layout's, whose names follow the spec.
    CausalLM model(c);
    std::vector<std::string> built, laid_out;
    for (const auto& p : model.named_parameters())
      if (p.key().rfind("model.layers.1.", 0) == 0) built.push_back(p.key());
    const auto units = parameter_units(c);  // [embedding, layer 0, layer 1, head]
    for (const auto& [name, shape] : units.at(2)) laid_out.push_back(name);
    std::sort(built.begin(), built.end());
    std::sort(laid_out.begin(), laid_out.end());
    EXPECT_EQ(built, laid_out) << e.type;
    auto has = [&](const std::string& name) {
      return std::find(laid_out.begin(), laid_out.end(), "model.layers.1." + name) !=
             laid_out.end();
    };
    EXPECT_EQ(has("self_attn.q_norm.weight"), e.spec.qk_norm) << e.type;
    EXPECT_EQ(has("self_attn.k_proj.bias"), e.spec.qkv_bias) << e.type;
    EXPECT_EQ(has("self_attn.o_proj.bias"), e.spec.o_proj_bias) << e.type;
    EXPECT_EQ(has("mlp.down_proj.bias"), e.spec.mlp_bias) << e.type;
    // The mixtures of experts: every layer sparse here, each expert a tensor of its own.
    EXPECT_EQ(layer_spec(c, 1).moe.sparse(),
              e.type.find("moe") != std::string::npos || e.type == "mixtral")
        << e.type;
    EXPECT_EQ(has("mlp.experts.3.down_proj.weight"), e.type == "qwen3_moe" || e.type == "qwen2_moe")
        << e.type;
    EXPECT_EQ(has("block_sparse_moe.experts.3.w2.weight"), e.type == "mixtral") << e.type;
    EXPECT_EQ(has("mlp.shared_expert_gate.weight"), e.type == "qwen2_moe") << e.type;
    EXPECT_EQ(has("pre_feedforward_layernorm.weight"), e.type == "gemma3_text") << e.type;
    EXPECT_EQ(has("post_feedforward_layernorm.weight"), e.type == "gemma3_text") << e.type;
  }
  expect_error<InputError>([] { model_family("gemma2", "m/config.json"); },
                           {"m/config.json", "\"gemma2\" is not supported",
                            "llama, mistral, qwen2, qwen3, gemma3_text"});
  expect_error<InputError>([] { model_family("deepseek_v3", "m/config.json"); },
                           {"mixture-of-experts", "routing is not implemented",
                            "qwen3_moe, qwen2_moe, mixtral", "llama, mistral"});
}

// Gemma 3's published config.json files predate transformers 5: rope_theta,
// rope_local_base_freq and rope_scaling at the top, layer kinds from sliding_window_pattern.
TEST(ModelFamily, Gemma3ReadsThePublishedConfigForm) {
  const ModelConfig c = architecture_config("gemma-3-1b");
  EXPECT_EQ(c.model_type, "gemma3_text");
  ASSERT_EQ(c.layer_types.size(), 26u);
  for (int64_t i = 0; i < 26; ++i)  // every 6th layer is global: 5, 11, 17, 23
    EXPECT_EQ(layer_window(c, i), (i + 1) % 6 == 0 ? 0 : 512) << "layer " << i;
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  EXPECT_DOUBLE_EQ(c.rope_local_theta, 10000.0);
  EXPECT_EQ(c.rope_scaling.type, RopeScalingType::kNone);
  EXPECT_TRUE(c.tie_word_embeddings);  // Gemma's default
  // The layout's count by hand from the shapes: embedding 262144 x 1152; per layer q and o
  // 1152 x 1024, k and v 1152 x 256, q/k norms 256 each, MLP 3 x 1152 x 6912, four norms of
  // 1152; the final norm; tied head.
  const int64_t layer = 2 * 1152 * 1024 + 2 * 1152 * 256 + 2 * 256 + 3 * 1152 * 6912 + 4 * 1152;
  EXPECT_EQ(c.num_parameters(), 262144LL * 1152 + 26 * layer + 1152);
  // The written config reads back as the same model, in transformers 5's form.
  const ModelConfig back = ModelConfig::from_json_text(c.to_json_text(), "gemma roundtrip");
  EXPECT_EQ(back.layer_types, c.layer_types);
  EXPECT_EQ(back.local_window, 512);
  EXPECT_EQ(back.to_json_text(), c.to_json_text());
  const auto written = nlohmann::json::parse(c.to_json_text());
  EXPECT_EQ(written["rope_parameters"]["sliding_attention"]["rope_theta"], 10000.0);
  EXPECT_FALSE(written.contains("hidden_act"));
  EXPECT_EQ(written["architectures"][0], "Gemma3ForCausalLM");

  const std::string base = R"({"model_type": "gemma3_text", "hidden_size": 32,
      "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
      "vocab_size": 50, )";
  expect_error<InputError>(
      [&] { ModelConfig::from_json_text(base + R"("attn_logit_softcapping": 50.0})", "g"); },
      {"g: attn_logit_softcapping 50.0", "soft-capping"});
  expect_error<InputError>(
      [&] { ModelConfig::from_json_text(base + R"("layer_types": ["full_attention"]})", "g"); },
      {"g: layer_types has 1 entries for 2 layers"});
  expect_error<InputError>(
      [&] { ModelConfig::from_json_text(base + R"("hidden_activation": "gelu"})", "g"); },
      {"g: hidden_activation \"gelu\"", "gelu_pytorch_tanh"});
  expect_error<InputError>(
      [&] {
        ModelConfig::from_json_text(base + R"("rope_parameters": {"sliding_attention":
            {"rope_type": "linear", "factor": 2.0}}})",
                                    "g");
      },
      {"g: rope_parameters.sliding_attention", "only the default RoPE"});
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
  for (const auto& name : {"tiny", "tiny-moe", "small"}) {
    ModelConfig c = preset_config(name);
    CausalLM model(c);
    int64_t n = 0;
    for (const auto& p : model.parameters()) n += p.numel();
    EXPECT_EQ(n, c.num_parameters()) << name;
  }
  // Qwen3's per-head q/k norms (2 x head_dim per layer), with biases and a head_dim that is
  // not hidden_size / heads.
  ModelConfig qwen3 = preset_config("tiny");
  qwen3.model_type = "qwen3";
  qwen3.architectures = {"Qwen3ForCausalLM"};
  qwen3.qk_norm = qwen3.qkv_bias = qwen3.o_proj_bias = true;
  qwen3.head_dim = 8;
  CausalLM qwen3_model(qwen3);
  int64_t n = 0;
  for (const auto& p : qwen3_model.parameters()) n += p.numel();
  EXPECT_EQ(n, qwen3.num_parameters());
  EXPECT_EQ(qwen3_model.parameter_shapes().size(), qwen3_model.named_parameters().size());
  ModelConfig big = preset_config("100m");
  EXPECT_NEAR(static_cast<double>(big.num_parameters()), 100e6, 5e6);  // "~100M" as promised
  EXPECT_EQ(preset_config("tiny").vocab_size, 288);  // byte tokenizer: 259 ids, rounded up
  expect_error<InputError>([] { preset_config("huge"); },
                           {"\"huge\"", "tiny, tiny-moe, small, 100m"});
}

}  // namespace
}  // namespace rlhf::models
