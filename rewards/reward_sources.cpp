#include "rewards/reward_sources.h"

#include <algorithm>
#include <cmath>

#include "core/errors.h"
#include "core/python_ref.h"
#include "pyhost/python_pool.h"
#include "rewards/format_reward.h"
#include "rewards/judge.h"
#include "rewards/remote_reward.h"
#include "rewards/rule_rewards.h"
#include "rewards/spec_keys.h"

namespace rlhf::rewards {

using nlohmann::json;

RewardSourcesConfig RewardSourcesConfig::from_spec(const JobSpec& spec) {
  RewardSourcesConfig c;
  c.sources = reward_sources(spec.json());
  c.python_interpreter = spec.get_string("reward.python_interpreter");
  c.python_workers = static_cast<int>(spec.get_int("reward.python_workers"));
  c.python_timeout_s = spec.get_float("reward.python_timeout_s");
  c.python_max_restarts = static_cast<int>(spec.get_int("fault.max_restarts"));
  c.remote_timeout_s = spec.get_float("reward.remote_timeout_s");
  return c;
}

// One source: exactly one of the members is set (none for the reward model).
struct RewardSources::Source {
  std::string name, kind;
  double weight = 1;
  const RuleReward* rule = nullptr;
  std::unique_ptr<FormatReward> format;
  std::unique_ptr<pyhost::PythonFunctionPool> python;
  std::unique_ptr<RemoteReward> remote;
  std::unique_ptr<Judge> judge;
};

RewardSources::RewardSources(RewardSourcesConfig c) {
  for (const json& s : c.sources) {
    auto src = std::make_unique<Source>();
    src->name = s.at("name").get<std::string>();
    src->kind = s.at("kind").get<std::string>();
    src->weight = s.value("weight", 1.0);
    if (src->kind == "rule") {
      const std::string rule = s.at("rule");
      if (rule == "format")
        src->format = std::make_unique<FormatReward>(s.value("pattern", std::string()));
      else
        src->rule = &find_rule_reward(rule);
    } else if (src->kind == "python") {
      const std::string spec = s.at("python");
      const auto ref = parse_python_ref(spec);
      if (!ref)
        throw InputError("reward python source \"" + spec + "\": expected FILE.py:FUNCTION");
      pyhost::PythonPoolConfig pc;
      pc.interpreter = c.python_interpreter;
      pc.workers = c.python_workers;
      pc.timeout_s = c.python_timeout_s;
      pc.log_path = c.python_log_path;
      pc.max_restarts = c.python_max_restarts;
      src->python = std::make_unique<pyhost::PythonFunctionPool>(pc, ref->file, ref->name);
    } else if (src->kind == "remote") {
      src->remote = std::make_unique<RemoteReward>(
          RemoteRewardConfig{s.at("remote_url").get<std::string>(), c.remote_timeout_s});
    } else if (src->kind == "judge") {
      src->judge = std::make_unique<Judge>(
          JudgeConfig::from_json(s.at("judge"), src->name, c.remote_timeout_s));
    } else if (src->kind != "model") {
      throw InputError("reward source \"" + src->name + "\": unknown kind \"" + src->kind + "\"");
    }
    names_.push_back(src->name);
    sources_.push_back(std::move(src));
  }
  // No source at all is a job whose rewards all come from its environment (env.*, summed by
  // the driver): every total is 0 here. The validator refuses a ppo job with neither.
}

RewardSources::~RewardSources() = default;

bool RewardSources::has_model() const {
  for (const auto& s : sources_)
    if (s->kind == "model") return true;
  return false;
}

bool RewardSources::has_local_judge() const {
  for (const auto& s : sources_)
    if (s->judge && s->judge->config().url.empty()) return true;
  return false;
}

int64_t RewardSources::local_judge_max_tokens() const {
  int64_t most = 0;
  for (const auto& s : sources_)
    if (s->judge && s->judge->config().url.empty())
      most = std::max(most, s->judge->config().max_tokens);
  return most;
}

void RewardSources::set_judge_engine(const JudgeEngine& engine) {
  for (const auto& s : sources_)
    if (s->judge && s->judge->config().url.empty()) s->judge->set_engine(engine);
}

bool RewardSources::reads_rows() const {
  for (const auto& s : sources_)
    if (s->python) return true;
  return false;
}

RewardScores RewardSources::score(const std::vector<std::string>& prompts,
                                  const std::vector<std::string>& responses,
                                  const std::vector<std::string>& labels,
                                  const std::vector<json>& rows,
                                  const std::vector<double>& model_scores) const {
  const size_t b = responses.size();
  if (prompts.size() != b || labels.size() != b || (!rows.empty() && rows.size() != b))
    throw InputError("reward: prompts, responses, labels and rows differ in count");
  RewardScores out;
  out.total.assign(b, 0.0);
  for (const auto& src : sources_) {
    SourceScores s;
    s.name = src->name;
    s.weight = src->weight;
    if (src->rule) {
      for (size_t i = 0; i < b; ++i) {
        try {
          s.scores.push_back(src->rule->fn(prompts[i], responses[i], labels[i]));
        } catch (const InputError& e) {
          throw InputError("reward source \"" + src->name + "\", sample " + std::to_string(i + 1) +
                           ": " + e.what());
        }
      }
    } else if (src->format) {
      for (size_t i = 0; i < b; ++i) s.scores.push_back(src->format->score(responses[i]));
    } else if (src->python) {
      s.scores = src->python->call(prompts, responses, labels, rows);
    } else if (src->remote) {
      s.scores = src->remote->score(prompts, responses, labels);
    } else if (src->judge) {
      JudgeScores verdicts = src->judge->score(prompts, responses, labels);
      s.scores = std::move(verdicts.scores);
      s.votes = verdicts.votes;
      s.unparsed = verdicts.unparsed;
      s.replies = std::move(verdicts.replies);
    } else {
      if (model_scores.size() != b)
        throw RuntimeError("reward source \"" + src->name + "\": expected " + std::to_string(b) +
                           " reward-model scores, got " + std::to_string(model_scores.size()));
      s.scores = model_scores;
    }
    // TRL's None ("not applicable") is NaN here and left out of the sum, as its nansum.
    for (size_t i = 0; i < b; ++i)
      if (!std::isnan(s.scores[i])) out.total[i] += src->weight * s.scores[i];
    out.sources.push_back(std::move(s));
  }
  return out;
}

}  // namespace rlhf::rewards
