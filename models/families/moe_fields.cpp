#include "models/families/moe_fields.h"

#include <algorithm>

#include "models/config_json.h"
#include "models/family.h"

namespace rlhf::models {

namespace {

using config_json::get_or;
using config_json::require;

void check_moe(const ModelConfig& c, const std::string& source, const char* experts_key) {
  const MoeConfig& m = c.moe;
  auto fail = [&](const std::string& what) { throw InputError(source + ": " + what); };
  if (m.num_experts <= 0)
    fail(std::string(experts_key) + " must be positive, got " + std::to_string(m.num_experts));
  if (m.num_experts_per_tok < 1 || m.num_experts_per_tok > m.num_experts)
    fail("num_experts_per_tok must be between 1 and " + std::string(experts_key) + " (" +
         std::to_string(m.num_experts) + "), got " + std::to_string(m.num_experts_per_tok));
  if (m.moe_intermediate_size <= 0)
    fail("moe_intermediate_size must be positive, got " + std::to_string(m.moe_intermediate_size));
  if (m.decoder_sparse_step < 1)
    fail("decoder_sparse_step must be >= 1, got " + std::to_string(m.decoder_sparse_step));
  for (int64_t layer : m.mlp_only_layers)
    if (layer < 0 || layer >= c.num_hidden_layers)
      fail("mlp_only_layers lists layer " + std::to_string(layer) + " of a model with " +
           std::to_string(c.num_hidden_layers) + " layers");
  if (m.shared_expert_intermediate_size < 0)
    fail("shared_expert_intermediate_size must be >= 0, got " +
         std::to_string(m.shared_expert_intermediate_size));
}

bool sparse_layer(const MoeConfig& m, int64_t layer) {
  return (layer + 1) % m.decoder_sparse_step == 0 &&
         std::find(m.mlp_only_layers.begin(), m.mlp_only_layers.end(), layer) ==
             m.mlp_only_layers.end();
}

}  // namespace

void read_moe_fields(const nlohmann::json& j, ModelConfig& c, const std::string& source,
                     MoeFlavor flavor) {
  MoeConfig& m = c.moe;
  m.num_experts_per_tok = require<int64_t>(j, "num_experts_per_tok", source);
  m.router_aux_loss_coef = get_or<double>(j, "router_aux_loss_coef", 0.001, source);
  if (flavor == MoeFlavor::kMixtral) {
    m.num_experts = require<int64_t>(j, "num_local_experts", source);
    m.moe_intermediate_size = c.intermediate_size;
    m.norm_topk_prob = true;
    const double jitter = get_or<double>(j, "router_jitter_noise", 0.0, source);
    if (jitter != 0.0)
      throw InputError(source + ": router_jitter_noise " + std::to_string(jitter) +
                       " is not supported (the router's training noise would make a "
                       "checkpointed layer's recompute differ from its forward); set it to 0");
    check_moe(c, source, "num_local_experts");
    return;
  }
  // Published Qwen checkpoints say num_experts; transformers 5 writes Qwen3-MoE's as
  // num_local_experts (its attribute_map).
  const char* key = j.contains("num_experts") ? "num_experts" : "num_local_experts";
  m.num_experts = require<int64_t>(j, key, source);
  m.moe_intermediate_size = require<int64_t>(j, "moe_intermediate_size", source);
  m.norm_topk_prob = get_or<bool>(j, "norm_topk_prob", false, source);
  m.decoder_sparse_step = get_or<int64_t>(j, "decoder_sparse_step", 1, source);
  m.mlp_only_layers = get_or<std::vector<int64_t>>(j, "mlp_only_layers", {}, source);
  if (flavor == MoeFlavor::kQwen2)
    m.shared_expert_intermediate_size =
        require<int64_t>(j, "shared_expert_intermediate_size", source);
  check_moe(c, source, key);
}

void write_moe_fields(const ModelConfig& c, nlohmann::json& j, MoeFlavor flavor) {
  const MoeConfig& m = c.moe;
  j["num_experts_per_tok"] = m.num_experts_per_tok;
  j["router_aux_loss_coef"] = m.router_aux_loss_coef;
  if (flavor == MoeFlavor::kMixtral) {
    j["num_local_experts"] = m.num_experts;
    j["router_jitter_noise"] = 0.0;
    return;
  }
  j["num_experts"] = m.num_experts;
  if (j.contains("num_local_experts")) j["num_local_experts"] = m.num_experts;
  j["moe_intermediate_size"] = m.moe_intermediate_size;
  j["norm_topk_prob"] = m.norm_topk_prob;
  j["decoder_sparse_step"] = m.decoder_sparse_step;
  j["mlp_only_layers"] = m.mlp_only_layers;
  if (flavor == MoeFlavor::kQwen2)
    j["shared_expert_intermediate_size"] = m.shared_expert_intermediate_size;
}

LayerSpec moe_layer(const ModelConfig& c, int64_t layer, MoeFlavor flavor) {
  LayerSpec spec = uniform_layer(c, layer);
  const MoeConfig& m = c.moe;
  if (flavor != MoeFlavor::kMixtral && !sparse_layer(m, layer)) return spec;
  spec.moe.experts = m.num_experts;
  spec.moe.top_k = m.num_experts_per_tok;
  spec.moe.intermediate = m.moe_intermediate_size;
  spec.moe.norm_topk = m.norm_topk_prob;
  spec.moe.fp32_weights = flavor == MoeFlavor::kMixtral;
  spec.moe.mixtral_names = flavor == MoeFlavor::kMixtral;
  spec.moe.shared_intermediate = m.shared_expert_intermediate_size;
  return spec;
}

}  // namespace rlhf::models
