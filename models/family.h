// A model family: what one transformers model_type means to rlhf. Each family lives in a file
// of its own (models/families/NAME.cpp): the config.json fields it reads beyond the shared
// ones (sizes, RoPE, token ids, dtype: models/config.cpp), what it writes back, its class
// names, and what each decoder layer is made of (LayerSpec). Weight names are HF's Llama
// names for every family here (models/param_layout.cpp lays them out from the LayerSpec).
// A new dense family is a new file and one line in models/family.cpp.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "models/layer_spec.h"

namespace rlhf::models {

struct ModelConfig;

struct ModelFamily {
  std::string model_type;    // config.json's model_type: "llama"
  std::string class_prefix;  // transformers' <prefix>ForCausalLM / ForSequenceClassification
  std::string reference;     // the transformers config class whose fields these are
  // Every layer has per-head q/k RMSNorms (a fact of the family, checked by validate()).
  bool qk_norm = false;
  // Its own config.json fields into c (the shared ones are read already; head_dim is there
  // with transformers' default hidden_size / num_attention_heads). InputError names the key.
  void (*read)(const nlohmann::json& j, ModelConfig& c, const std::string& source) = nullptr;
  // Its own fields back into j (the shared ones are written already).
  void (*write)(const ModelConfig& c, nlohmann::json& j) = nullptr;
  // Layer `layer` of a model of config c.
  LayerSpec (*layer)(const ModelConfig& c, int64_t layer) = nullptr;
};

// The family of `model_type`; InputError naming `source` for a mixture-of-experts type (not
// supported yet) or an unknown one, listing the supported types.
const ModelFamily& model_family(const std::string& model_type, const std::string& source);
std::vector<std::string> model_family_names();  // "llama", "mistral", "qwen2", "qwen3"

// The families, one per file in models/families/.
const ModelFamily& llama_family();
const ModelFamily& mistral_family();
const ModelFamily& qwen2_family();
const ModelFamily& qwen3_family();

// Every family here builds each layer alike from the config's flags: what layer() returns
// for them.
LayerSpec uniform_layer(const ModelConfig& c, int64_t layer);

}  // namespace rlhf::models
