// HF config.json <-> ModelConfig, and the init-model presets: the fields every family shares
// (sizes, RoPE, token ids, dtype, heads); each family's own fields are read and written by its
// file in models/families/ (models/family.h).
#include "models/config.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/errors.h"
#include "models/config_json.h"
#include "models/family.h"
#include "models/param_layout.h"

namespace rlhf::models {

namespace {

using nlohmann::json;

using config_json::get_or;
using config_json::require;

// First id of a token-id field that may be a number or a list (Llama 3's eos_token_id).
int64_t token_id(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return -1;
  if (it->is_array()) return it->empty() ? -1 : (*it)[0].get<int64_t>();
  return it->get<int64_t>();
}

}  // namespace

namespace config_json {

void read_rope(const json& top, const json& params, const std::string& where, double default_theta,
               int64_t max_positions, double& theta, RopeScaling& r) {
  for (const auto& [name, value] : params.items()) {
    if (value.is_object())
      throw InputError(where + " holds per-layer-type parameters (\"" + name +
                       "\": {...}); only one RoPE for every layer is supported");
  }
  theta = get_or<double>(params, "rope_theta",
                         get_or<double>(top, "rope_theta", default_theta, where), where);
  const double partial =
      get_or<double>(params, "partial_rotary_factor",
                     get_or<double>(top, "partial_rotary_factor", 1.0, where), where);
  if (partial != 1.0)
    throw InputError(where + ": partial_rotary_factor " + json(partial).dump() +
                     " is not supported (rotary embeddings cover the whole head_dim)");
  const std::string type = get_or<std::string>(
      params, "rope_type", get_or<std::string>(params, "type", "default", where), where);
  r = RopeScaling{};
  if (type == "default") return;
  if (type == "linear") {
    r.type = RopeScalingType::kLinear;
    r.factor = require<double>(params, "factor", where);
  } else if (type == "llama3") {
    r.type = RopeScalingType::kLlama3;
    r.factor = require<double>(params, "factor", where);
    r.low_freq_factor = require<double>(params, "low_freq_factor", where);
    r.high_freq_factor = require<double>(params, "high_freq_factor", where);
    // transformers: a top-level original_max_position_embeddings wins, then the dict's,
    // then max_position_embeddings.
    r.original_max_position_embeddings = get_or<int64_t>(
        top, "original_max_position_embeddings",
        get_or<int64_t>(params, "original_max_position_embeddings", max_positions, where), where);
    if (r.high_freq_factor <= r.low_freq_factor)
      throw InputError(where + ": high_freq_factor must exceed low_freq_factor");
  } else {
    throw InputError(where + " type \"" + type +
                     "\" is not supported (supported: default, linear, llama3)");
  }
}

json rope_json(double theta, const RopeScaling& r) {
  json rope = {{"rope_type", "default"}};
  if (r.type == RopeScalingType::kLinear) {
    rope = {{"rope_type", "linear"}, {"factor", r.factor}};
  } else if (r.type == RopeScalingType::kLlama3) {
    rope = {{"rope_type", "llama3"},
            {"factor", r.factor},
            {"low_freq_factor", r.low_freq_factor},
            {"high_freq_factor", r.high_freq_factor},
            {"original_max_position_embeddings", r.original_max_position_embeddings}};
  }
  rope["rope_theta"] = theta;
  return rope;
}

}  // namespace config_json

namespace {

// RoPE as transformers 5 reads it: "rope_parameters" (rope_type, rope_theta and the scaling
// fields; what transformers 5 writes) or the older "rope_scaling" plus top-level
// "rope_theta". A non-empty rope_scaling wins over rope_parameters, and a rope_theta inside
// the dict over the top-level one (transformers' convert_rope_params_to_dict). Sets
// c.rope_theta and c.rope_scaling; needs c.max_position_embeddings. A family with RoPE of
// its own (ModelFamily::read_rope) reads it instead.
void parse_rope(const json& j, ModelConfig& c, const std::string& source) {
  std::string key = "rope_parameters";
  json params = json::object();
  for (const char* k : {"rope_scaling", "rope_parameters"}) {
    auto it = j.find(k);
    if (it == j.end() || it->is_null()) continue;
    if (!it->is_object()) throw InputError(source + ": " + k + " must be an object or null");
    if (it->empty()) continue;
    params = *it;
    key = k;
    break;
  }
  config_json::read_rope(j, params, source + ": " + key, 10000.0, c.max_position_embeddings,
                         c.rope_theta, c.rope_scaling);
}

void parse_architectures(const json& j, ModelConfig& c, const ModelFamily& family,
                         const std::string& source) {
  c.architectures = get_or<std::vector<std::string>>(j, "architectures", {}, source);
  const std::string lm_class = family.causal_lm_class();
  const std::string value_class = family.value_model_class();
  c.head = HeadKind::kLanguageModel;
  for (const auto& a : c.architectures) {
    if (a == lm_class) continue;
    if (a == value_class) {
      c.head = HeadKind::kValue;
      continue;
    }
    throw InputError(source + ": architecture \"" + a + "\" is not supported for model_type \"" +
                     c.model_type + "\" (supported: " + lm_class + ", " + value_class + ")");
  }
  if (c.architectures.empty()) c.architectures = {lm_class};
  if (j.contains("value_head_prefix")) {
    c.value_head_prefix = get_or<std::string>(j, "value_head_prefix", "score", source);
    c.head = HeadKind::kValue;
  }
  if (c.head == HeadKind::kValue) {
    int64_t labels = j.contains("id2label") && j["id2label"].is_object() ? j["id2label"].size() : 1;
    labels = get_or<int64_t>(j, "num_labels", labels, source);
    if (labels != 1)
      throw InputError(source + ": a value head has 1 output; config has " +
                       std::to_string(labels) + " labels");
  }
}

}  // namespace

ModelConfig ModelConfig::from_json_text(const std::string& text, const std::string& source) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw InputError(source + ": not valid JSON: " + e.what());
  }
  if (!j.is_object()) throw InputError(source + ": expected a JSON object");
  ModelConfig c;
  c.original_json = text;
  c.model_type = require<std::string>(j, "model_type", source);
  const ModelFamily& family = model_family(c.model_type, source);
  parse_architectures(j, c, family, source);
  const std::string act = get_or<std::string>(j, "hidden_act", "silu", source);
  if (!family.own_activation && act != "silu" && act != "swish")
    throw InputError(source + ": hidden_act \"" + act + "\" is not supported (supported: silu)");
  c.hidden_size = require<int64_t>(j, "hidden_size", source);
  c.intermediate_size = require<int64_t>(j, "intermediate_size", source);
  c.num_hidden_layers = require<int64_t>(j, "num_hidden_layers", source);
  c.num_attention_heads = require<int64_t>(j, "num_attention_heads", source);
  c.num_key_value_heads = get_or<int64_t>(j, "num_key_value_heads", c.num_attention_heads, source);
  c.vocab_size = require<int64_t>(j, "vocab_size", source);
  // transformers' default; a family may have its own (Qwen3: 128 whatever the hidden size).
  c.head_dim = get_or<int64_t>(
      j, "head_dim", c.num_attention_heads > 0 ? c.hidden_size / c.num_attention_heads : 0, source);
  c.rms_norm_eps = get_or<double>(j, "rms_norm_eps", 1e-6, source);
  c.max_position_embeddings = get_or<int64_t>(j, "max_position_embeddings", 2048, source);
  if (family.read_rope)
    family.read_rope(j, c, source);
  else
    parse_rope(j, c, source);
  c.tie_word_embeddings = get_or<bool>(j, "tie_word_embeddings", false, source);
  c.initializer_range = get_or<double>(j, "initializer_range", 0.02, source);
  // transformers 5 writes "dtype" and prefers it over the older "torch_dtype".
  c.torch_dtype = get_or<std::string>(
      j, "dtype", get_or<std::string>(j, "torch_dtype", "float32", source), source);
  family.read(j, c, source);  // the family's own fields (models/families/)
  if (get_or<double>(j, "attention_dropout", 0.0, source) != 0.0)
    throw InputError(
        source +
        ": attention_dropout > 0 is not supported (checkpointed training replays no dropout)");
  c.bos_token_id = token_id(j, "bos_token_id");
  c.eos_token_id = token_id(j, "eos_token_id");
  c.pad_token_id = token_id(j, "pad_token_id");
  c.validate(source);
  return c;
}

