// The reward sources of a PPO-family job and their weighted sum (TRL's reward_funcs +
// reward_weights): rules (rule_rewards.h, format_reward.h), Python functions in a supervised
// process pool (pyhost/), remote HTTP verifiers (remote_reward.h), generative judges behind a
// chat-completions endpoint (judge.h), and the reward model,
// whose scores the reward role group computes and the caller passes in. Each source's scores
// are kept apart so they can be logged as reward/<name>. Not thread-safe: one caller.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/spec.h"
#include "rewards/judge.h"

namespace rlhf::rewards {

struct RewardSourcesConfig {
  // rewards::reward_sources(spec.json()) (rewards/spec_keys.h): [{"kind": rule|python|remote|model,
  // "name", "weight", ...}].
  nlohmann::json sources = nlohmann::json::array();
  std::string python_interpreter = "python3";  // reward.python_interpreter
  int python_workers = 2;                      // reward.python_workers
  double python_timeout_s = 300;               // reward.python_timeout_s
  int python_max_restarts = 0;   // fault.max_restarts: a pool whose worker died starts again
  double remote_timeout_s = 30;  // reward.remote_timeout_s
  std::string python_log_path;   // Python workers' stderr ("" inherits ours)

  static RewardSourcesConfig from_spec(const JobSpec& spec);
};

struct SourceScores {
  std::string name;
  double weight = 1;
  std::vector<double> scores;  // [B]; NaN where a Python function returned None
  // A judge's (rewards/judge.h): its replies read and those scored the default (-1 for other
  // kinds), and the replies themselves [B][votes].
  int64_t votes = -1, unparsed = -1;
  std::vector<std::vector<std::string>> replies;
};

struct RewardScores {
  std::vector<double> total;          // [B] sum of weight x score, NaN scores left out
  std::vector<SourceScores> sources;  // in spec order
};

class RewardSources {
 public:
  // Builds every source: looks up rules (InputError for an unknown one), compiles format
  // patterns, starts the Python pools (InputError naming FILE:FUNCTION when it does not load).
  explicit RewardSources(RewardSourcesConfig config);
  ~RewardSources();
  RewardSources(const RewardSources&) = delete;
  RewardSources& operator=(const RewardSources&) = delete;

  bool has_model() const;   // a reward-model source: score() needs its scores
  bool reads_rows() const;  // a Python source: score() passes `rows` on as **row keywords
  // Judges without a url (rewards/judge.h): they run on the job's judge group, through
  // `engine` once set; the longest verdict any of them asks for.
  bool has_local_judge() const;
  int64_t local_judge_max_tokens() const;
  void set_judge_engine(const JudgeEngine& engine);
  const std::vector<std::string>& names() const { return names_; }

  // Scores B samples. `rows`: each sample's dataset row (its other columns, for Python
  // functions' **row keywords; may be empty). `model_scores`: the reward model's [B] scores
  // when has_model(). Throws what a source throws (RuntimeError naming it).
  RewardScores score(const std::vector<std::string>& prompts,
                     const std::vector<std::string>& responses,
                     const std::vector<std::string>& labels,
                     const std::vector<nlohmann::json>& rows = {},
                     const std::vector<double>& model_scores = {}) const;

 private:
  struct Source;
  std::vector<std::unique_ptr<Source>> sources_;
  std::vector<std::string> names_;
};

}  // namespace rlhf::rewards
