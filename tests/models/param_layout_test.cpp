// One parameter layout (models/param_layout.h): what CausalLM allocates, unit by unit, is
// what the layout says, for every family's options; counting and the planner read it too.
#include "models/param_layout.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "models/causal_lm.h"

namespace rlhf::models {
namespace {

std::vector<ModelConfig> family_configs() {
  std::vector<ModelConfig> out;
  ModelConfig llama = preset_config("tiny");
  out.push_back(llama);
  ModelConfig tied = llama;
  tied.tie_word_embeddings = true;
  out.push_back(tied);
  ModelConfig qwen2 = llama;  // q, k, v biases
  qwen2.model_type = "qwen2";
  qwen2.architectures = {"Qwen2ForCausalLM"};
  qwen2.qkv_bias = true;
  out.push_back(qwen2);
  ModelConfig qwen3 = llama;  // per-head q/k norms, a head_dim of its own, every bias
  qwen3.model_type = "qwen3";
  qwen3.architectures = {"Qwen3ForCausalLM"};
  qwen3.qk_norm = qwen3.qkv_bias = qwen3.o_proj_bias = qwen3.mlp_bias = true;
  qwen3.head_dim = 8;
  out.push_back(qwen3);
  ModelConfig value = llama;  // a critic's value head
  value.head = HeadKind::kValue;
  value.value_head_prefix = "value_head";
  out.push_back(value);
  return out;
}

std::string describe(const ModelConfig& c) {
  return c.model_type + (c.tie_word_embeddings ? " tied" : "") +
         (c.head == HeadKind::kValue ? " value head" : "");
}

TEST(ParamLayout, IsWhatTheModelAllocatesUnitByUnit) {
  for (const ModelConfig& c : family_configs()) {
    CausalLM model(c);
    const auto units = parameter_units(c);
    const auto model_units = model.param_units();
    ASSERT_EQ(units.size(), model_units.size()) << describe(c);
    for (size_t u = 0; u < units.size(); ++u) {
      ASSERT_EQ(units[u].size(), model_units[u].params.size()) << describe(c) << " unit " << u;
      for (size_t i = 0; i < units[u].size(); ++i) {
        EXPECT_EQ(units[u][i].first, model_units[u].params[i].first) << describe(c);
        EXPECT_EQ(units[u][i].second, model_units[u].params[i].second.sizes().vec())
            << describe(c) << " " << units[u][i].first;
      }
    }
    int64_t allocated = 0;
    for (const auto& p : model.parameters()) allocated += p.numel();
    EXPECT_EQ(numel_of(parameter_shapes(c)), allocated) << describe(c);
    EXPECT_EQ(c.num_parameters(), allocated) << describe(c);
    EXPECT_EQ(model.parameter_shapes(), parameter_shapes(c)) << describe(c);
  }
}

}  // namespace
}  // namespace rlhf::models
