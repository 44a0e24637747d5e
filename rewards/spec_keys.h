// reward.*: the reward sources of a ppo job and how scores are shaped. Each source kind
// (rule, python, remote, model) is read here, from the shorthands or reward.sources, and
// nowhere else.
#pragma once

#include <nlohmann/json.hpp>
#include <vector>

#include "core/spec.h"
#include "core/spec_schema.h"

namespace rlhf::rewards {

SpecSection spec_section();

// The reward sources of a resolved ppo spec as one list, shorthands (reward.rule,
// reward.python, reward.remote_url, reward.model) expanded: each {"kind": rule|python|remote|
// model, "name", "weight", and "rule"/"python"/"remote_url"/"model" (+ "pattern")}. Field
// problems go to `problems` as (path, message) when given.
nlohmann::json reward_sources(const nlohmann::json& resolved,
                              std::vector<SpecProblem>* problems = nullptr);
// True when one of them is a reward model (the reward group serves it).
bool uses_reward_model(const nlohmann::json& resolved);
// A reward.sources judge without a url: it runs on the job's judge group (judge.model).
bool uses_local_judge(const nlohmann::json& resolved);

}  // namespace rlhf::rewards
