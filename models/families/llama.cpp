// Llama (transformers' LlamaConfig): attention_bias on q/k/v and o_proj alike, mlp_bias on
// the MLP; full attention.
#include "models/config.h"
#include "models/config_json.h"
#include "models/family.h"

namespace rlhf::models {

namespace {

void read(const nlohmann::json& j, ModelConfig& c, const std::string& source) {
  c.qkv_bias = c.o_proj_bias = config_json::get_or<bool>(j, "attention_bias", false, source);
  c.mlp_bias = config_json::get_or<bool>(j, "mlp_bias", false, source);
}

void write(const ModelConfig& c, nlohmann::json& j) {
  j["attention_bias"] = c.qkv_bias;
  j["mlp_bias"] = c.mlp_bias;
}

}  // namespace

const ModelFamily& llama_family() {
  static const ModelFamily family{"llama", "Llama", "LlamaConfig", false,
                                  read,    write,   uniform_layer};
  return family;
}

}  // namespace rlhf::models
