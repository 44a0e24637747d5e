// Built-in rule rewards (reward.rule): a score from the prompt, response and label text,
// with no reward model. For examples, tests and verifiable tasks. Documented in
// docs/rewards.md; an unknown name is an InputError listing the known ones. The `format` rule
// takes a pattern and lives in rewards/format_reward.h.
#pragma once

#include <string>
#include <vector>

namespace rlhf::rewards {

using RuleRewardFn = double (*)(const std::string& prompt, const std::string& response,
                                const std::string& label);

struct RuleReward {
  const char* name;
  const char* doc;
  RuleRewardFn fn;
};

const std::vector<RuleReward>& rule_rewards();
// Throws InputError("reward.rule: unknown rule ... (known: ...)").
const RuleReward& find_rule_reward(const std::string& name);

}  // namespace rlhf::rewards
