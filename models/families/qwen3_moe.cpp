// Qwen3-MoE (transformers' Qwen3MoeConfig: Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's attention
// (per-head q/k RMSNorm, attention_bias on q/k/v and o_proj, head_dim 128 unless given) and,
// on the sparse layers, top-k softmax routing over the experts (norm_topk_prob renormalises the
// k weights); decoder_sparse_step and mlp_only_layers leave dense MLPs on the others. No
// shared expert, no router z-loss (Qwen3MoeForCausalLM's only extra loss is the
// load-balancing one, router_aux_loss_coef).
#include "models/config.h"
#include "models/families/moe_fields.h"
#include "models/family.h"

namespace rlhf::models {

namespace {

// Qwen3's own fields (its attention), then the experts'.
void read(const nlohmann::json& j, ModelConfig& c, const std::string& source) {
  qwen3_family().read(j, c, source);
  read_moe_fields(j, c, source, MoeFlavor::kQwen3);
}

void write(const ModelConfig& c, nlohmann::json& j) {
  qwen3_family().write(c, j);
  write_moe_fields(c, j, MoeFlavor::kQwen3);
}

LayerSpec layer(const ModelConfig& c, int64_t i) {
  return moe_layer(c, i, MoeFlavor::kQwen3);
}

}  // namespace

const ModelFamily& qwen3_moe_family() {
  static const ModelFamily family{"qwen3_moe", "Qwen3Moe", "Qwen3MoeConfig", true, read,
                                  write,       layer};
  return family;
}

}  // namespace rlhf::models
