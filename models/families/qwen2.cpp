// Qwen2 / Qwen2.5 (transformers' Qwen2Config): q/k/v always biased, o_proj and the MLP never;
// full attention only (its per-layer sliding windows are refused by name).
#include "models/config.h"
#include "models/config_json.h"
#include "models/families/qwen_window.h"
#include "models/family.h"

namespace rlhf::models {

void refuse_qwen_sliding_window(const nlohmann::json& j, const ModelConfig& c,
                                const std::string& source) {
  if (config_json::get_or<bool>(j, "use_sliding_window", false, source))
    throw InputError(source + ": use_sliding_window=true is not supported for " + c.model_type +
                     " (per-layer sliding-window attention is not implemented; only full "
                     "attention)");
  const auto types = config_json::get_or<std::vector<std::string>>(j, "layer_types", {}, source);
  if (!types.empty() && static_cast<int64_t>(types.size()) != c.num_hidden_layers)
    throw InputError(source + ": layer_types has " + std::to_string(types.size()) +
                     " entries for " + std::to_string(c.num_hidden_layers) + " layers");
  for (size_t i = 0; i < types.size(); ++i) {
    if (types[i] != "full_attention")
      throw InputError(source + ": layer_types[" + std::to_string(i) + "] is \"" + types[i] +
                       "\"; only \"full_attention\" is supported for " + c.model_type);
  }
}

namespace {

void read(const nlohmann::json& j, ModelConfig& c, const std::string& source) {
  c.qkv_bias = true;
  c.o_proj_bias = false;
  refuse_qwen_sliding_window(j, c, source);
}

void write(const ModelConfig& /*c*/, nlohmann::json& /*j*/) {}

}  // namespace

const ModelFamily& qwen2_family() {
  static const ModelFamily family{"qwen2", "Qwen2", "Qwen2Config", false,
                                  read,    write,   uniform_layer};
  return family;
}

}  // namespace rlhf::models
