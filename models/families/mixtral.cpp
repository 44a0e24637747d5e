// Mixtral (transformers' MixtralConfig: Mixtral-8x7B, 8x22B): Mistral's attention (no biases,
// one sliding window or none) and every layer sparse: num_local_experts experts of
// intermediate_size, top-k (2) softmax routing with the k weights renormalised, kept in FP32
// when they scale the experts' outputs; its own weight names (block_sparse_moe.gate,
// block_sparse_moe.experts.N.w1 / w3 / w2 for gate / up / down).
#include "models/config.h"
#include "models/families/moe_fields.h"
#include "models/family.h"

namespace rlhf::models {

namespace {

// Mistral's own fields (its sliding window), then the experts'.
void read(const nlohmann::json& j, ModelConfig& c, const std::string& source) {
  mistral_family().read(j, c, source);
  read_moe_fields(j, c, source, MoeFlavor::kMixtral);
}

void write(const ModelConfig& c, nlohmann::json& j) {
  mistral_family().write(c, j);
  write_moe_fields(c, j, MoeFlavor::kMixtral);
}

LayerSpec layer(const ModelConfig& c, int64_t i) {
  return moe_layer(c, i, MoeFlavor::kMixtral);
}

}  // namespace

const ModelFamily& mixtral_family() {
  static const ModelFamily family{"mixtral", "Mixtral", "MixtralConfig", false, read, write, layer};
  return family;
}

}  // namespace rlhf::models
