// Mixtral (transformers' MixtralConfig: Mixtral-8x7B, 8x22B): Mistral's attention (no biases,
// one sliding window or none) and every layer sparse: num_local_experts experts of
// intermediate_size, top-k (2) softmax routing with the k weights renormalised, kept in FP32
// when they scale the experts' outputs; its own weight names (block_sparse_moe.gate,
// block_sparse_moe.experts.N.w1 / w3 / w2 for gate / up / down).
#include "models/config.h"
#include "models/config_json.h"
#include "models/families/moe_fields.h"
#include "models/family.h"

namespace rlhf::models {

namespace {

void read(const nlohmann::json& j, ModelConfig& c, const std::string& source) {
  c.sliding_window = config_json::get_or<int64_t>(j, "sliding_window", 0, source);
  if (c.sliding_window < 0)
    throw InputError(source + ": sliding_window must be positive or null, got " +
                     std::to_string(c.sliding_window));
  read_moe_fields(j, c, source, MoeFlavor::kMixtral);
}

void write(const ModelConfig& c, nlohmann::json& j) {
  j["sliding_window"] = c.sliding_window > 0 ? nlohmann::json(c.sliding_window) : nullptr;
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
