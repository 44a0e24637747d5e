// The job's judge group as a generative judge's engine (rewards::JudgeEngine): a reward.sources
// judge without a url runs judge.model on rlhf's paged engine, one engine per judge device
// (the rollout operations: load_model once, then generate). Each rendered judge prompt becomes
// a user message in the judge model's chat template (plain text when the model has none),
// tokenized with the judge's own tokenizer; its `votes` replies are sampled at the judge's
// temperature and decoded. Private to rlhf_ppo_driver.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "rewards/judge.h"
#include "rollout/worker_ops.h"
#include "tokenizer/prompt_format.h"
#include "tokenizer/tokenizer.h"

namespace rlhf {
class RoleGroup;
}

namespace rlhf::ppo::job {

class LocalJudge {
 public:
  // `model_dir`: judge.model; `micro_batch`: prompts per generate call to one engine;
  // `seed`: train.seed (each call samples with its own seed from it). Throws InputError when
  // the model's tokenizer has no EOS or its chat template is not one rlhf renders.
  LocalJudge(RoleGroup& group, const std::string& model_dir, int64_t micro_batch, uint64_t seed);

  // The group's load_model request: `engine` (the rollout section's engine settings) with the
  // judge's model, dtype, stop and pad tokens, and verdicts of at most `max_tokens` tokens.
  ops::LoadModel load_request(ops::LoadModel engine, const std::string& dtype,
                              int64_t max_tokens) const;

  // rewards::JudgeEngine: replies [B][config.votes] to the user messages `contents` [B].
  std::vector<std::vector<std::string>> operator()(const std::vector<std::string>& contents,
                                                   const rewards::JudgeConfig& config);

 private:
  RoleGroup& group_;
  std::string model_dir_;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  std::unique_ptr<tokenizer::PromptFormatter> formatter_;  // null: no chat template
  int64_t eos_id_ = 0, pad_id_ = 0, micro_batch_ = 1;
  uint64_t seed_ = 0;
  int64_t calls_ = 0;
};

}  // namespace rlhf::ppo::job
