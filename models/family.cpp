#include "models/family.h"

#include "core/errors.h"
#include "models/config.h"

namespace rlhf::models {

namespace {

// Mixture-of-experts types transformers names whose routing or attention rlhf does not
// implement; refused as such, not as unknown.
const char* const kOtherMoeModelTypes[] = {
    "deepseek_v2", "deepseek_v3", "kimi_k2",  "olmoe",   "phimoe",  "granitemoe",    "dbrx",
    "jamba",       "qwen3_next",  "glm4_moe", "gpt_oss", "minimax", "hunyuan_v1_moe"};

const std::vector<const ModelFamily*>& families() {
  static const std::vector<const ModelFamily*> all = {
      &llama_family(),  &mistral_family(),   &qwen2_family(),     &qwen3_family(),
      &gemma3_family(), &qwen3_moe_family(), &qwen2_moe_family(), &mixtral_family()};
  return all;
}

std::string supported_list() {
  std::string out;
  for (const auto* f : families()) out += (out.empty() ? "" : ", ") + f->model_type;
  return out;
}

}  // namespace

const ModelFamily& model_family(const std::string& model_type, const std::string& source) {
  for (const auto* f : families())
    if (f->model_type == model_type) return *f;
  for (const char* t : kOtherMoeModelTypes)
    if (model_type == t)
      throw InputError(source + ": model_type \"" + model_type +
                       "\" is a mixture-of-experts model whose routing is not implemented "
                       "(supported mixtures of experts: qwen3_moe, qwen2_moe, mixtral; all "
                       "supported: " +
                       supported_list() + ")");
  throw InputError(source + ": model_type \"" + model_type +
                   "\" is not supported (supported: " + supported_list() + ")");
}

std::vector<std::string> model_family_names() {
  std::vector<std::string> out;
  for (const auto* f : families()) out.push_back(f->model_type);
  return out;
}

LayerSpec uniform_layer(const ModelConfig& c, int64_t /*layer*/) {
  LayerSpec spec;
  spec.qkv_bias = c.qkv_bias;
  spec.o_proj_bias = c.o_proj_bias;
  spec.mlp_bias = c.mlp_bias;
  spec.qk_norm = c.qk_norm;
  return spec;
}

LayerSpec layer_spec(const ModelConfig& c, int64_t layer) {
  return model_family(c.model_type, "model config").layer(c, layer);
}

int64_t layer_window(const ModelConfig& c, int64_t layer) {
  return layer_spec(c, layer).local_attention ? c.local_window : c.sliding_window;
}

bool has_local_layers(const ModelConfig& c) {
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    if (layer_spec(c, i).local_attention) return true;
  return false;
}

int64_t shortest_window(const ModelConfig& c) {
  int64_t shortest = 0;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const int64_t w = layer_window(c, i);
    if (w > 0 && (shortest == 0 || w < shortest)) shortest = w;
  }
  return shortest;
}

}  // namespace rlhf::models
