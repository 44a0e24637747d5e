#include "rewards/rule_rewards.h"

#include "core/errors.h"
#include "core/text.h"
#include "rewards/math_verifier.h"

namespace rlhf::rewards {
namespace {

// Share of response bytes that are lowercase ASCII letters; 0 for an empty response.
// A random byte-level policy scores about 26/256; a trained one approaches 1.
double letters(const std::string&, const std::string& response, const std::string&) {
  if (response.empty()) return 0.0;
  size_t n = 0;
  for (unsigned char c : response) n += (c >= 'a' && c <= 'z');
  return static_cast<double>(n) / static_cast<double>(response.size());
}

// 1 when the response, trimmed, equals the label (a verifier for exact answers), else 0.
double match_label(const std::string&, const std::string& response, const std::string& label) {
  return trim(response) == trim(label) ? 1.0 : 0.0;
}

// 1 when the response's final answer equals the label's (rewards/math_verifier.h), else 0.
double math(const std::string&, const std::string& response, const std::string& label) {
  return math_score(response, label);
}

}  // namespace

const std::vector<RuleReward>& rule_rewards() {
  static const std::vector<RuleReward> kRules = {
      {"letters", "share of response bytes that are lowercase letters a-z (0 when empty)", letters},
      {"match_label", "1 when the trimmed response equals the trimmed label, else 0", match_label},
      {"math",
       "1 when the response's final answer (\\boxed{}, #### N, \"the answer is\", else the last "
       "number) equals the label's, as numbers (relative tolerance 1e-6) or normalised text; "
       "else 0",
       math},
  };
  return kRules;
}

const RuleReward& find_rule_reward(const std::string& name) {
  std::vector<std::string> names;
  for (const auto& r : rule_rewards()) {
    if (name == r.name) return r;
    names.push_back(r.name);
  }
  throw InputError("reward.rule: unknown rule \"" + name + "\" (known: " + join(names, ", ") + ")");
}

}  // namespace rlhf::rewards
