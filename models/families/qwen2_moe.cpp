// Qwen2-MoE (transformers' Qwen2MoeConfig: Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): Qwen2's
// attention (q/k/v biased: qkv_bias, default true; o_proj never) and, on the sparse layers,
// top-k softmax routing plus a shared expert on every token, scaled by
// sigmoid(shared_expert_gate(x)).
#include "models/config.h"
#include "models/config_json.h"
#include "models/families/moe_fields.h"
#include "models/families/qwen_window.h"
#include "models/family.h"

namespace rlhf::models {

namespace {

void read(const nlohmann::json& j, ModelConfig& c, const std::string& source) {
  c.qkv_bias = config_json::get_or<bool>(j, "qkv_bias", true, source);
  c.o_proj_bias = false;
  refuse_qwen_sliding_window(j, c, source);
  read_moe_fields(j, c, source, MoeFlavor::kQwen2);
}

void write(const ModelConfig& c, nlohmann::json& j) {
  j["qkv_bias"] = c.qkv_bias;
  write_moe_fields(c, j, MoeFlavor::kQwen2);
}

LayerSpec layer(const ModelConfig& c, int64_t i) {
  return moe_layer(c, i, MoeFlavor::kQwen2);
}

}  // namespace

const ModelFamily& qwen2_moe_family() {
  static const ModelFamily family{"qwen2_moe", "Qwen2Moe", "Qwen2MoeConfig", false, read,
                                  write,       layer};
  return family;
}

}  // namespace rlhf::models