ModelConfig ModelConfig::from_json_file(const std::string& path) {
  std::filesystem::path p(path);
  if (std::filesystem::is_directory(p)) p /= "config.json";
  std::ifstream in(p);
  if (!in) throw InputError(p.string() + ": cannot open model config");
  std::stringstream text;
  text << in.rdbuf();
  return from_json_text(text.str(), p.string());
}

void ModelConfig::validate(const std::string& source) const {
  auto positive = [&](int64_t v, const char* key) {
    if (v <= 0)
      throw InputError(source + ": " + key + " must be positive, got " + std::to_string(v));
  };
  positive(hidden_size, "hidden_size");
  positive(intermediate_size, "intermediate_size");
  positive(num_hidden_layers, "num_hidden_layers");
  positive(num_attention_heads, "num_attention_heads");
  positive(num_key_value_heads, "num_key_value_heads");
  positive(head_dim, "head_dim");
  positive(vocab_size, "vocab_size");
  if (num_attention_heads % num_key_value_heads != 0)
    throw InputError(source + ": num_attention_heads (" + std::to_string(num_attention_heads) +
                     ") must be a multiple of num_key_value_heads (" +
                     std::to_string(num_key_value_heads) + ")");
  if (head_dim % 2 != 0) throw InputError(source + ": head_dim must be even for rotary embeddings");
  const ModelFamily& family = model_family(model_type, source);
  if (qk_norm != family.qk_norm)
    throw InputError(source + ": qk_norm (per-head q/k RMSNorm) is " + (qk_norm ? "set" : "unset") +
                     " for model_type \"" + model_type + "\"; it is " +
                     (family.qk_norm ? "always set" : "never set") + " for that family");
  if (head == HeadKind::kValue && value_head_prefix.find('.') != std::string::npos)
    throw InputError(source + ": value_head_prefix \"" + value_head_prefix +
                     "\" may not contain '.'");
}

