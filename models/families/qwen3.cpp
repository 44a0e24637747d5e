// Qwen3, dense (transformers' Qwen3Config): attention_bias on q/k/v and o_proj alike, an
// RMSNorm on every q and k head before RoPE, the MLP never biased; head_dim 128 unless given
// (whatever the hidden size); full attention only.
#include "models/config.h"
#include "models/config_json.h"
#include "models/families/qwen_window.h"
#include "models/family.h"

namespace rlhf::models {

namespace {

void read(const nlohmann::json& j, ModelConfig& c, const std::string& source) {
  c.head_dim = config_json::get_or<int64_t>(j, "head_dim", 128, source);
  c.qkv_bias = c.o_proj_bias = config_json::get_or<bool>(j, "attention_bias", false, source);
  c.qk_norm = true;
  refuse_qwen_sliding_window(j, c, source);
}

void write(const ModelConfig& c, nlohmann::json& j) {
  j["attention_bias"] = c.qkv_bias;
}

}  // namespace

const ModelFamily& qwen3_family() {
  static const ModelFamily family{"qwen3", "Qwen3", "Qwen3Config", true,
                                  read,    write,   uniform_layer};
  return family;
}

}  // namespace rlhf::models
