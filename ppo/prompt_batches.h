// Prompts as token batches: each dataset row is formatted (input template or chat
// template), tokenized, truncated to data.prompt_max_len (keeping the end, as the response
// continues from it; truncations are counted), and served in left-padded batches in a
// seeded order that reshuffles each episode. The position in the stream is resumable.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ppo/prompt_dataset.h"

namespace rlhf::ppo {

struct TokenizedPrompt {
  std::vector<int64_t> ids;
  std::string text;  // the formatted prompt
  std::string label;
  nlohmann::json columns;  // PromptRow::columns; null when no reward source reads them
  // The dataset's response, tokenized with EOS and cut to rollout.max_new_tokens (GKD's
  // dataset steps, algo.distill.gkd.lambda < 1); empty otherwise.
  std::vector<int64_t> response_ids;
};

struct PromptBatch {
  torch::Tensor prompt_ids;   // [b, P] int64, left-padded with pad_id
  torch::Tensor prompt_mask;  // [b, P] int64, 0 on padding
  std::vector<std::string> texts;
  std::vector<std::string> labels;
  std::vector<nlohmann::json> columns;  // [b] the rows' other columns (TokenizedPrompt::columns)
  std::vector<std::vector<int64_t>> response_ids;  // [b] TokenizedPrompt::response_ids
};

class PromptStream {
 public:
  PromptStream(std::vector<TokenizedPrompt> prompts, int64_t pad_id, uint64_t seed);

  // The next `count` prompts (wrapping into a new, reshuffled episode when needed).
  PromptBatch next(int64_t count);
  int64_t consumed() const { return consumed_; }
  // Skips to `consumed` prompts from the start (resume).
  void seek(int64_t consumed);
  int64_t size() const { return static_cast<int64_t>(prompts_.size()); }

 private:
  int64_t index_at(int64_t position) const;  // dataset row of stream position

  std::vector<TokenizedPrompt> prompts_;
  int64_t pad_id_;
  uint64_t seed_;
  int64_t consumed_ = 0;
};

}  // namespace rlhf::ppo