std::string ModelConfig::to_json_text() const {
  json j = original_json.empty() ? json::object() : json::parse(original_json);
  const ModelFamily& family = model_family(model_type, "model config");
  j["model_type"] = model_type;
  j["architectures"] = {head == HeadKind::kValue ? family.value_model_class()
                                                 : family.causal_lm_class()};
  j["hidden_act"] = "silu";
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_key_value_heads;
  j["head_dim"] = head_dim;
  j["rms_norm_eps"] = rms_norm_eps;
  // RoPE in both forms: rope_parameters for transformers 5, rope_theta + rope_scaling for
  // older versions (transformers 5 reads rope_scaling first, so both say the same).
  json rope = config_json::rope_json(rope_theta, rope_scaling);
  j["rope_theta"] = rope_theta;
  if (rope_scaling.type == RopeScalingType::kNone) {
    j["rope_scaling"] = nullptr;
  } else {
    j["rope_scaling"] = rope;
    j["rope_scaling"].erase("rope_theta");
  }
  j["rope_parameters"] = rope;
  j["max_position_embeddings"] = max_position_embeddings;
  j["vocab_size"] = vocab_size;
  j["tie_word_embeddings"] = tie_word_embeddings;
  family.write(*this, j);
  j["attention_dropout"] = 0.0;
  j["initializer_range"] = initializer_range;
  j["torch_dtype"] = torch_dtype;
  j["dtype"] = torch_dtype;
  auto put_id = [&](const char* key, int64_t id) {
    if (id >= 0 && !(j.contains(key) && j[key].is_array())) j[key] = id;
  };
  put_id("bos_token_id", bos_token_id);
  put_id("eos_token_id", eos_token_id);
  put_id("pad_token_id", pad_token_id);
  if (head == HeadKind::kValue) {
    j["num_labels"] = 1;
    j["id2label"] = {{"0", "LABEL_0"}};
    j["label2id"] = {{"LABEL_0", 0}};
    if (value_head_prefix != "score") j["value_head_prefix"] = value_head_prefix;
  }
  return j.dump(2) + "\n";
}

