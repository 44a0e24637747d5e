// A model family: what one transformers model_type means to rlhf. Each family lives in a file
// of its own (models/families/NAME.cpp): the config.json fields it reads beyond the shared
// ones (sizes, RoPE, token ids, dtype: models/config.cpp), what it writes back, its class
// names, and what each decoder layer is made of (LayerSpec). Weight names are HF's Llama
// names for every family here, plus Gemma's two extra norms and the mixture-of-experts blocks
// (models/param_layout.cpp lays them out from the LayerSpec).
// A new family is a new file and one line in models/family.cpp.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "models/layer_spec.h"

namespace rlhf::models {

struct ModelConfig;

struct ModelFamily {
  using ReadFn = void (*)(const nlohmann::json& j, ModelConfig& c, const std::string& source);
  using WriteFn = void (*)(const ModelConfig& c, nlohmann::json& j);
  using LayerFn = LayerSpec (*)(const ModelConfig& c, int64_t layer);
  ModelFamily(std::string model_type, std::string class_prefix, std::string reference, bool qk_norm,
              ReadFn read, WriteFn write, LayerFn layer)
      : model_type(std::move(model_type)),
        class_prefix(std::move(class_prefix)),
        reference(std::move(reference)),
        qk_norm(qk_norm),
        read(read),
        write(write),
        layer(layer) {}

  std::string model_type;    // config.json's model_type: "llama"
  std::string class_prefix;  // transformers' <prefix>ForCausalLM / ForSequenceClassification
  std::string reference;     // the transformers config class whose fields these are
  // Every layer has per-head q/k RMSNorms (a fact of the family, checked by validate()).
  bool qk_norm = false;
  // Its own config.json fields into c (the shared ones are read already; head_dim is there
  // with transformers' default hidden_size / num_attention_heads). InputError names the key.
  ReadFn read = nullptr;
  // Its own fields back into j (the shared ones are written already).
  WriteFn write = nullptr;
  // Layer `layer` of a model of config c.
  LayerFn layer = nullptr;
  // Its RoPE fields (sets rope_theta, rope_scaling and any of its own), read instead of the
  // shared reader; null: the shared one (one RoPE for every layer).
  ReadFn read_rope = nullptr;
  // The final norm scales by (1 + weight) like its layers' (LayerSpec::norm_unit_offset).
  bool norm_unit_offset = false;
  // The embedding's output is multiplied by sqrt(hidden_size), rounded to the compute dtype
  // (Gemma's scaled word embedding).
  bool scale_embeddings = false;
  // It checks its activation key itself (the shared reader refuses any hidden_act but silu).
  bool own_activation = false;
  // Its value-model class, when not <class_prefix>ForSequenceClassification.
  std::string value_class;

  std::string causal_lm_class() const { return class_prefix + "ForCausalLM"; }
  std::string value_model_class() const {
    return value_class.empty() ? class_prefix + "ForSequenceClassification" : value_class;
  }
};

// The family of `model_type`; InputError naming `source` for a mixture-of-experts type whose
// routing rlhf does not implement (DeepSeek's, OLMoE's, ...) or an unknown one, listing the
// supported types.
const ModelFamily& model_family(const std::string& model_type, const std::string& source);
std::vector<std::string> model_family_names();  // "llama", "mistral", ..., "gemma3_text"

// The families, one per file in models/families/.
const ModelFamily& llama_family();
const ModelFamily& mistral_family();
const ModelFamily& qwen2_family();
const ModelFamily& qwen3_family();
const ModelFamily& gemma3_family();
const ModelFamily& qwen3_moe_family();
const ModelFamily& qwen2_moe_family();
const ModelFamily& mixtral_family();

// Every family here builds each layer alike from the config's flags: what layer() returns
// for them.
LayerSpec uniform_layer(const ModelConfig& c, int64_t layer);

}  // namespace rlhf::models
