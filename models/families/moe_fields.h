// The config.json fields of the mixture-of-experts families (qwen3_moe, qwen2_moe, mixtral)
// and the layers they make, shared by their files in models/families/.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "models/config.h"
#include "models/layer_spec.h"

namespace rlhf::models {

enum class MoeFlavor {
  kQwen3,    // Qwen3MoeConfig: num_experts (transformers 5 writes num_local_experts too)
  kQwen2,    // Qwen2MoeConfig: plus a sigmoid-gated shared expert
  kMixtral,  // MixtralConfig: num_local_experts, every layer sparse, experts of
             // intermediate_size, top-k weights always renormalised
};

// Reads c.moe from j; InputError naming `source` and the key for a missing or out-of-range
// field (no experts, top-k above the expert count, a listed dense layer out of range) or a
// feature rlhf does not implement (Mixtral's router_jitter_noise).
void read_moe_fields(const nlohmann::json& j, ModelConfig& c, const std::string& source,
                     MoeFlavor flavor);
// c.moe back into j under the flavor's names.
void write_moe_fields(const ModelConfig& c, nlohmann::json& j, MoeFlavor flavor);
// Layer `layer`'s spec: uniform_layer's, with its MoE block when the layer is sparse.
LayerSpec moe_layer(const ModelConfig& c, int64_t layer, MoeFlavor flavor);

}  // namespace rlhf::models
