// A generative judge on rlhf's own engine (a reward.sources judge without a url, judge.model):
// JudgeText turns the rendered judge prompts into the judge model's token batch (each a user
// message in its chat template, or plain text with BOS when it has none, with its own
// tokenizer) and the engine's output back into replies; LocalJudge is the job's judge group as
// a rewards::JudgeEngine (one paged engine per judge device: the rollout operations load_model
// and generate). `rlhf reward` runs the same JudgeText on an engine in its own process.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "rewards/judge.h"
#include "rollout/worker_ops.h"
#include "tokenizer/prompt_format.h"
#include "tokenizer/tokenizer.h"

namespace rlhf {
class RoleGroup;
}

namespace rlhf::ppo::job {

class JudgeText {
 public:
  // Throws InputError when the model's tokenizer has no EOS or its chat template is not one
  // rlhf renders.
  explicit JudgeText(const std::string& model_dir);
  // The user messages `contents` [B] as left-padded prompt ids and mask [B, P].
  std::pair<torch::Tensor, torch::Tensor> prompts(const std::vector<std::string>& contents) const;
  // An engine's output rows (prompt i's v-th reply in row i * votes + v: sequences [N, T],
  // action_mask [N, A]) as replies [N / votes][votes], each up to its EOS, specials dropped.
  std::vector<std::vector<std::string>> replies(const torch::Tensor& sequences,
                                                const torch::Tensor& action_mask,
                                                int64_t votes) const;
  // EOS and a chat turn's end (<|im_end|>, <|eot_id|>) where the vocabulary has them.
  std::vector<int64_t> stop_ids() const;
  int64_t pad_id() const { return pad_id_; }

 private:
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  std::unique_ptr<tokenizer::PromptFormatter> formatter_;  // null: no chat template
  int64_t eos_id_ = 0, pad_id_ = 0;
};

class LocalJudge {
 public:
  // `model_dir`: judge.model; `micro_batch`: prompts per generate call to one engine;
  // `seed`: train.seed (each call samples with its own seed from it).
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
  JudgeText text_;
  int64_t micro_batch_ = 1;
  uint64_t seed_ = 0;
  int64_t calls_ = 0;
};

}  // namespace rlhf::ppo::job
