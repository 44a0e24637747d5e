#include "ppo/judge_engine.h"

#include <algorithm>

#include "core/errors.h"
#include "scheduler/role_group.h"

namespace rlhf::ppo::job {

JudgeText::JudgeText(const std::string& model_dir)
    : tokenizer_(tokenizer::load_tokenizer(model_dir)) {
  const auto& special = tokenizer_->special_ids();
  if (!special.eos) throw InputError("judge.model: " + model_dir + ": the tokenizer has no EOS");
  eos_id_ = *special.eos;
  pad_id_ = special.pad ? *special.pad : eos_id_;
  const tokenizer::TokenizerConfig config = tokenizer::read_tokenizer_config(model_dir);
  if (!config.chat_template.empty()) {
    tokenizer::PromptFormatConfig fc;
    fc.apply_chat_template = true;
    formatter_ = std::make_unique<tokenizer::PromptFormatter>(fc, config);
  }
}

std::pair<torch::Tensor, torch::Tensor> JudgeText::prompts(
    const std::vector<std::string>& contents) const {
  const auto b = static_cast<int64_t>(contents.size());
  std::vector<std::vector<tokenizer::TokenId>> encoded;
  size_t longest = 1;
  for (const std::string& content : contents) {
    encoded.push_back(formatter_ ? tokenizer_->encode(formatter_->format(nlohmann::json(content)),
                                                      tokenizer::AddSpecial::kNo)
                                 : tokenizer_->encode(content, tokenizer::AddSpecial::kYes));
    longest = std::max(longest, encoded.back().size());
  }
  const auto p = static_cast<int64_t>(longest);
  torch::Tensor ids = torch::full({b, p}, pad_id_, torch::kLong);
  torch::Tensor mask = torch::zeros({b, p}, torch::kLong);
  for (int64_t i = 0; i < b; ++i) {
    const auto& row = encoded[static_cast<size_t>(i)];
    const auto n = static_cast<int64_t>(row.size());
    if (n == 0) continue;
    ids[i].narrow(0, p - n, n).copy_(torch::tensor(std::vector<int64_t>(row.begin(), row.end())));
    mask[i].narrow(0, p - n, n).fill_(1);
  }
  return {ids, mask};
}

std::vector<std::vector<std::string>> JudgeText::replies(const torch::Tensor& sequences,
                                                         const torch::Tensor& action_mask,
                                                         int64_t votes) const {
  const torch::Tensor seq_t = sequences.to(torch::kLong).contiguous();
  const torch::Tensor act_t = action_mask.to(torch::kLong).contiguous();
  const auto seq = seq_t.accessor<int64_t, 2>();
  const auto act = act_t.accessor<int64_t, 2>();
  const int64_t t = seq_t.size(1), a = act_t.size(1), rows = seq_t.size(0);
  std::vector<std::vector<std::string>> out(static_cast<size_t>(rows / votes));
  for (int64_t row = 0; row < rows; ++row) {
    std::vector<tokenizer::TokenId> ids;
    for (int64_t j = 0; j < a && act[row][j] != 0; ++j) {
      const int64_t id = seq[row][t - a + j];
      if (id == eos_id_) break;
      ids.push_back(static_cast<tokenizer::TokenId>(id));
    }
    out[static_cast<size_t>(row / votes)].push_back(
        tokenizer_->decode(ids, tokenizer::SkipSpecial::kYes));
  }
  return out;
}

std::vector<int64_t> JudgeText::stop_ids() const {
  std::vector<int64_t> stop = {eos_id_};
  for (const char* end_of_turn : {"<|im_end|>", "<|eot_id|>"})
    if (const auto id = tokenizer_->token_to_id(end_of_turn)) stop.push_back(*id);
  return stop;
}

LocalJudge::LocalJudge(RoleGroup& group, const std::string& model_dir, int64_t micro_batch,
                       uint64_t seed)
    : group_(group),
      model_dir_(model_dir),
      text_(model_dir),
      micro_batch_(std::max<int64_t>(1, micro_batch)),
      seed_(seed) {}

ops::LoadModel LocalJudge::load_request(ops::LoadModel engine, const std::string& dtype,
                                        int64_t max_tokens) const {
  engine.model = model_dir_;
  engine.preset.clear();
  engine.dtype = dtype;
  engine.tensor_parallel_size = 1;
  engine.tp_store_path.clear();
  engine.env = {};
  engine.max_turns = 1;
  engine.tokenizer = model_dir_;
  engine.generation.max_new_tokens = max_tokens;
  engine.generation.pad_token_id = text_.pad_id();
  engine.generation.stop_token_ids = text_.stop_ids();
  return engine;
}

std::vector<std::vector<std::string>> LocalJudge::operator()(
    const std::vector<std::string>& contents, const rewards::JudgeConfig& config) {
  if (contents.empty()) return {};
  const auto [ids, mask] = text_.prompts(contents);
  ops::Generate request;
  request.sampling.temperature = config.temperature;
  request.sampling.seed = seed_ * 7919 + static_cast<uint64_t>(++calls_) * 1000003;
  request.n_samples_per_prompt = config.votes;
  const Message reply = group_.scatter(
      request,
      {{"prompt_ids", ids},
       {"prompt_mask", mask},
       {"prompt_index", torch::arange(static_cast<int64_t>(contents.size()), torch::kLong)}},
      micro_batch_, Dispatch::kLeastLoaded);
  return text_.replies(reply.tensor("sequences"), reply.tensor("action_mask"), config.votes);
}

}  // namespace rlhf::ppo::job
