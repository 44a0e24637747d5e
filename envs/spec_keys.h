// env.*: the environment of multi-turn rollouts (docs/agentic.md).
#pragma once

#include <nlohmann/json.hpp>

#include "core/spec_schema.h"

namespace rlhf::envs {

SpecSection spec_section();

// True when the spec names an environment (env.builtin, env.python or env.url).
bool has_environment(const nlohmann::json& resolved);

}  // namespace rlhf::envs