int64_t ModelConfig::num_parameters() const {
  return numel_of(parameter_shapes(*this));
}

std::vector<std::string> preset_names() {
  return {"tiny", "tiny-moe", "small", "100m"};
}

ModelConfig preset_config(const std::string& name) {
  ModelConfig c;         // defaults are the tiny preset
  c.bos_token_id = 257;  // the byte tokenizer's <s>, </s>, <pad> (see bytetok format)
  c.eos_token_id = 258;
  c.pad_token_id = 256;
  c.torch_dtype = "bfloat16";
  if (name == "tiny") return c;
  if (name == "tiny-moe") {  // tiny's shape as Qwen3-MoE: 8 experts of 88 rows, top-2, so a
                             // token uses as many MLP rows (176) as tiny's dense MLP
    c.model_type = "qwen3_moe";
    c.architectures = {"Qwen3MoeForCausalLM"};
    c.qk_norm = true;
    c.moe.num_experts = 8;
    c.moe.num_experts_per_tok = 2;
    c.moe.moe_intermediate_size = 88;
    c.moe.norm_topk_prob = true;
    return c;
  }
  if (name == "small") {  // ~3.5M parameters
    c.hidden_size = 256;
    c.intermediate_size = 688;
    c.num_hidden_layers = 4;
    c.num_attention_heads = 8;
    c.num_key_value_heads = 4;
    c.head_dim = 32;
    return c;
  }
  if (name == "100m") {  // ~100M parameters, Llama-3.2-style tied embeddings
    c.hidden_size = 768;
    c.intermediate_size = 2048;
    c.num_hidden_layers = 12;
    c.num_attention_heads = 12;
    c.num_key_value_heads = 4;
    c.head_dim = 64;
    c.vocab_size = 32000;
    c.tie_word_embeddings = true;
    c.rope_theta = 500000.0;
    return c;
  }
  std::string names;
  for (const auto& n : preset_names()) names += (names.empty() ? "" : ", ") + n;
  throw InputError("unknown model preset \"" + name + "\" (presets: " + names + ")");
}

std::vector<std::string> architecture_names() {
  return {"llama-3-8b", "llama-3-70b", "qwen2.5-7b",    "qwen2.5-32b",
          "mistral-7b", "gemma-3-1b",  "qwen3-30b-a3b", "mixtral-8x7b"};
}

// Architectures given as their published config.json files (the families with fields of
// their own: per-layer kinds, experts), read by the same reader as any model directory.
const std::pair<const char*, const char*> kPublishedConfigs[] = {
    // google/gemma-3-1b-pt's config.json (its sizes and RoPE)
    {"gemma-3-1b", R"({"model_type": "gemma3_text",
        "architectures": ["Gemma3ForCausalLM"], "hidden_size": 1152, "intermediate_size": 6912,
        "num_hidden_layers": 26, "num_attention_heads": 4, "num_key_value_heads": 1,
        "head_dim": 256, "query_pre_attn_scalar": 256, "sliding_window": 512,
        "sliding_window_pattern": 6, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
        "rope_scaling": null, "rms_norm_eps": 1e-06, "max_position_embeddings": 32768,
        "vocab_size": 262144, "hidden_activation": "gelu_pytorch_tanh",
        "attn_logit_softcapping": null, "final_logit_softcapping": null, "bos_token_id": 2,
        "eos_token_id": 1, "pad_token_id": 0, "torch_dtype": "bfloat16"})"},
    // Qwen/Qwen3-30B-A3B's config.json: 128 experts, top-8
    {"qwen3-30b-a3b", R"({"model_type": "qwen3_moe",
        "architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 2048, "intermediate_size": 6144,
        "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8,
        "norm_topk_prob": true, "decoder_sparse_step": 1, "mlp_only_layers": [],
        "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4,
        "head_dim": 128, "attention_bias": false, "rope_theta": 1000000.0, "rope_scaling": null,
        "rms_norm_eps": 1e-06, "max_position_embeddings": 40960, "vocab_size": 151936,
        "tie_word_embeddings": false, "use_sliding_window": false, "router_aux_loss_coef": 0.001,
        "bos_token_id": 151643, "eos_token_id": 151645, "torch_dtype": "bfloat16"})"},
    // mistralai/Mixtral-8x7B-v0.1's config.json: 8 experts, top-2
    {"mixtral-8x7b", R"({"model_type": "mixtral",
        "architectures": ["MixtralForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
        "num_local_experts": 8, "num_experts_per_tok": 2, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-05, "max_position_embeddings": 32768, "vocab_size": 32000,
        "sliding_window": null, "tie_word_embeddings": false, "router_aux_loss_coef": 0.02,
        "router_jitter_noise": 0.0, "bos_token_id": 1, "eos_token_id": 2,
        "torch_dtype": "bfloat16"})"},
};

