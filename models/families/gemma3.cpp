// Gemma 3, text only (transformers' Gemma3TextConfig, model_type "gemma3_text";
// Gemma3ForCausalLM). What differs from Llama, all of it in the LayerSpec this file builds or
// in the family's flags:
// - RMSNorms scale by (1 + weight) in FP32 (Gemma3RMSNorm), four per layer: after attention,
//   before and after the MLP besides the input norm; q/k norms of the same kind.
// - The MLP's activation is gelu with the tanh approximation (hidden_activation).
// - The embedding's output is scaled by sqrt(hidden_size) in the compute dtype.
// - q.k is scaled by query_pre_attn_scalar^-0.5, not head_dim^-0.5.
// - Two kinds of layer (layer_types, else every sliding_window_pattern-th layer is global):
//   "sliding_attention" layers see the last `sliding_window` keys with RoPE base
//   rope_local_base_freq (default RoPE); "full_attention" layers see every key with rope_theta
//   and the config's scaling. transformers 5 writes both RoPEs in rope_parameters, keyed by
//   layer type; older files give rope_theta, rope_local_base_freq and rope_scaling.
// - The head is tied to the embedding unless the file says otherwise.
// Logit soft-capping (Gemma 2's; null in Gemma 3) and bidirectional attention are refused.
#include <cmath>

#include "models/config.h"
#include "models/config_json.h"
#include "models/family.h"

