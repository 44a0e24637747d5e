// The parameters of a model of one config, as HF names them (full shapes, before any tensor
// parallelism), in the order CausalLM registers them, grouped into the units the trainer
// shards (the embeddings, each decoder layer, the final norm with the head). The one layout
// that allocation (CausalLM, checked against it), loading (what a checkpoint must hold),
// counting (ModelConfig::num_parameters) and the memory planner (engine/memory_plan.cpp) use.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "models/config.h"

namespace rlhf::models {

using ShapeList = std::vector<std::pair<std::string, std::vector<int64_t>>>;

// Every parameter, in registration order.
ShapeList parameter_shapes(const ModelConfig& config);
// The same, one list per unit: [0] the embeddings, [1 + i] layer i, [L + 1] norm and head.
std::vector<ShapeList> parameter_units(const ModelConfig& config);

// The parameters one token's forward uses: all of them, less the experts the router does not
// pick (experts - top_k per sparse layer). Equal to numel_of(parameter_shapes) for a dense
// model.
int64_t active_parameters(const ModelConfig& config);

int64_t numel_of(const std::vector<int64_t>& shape);
int64_t numel_of(const ShapeList& shapes);

}  // namespace rlhf::models