ModelConfig architecture_config(const std::string& name) {
  for (const auto& [known, json_text] : kPublishedConfigs)
    if (name == known) return ModelConfig::from_json_text(json_text, "architecture " + name);
  ModelConfig c;
  c.torch_dtype = "bfloat16";
  c.tie_word_embeddings = false;
  auto llama3 = [&](int64_t hidden, int64_t inter, int64_t layers, int64_t heads) {
    c.model_type = "llama";
    c.hidden_size = hidden;
    c.intermediate_size = inter;
    c.num_hidden_layers = layers;
    c.num_attention_heads = heads;
    c.num_key_value_heads = 8;
    c.head_dim = 128;
    c.vocab_size = 128256;
    c.rope_theta = 500000.0;
    c.rms_norm_eps = 1e-5;
    c.max_position_embeddings = 8192;
    c.bos_token_id = 128000;
    c.eos_token_id = 128001;
    c.pad_token_id = -1;
  };
  auto qwen25 = [&](int64_t hidden, int64_t inter, int64_t layers, int64_t heads, int64_t kv) {
    c.model_type = "qwen2";
    c.hidden_size = hidden;
    c.intermediate_size = inter;
    c.num_hidden_layers = layers;
    c.num_attention_heads = heads;
    c.num_key_value_heads = kv;
    c.head_dim = 128;
    c.vocab_size = 152064;
    c.qkv_bias = true;
    c.rope_theta = 1000000.0;
    c.rms_norm_eps = 1e-6;
    c.max_position_embeddings = 32768;
    c.bos_token_id = 151643;
    c.eos_token_id = 151643;
    c.pad_token_id = -1;
  };
  if (name == "llama-3-8b") {
    llama3(4096, 14336, 32, 32);
  } else if (name == "llama-3-70b") {
    llama3(8192, 28672, 80, 64);
  } else if (name == "qwen2.5-7b") {
    qwen25(3584, 18944, 28, 28, 4);
  } else if (name == "qwen2.5-32b") {
    qwen25(5120, 27648, 64, 40, 8);
  } else if (name == "mistral-7b") {  // Llama-3-8B's shape with its own vocabulary and RoPE
    llama3(4096, 14336, 32, 32);
    c.model_type = "mistral";
    c.vocab_size = 32768;
    c.rope_theta = 1000000.0;
    c.max_position_embeddings = 32768;
    c.bos_token_id = 1;
    c.eos_token_id = 2;
  } else {
    std::string names;
    for (const auto& n : architecture_names()) names += (names.empty() ? "" : ", ") + n;
    throw InputError("unknown architecture \"" + name + "\" (known: " + names + ")");
  }
  c.validate("architecture " + name);
  return c;
}

ModelConfig model_config_of(const std::string& ref) {
  namespace fs = std::filesystem;
  const std::string prefix = kArchitecturePrefix;
  if (ref.rfind(prefix, 0) == 0) return architecture_config(ref.substr(prefix.size()));
  const fs::path path(ref);
  if (fs::is_regular_file(path)) return ModelConfig::from_json_file(path.string());
  return ModelConfig::from_json_file((path / "config.json").string());
}

}  // namespace rlhf::models