namespace rlhf::models {

namespace {

using config_json::get_or;
using nlohmann::json;

constexpr const char* kSliding = "sliding_attention";
constexpr const char* kFull = "full_attention";

void read_layer_types(const json& j, ModelConfig& c, const std::string& source) {
  c.layer_types = get_or<std::vector<std::string>>(j, "layer_types", {}, source);
  if (c.layer_types.empty()) {
    const int64_t pattern = get_or<int64_t>(j, "sliding_window_pattern", 6, source);
    if (pattern <= 0)
      throw InputError(source + ": sliding_window_pattern must be positive, got " +
                       std::to_string(pattern));
    for (int64_t i = 0; i < c.num_hidden_layers; ++i)
      c.layer_types.push_back((i + 1) % pattern != 0 ? kSliding : kFull);
  }
  if (static_cast<int64_t>(c.layer_types.size()) != c.num_hidden_layers)
    throw InputError(source + ": layer_types has " + std::to_string(c.layer_types.size()) +
                     " entries for " + std::to_string(c.num_hidden_layers) + " layers");
  for (size_t i = 0; i < c.layer_types.size(); ++i) {
    if (c.layer_types[i] != kSliding && c.layer_types[i] != kFull)
      throw InputError(source + ": layer_types[" + std::to_string(i) + "] is \"" +
                       c.layer_types[i] +
                       "\" (expected \"sliding_attention\" or \"full_attention\")");
  }
}

void refuse_unsupported(const json& j, const std::string& source) {
  for (const char* key : {"attn_logit_softcapping", "final_logit_softcapping"}) {
    if (j.contains(key) && !j[key].is_null())
      throw InputError(source + ": " + key + " " + j[key].dump() +
                       " is not supported (logit soft-capping is not implemented; Gemma 3 "
                       "leaves it null)");
  }
  if (get_or<bool>(j, "use_bidirectional_attention", false, source))
    throw InputError(source +
                     ": use_bidirectional_attention=true is not supported (causal LMs only)");
  const std::string act = get_or<std::string>(j, "hidden_activation", "gelu_pytorch_tanh", source);
  if (act != "gelu_pytorch_tanh")
    throw InputError(source + ": hidden_activation \"" + act +
                     "\" is not supported for gemma3_text (supported: gelu_pytorch_tanh)");
  if (j.contains("hidden_act") && !j["hidden_act"].is_null() &&
      j["hidden_act"] != "gelu_pytorch_tanh")
    throw InputError(source + ": hidden_act " + j["hidden_act"].dump() +
                     " is not supported for gemma3_text (supported: gelu_pytorch_tanh)");
}

void read(const json& j, ModelConfig& c, const std::string& source) {
  refuse_unsupported(j, source);
  c.head_dim = get_or<int64_t>(j, "head_dim", 256, source);
  c.qkv_bias = c.o_proj_bias = get_or<bool>(j, "attention_bias", false, source);
  c.qk_norm = true;
  c.tie_word_embeddings = get_or<bool>(j, "tie_word_embeddings", true, source);
  c.query_pre_attn_scalar = get_or<double>(j, "query_pre_attn_scalar", 256.0, source);
  if (c.query_pre_attn_scalar <= 0)
    throw InputError(source + ": query_pre_attn_scalar must be positive");
  c.sliding_window = 0;  // the global layers see every key
  c.local_window = get_or<int64_t>(j, "sliding_window", 4096, source);
  if (c.local_window < 0)
    throw InputError(source + ": sliding_window must be positive or null, got " +
                     std::to_string(c.local_window));
  read_layer_types(j, c, source);
}

// rope_parameters keyed by layer type (transformers 5), or the older top-level fields.
// A non-null rope_scaling applies to the global layers (transformers' convert_rope_params).
void read_rope(const json& j, ModelConfig& c, const std::string& source) {
  json full = json::object(), local = json::object();
  auto params = j.find("rope_parameters");
  if (params != j.end() && params->is_object()) {
    if (params->contains(kFull)) full = (*params)[kFull];
    if (params->contains(kSliding)) local = (*params)[kSliding];
  }
  auto scaling = j.find("rope_scaling");
  if (scaling != j.end() && scaling->is_object())
    for (const auto& [k, v] : scaling->items()) full[k] = v;
  if (!full.contains("rope_theta"))
    full["rope_theta"] = get_or<double>(j, "rope_theta", 1e6, source);
  if (!local.contains("rope_theta"))
    local["rope_theta"] = get_or<double>(j, "rope_local_base_freq", 10000.0, source);
  config_json::read_rope(json::object(), full, source + ": rope_parameters.full_attention", 1e6,
                         c.max_position_embeddings, c.rope_theta, c.rope_scaling);
  RopeScaling local_scaling;
  const std::string local_where = source + ": rope_parameters.sliding_attention";
  config_json::read_rope(json::object(), local, local_where, 10000.0, c.max_position_embeddings,
                         c.rope_local_theta, local_scaling);
  if (local_scaling.type != RopeScalingType::kNone)
    throw InputError(local_where + ": only the default RoPE is supported for sliding layers");
}

void write(const ModelConfig& c, json& j) {
  j.erase("hidden_act");
  j["hidden_activation"] = "gelu_pytorch_tanh";
  j["attention_bias"] = c.qkv_bias;
  j["query_pre_attn_scalar"] = c.query_pre_attn_scalar;
  j["sliding_window"] = c.local_window > 0 ? json(c.local_window) : json(nullptr);
  j["layer_types"] = c.layer_types;
  j["rope_local_base_freq"] = c.rope_local_theta;
  j["rope_parameters"] = {{kFull, config_json::rope_json(c.rope_theta, c.rope_scaling)},
                          {kSliding, config_json::rope_json(c.rope_local_theta, RopeScaling{})}};
  j["attn_logit_softcapping"] = nullptr;
  j["final_logit_softcapping"] = nullptr;
}

LayerSpec layer(const ModelConfig& c, int64_t i) {
  LayerSpec spec = uniform_layer(c, i);
  spec.activation = Activation::kGeluTanh;
  spec.norm_unit_offset = true;
  spec.sandwich_norms = true;
  spec.local_attention =
      i < static_cast<int64_t>(c.layer_types.size()) && c.layer_types[i] == kSliding;
  spec.attention_scale =
      1.0 / std::sqrt(c.query_pre_attn_scalar > 0 ? c.query_pre_attn_scalar
                                                  : static_cast<double>(c.head_dim));
  return spec;
}

ModelFamily make_family() {
  ModelFamily f{"gemma3_text", "Gemma3", "Gemma3TextConfig", true, read, write, layer};
  f.read_rope = read_rope;
  f.norm_unit_offset = true;
  f.scale_embeddings = true;
  f.value_class = "Gemma3TextForSequenceClassification";
  f.own_activation = true;
  return f;
}

}  // namespace

const ModelFamily& gemma3_family() {
  static const ModelFamily family = make_family();
  return family;
}

}  // namespace rlhf::models
