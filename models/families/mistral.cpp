// Mistral (transformers' MistralConfig): no biases whatever attention_bias / mlp_bias say (as
// MistralAttention); one sliding window for every layer, or none.
#include "models/config.h"
#include "models/config_json.h"
#include "models/family.h"

namespace rlhf::models {

namespace {

void read(const nlohmann::json& j, ModelConfig& c, const std::string& source) {
  c.sliding_window = config_json::get_or<int64_t>(j, "sliding_window", 0, source);
  if (c.sliding_window < 0)
    throw InputError(source + ": sliding_window must be positive or null, got " +
                     std::to_string(c.sliding_window));
}

void write(const ModelConfig& c, nlohmann::json& j) {
  j["sliding_window"] = c.sliding_window > 0 ? nlohmann::json(c.sliding_window) : nullptr;
}

}  // namespace

const ModelFamily& mistral_family() {
  static const ModelFamily family{"mistral", "Mistral", "MistralConfig", false,
                                  read,      write,     uniform_layer};
  return family;
}

}  // namespace rlhf::models
