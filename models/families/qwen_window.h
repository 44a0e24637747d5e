// Qwen2's and Qwen3's sliding-window attention, which rlhf refuses by name.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "models/config.h"

namespace rlhf::models {

// Their sliding windows apply per layer (layer_types, or layers from max_window_layers on
// when use_sliding_window is set); rlhf implements full attention only for them, so either
// is an InputError naming the key.
void refuse_qwen_sliding_window(const nlohmann::json& j, const ModelConfig& c,
                                const std::string& source);

}  // namespace rlhf::models
