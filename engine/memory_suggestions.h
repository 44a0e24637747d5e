// Internal to engine/: the over-budget search of plan_memory (memory_suggestions.cpp).
#pragma once

#include <map>

#include "core/placement.h"
#include "core/spec.h"
#include "engine/memory_plan.h"
#include "models/config.h"

namespace rlhf::engine {

// Fills plan.suggestions: each candidate change alone with the worst device's new total and,
// when none fits alone, the greedy combination as one --set line.
void add_suggestions(const JobSpec& spec, const std::map<Role, models::ModelConfig>& models,
                     const Placement& placement, MemoryPlan& plan);

}  // namespace rlhf::engine
