#include "ppo/prompt_batches.h"

#include <algorithm>
#include <numeric>
#include <random>

#include "core/errors.h"

namespace rlhf::ppo {

PromptStream::PromptStream(std::vector<TokenizedPrompt> prompts, int64_t pad_id, uint64_t seed)
    : prompts_(std::move(prompts)), pad_id_(pad_id), seed_(seed) {
  if (prompts_.empty()) throw InputError("the prompt dataset is empty");
}

int64_t PromptStream::index_at(int64_t position) const {
  // A permutation per episode, derived from (seed, episode): resumable without saved state.
  const int64_t n = size(), episode = position / n;
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(seed_ * 1000003ull + static_cast<uint64_t>(episode));
  std::shuffle(order.begin(), order.end(), rng);
  return order[static_cast<size_t>(position % n)];
}

PromptBatch PromptStream::next(int64_t count) {
  std::vector<const TokenizedPrompt*> picked;
  for (int64_t i = 0; i < count; ++i)
    picked.push_back(&prompts_[static_cast<size_t>(index_at(consumed_ + i))]);
  consumed_ += count;
  size_t longest = 1;
  for (const auto* p : picked) longest = std::max(longest, p->ids.size());
  PromptBatch b;
  b.prompt_ids = torch::full({count, static_cast<int64_t>(longest)}, pad_id_, torch::kLong);
  b.prompt_mask = torch::zeros({count, static_cast<int64_t>(longest)}, torch::kLong);
  for (int64_t i = 0; i < count; ++i) {
    const auto& ids = picked[static_cast<size_t>(i)]->ids;
    const int64_t offset = static_cast<int64_t>(longest - ids.size());
    if (!ids.empty()) {
      b.prompt_ids[i].slice(0, offset).copy_(torch::tensor(ids, torch::kLong));
      b.prompt_mask[i].slice(0, offset).fill_(1);
    }
    b.texts.push_back(picked[static_cast<size_t>(i)]->text);
    b.labels.push_back(picked[static_cast<size_t>(i)]->label);
    b.columns.push_back(picked[static_cast<size_t>(i)]->columns);
    b.response_ids.push_back(picked[static_cast<size_t>(i)]->response_ids);
  }
  return b;
}

void PromptStream::seek(int64_t consumed) {
  consumed_ = consumed;
}

}  // namespace rlhf::ppo
