#include "ppo/judge_engine.h"

#include <algorithm>

#include "core/errors.h"
#include "scheduler/role_group.h"

namespace rlhf::ppo::job {

LocalJudge::LocalJudge(RoleGroup& group, const std::string& model_dir, int64_t micro_batch,
                       uint64_t seed)
    : group_(group),
      model_dir_(model_dir),
      tokenizer_(tokenizer::load_tokenizer(model_dir)),
      micro_batch_(std::max<int64_t>(1, micro_batch)),
      seed_(seed) {
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
  engine.generation.pad_token_id = pad_id_;
  std::vector<int64_t> stop = {eos_id_};
  for (const char* end_of_turn : {"<|im_end|>", "<|eot_id|>"})  // a chat turn's end
    if (const auto id = tokenizer_->token_to_id(end_of_turn)) stop.push_back(*id);
  engine.generation.stop_token_ids = stop;
  return engine;
}

std::vector<std::vector<std::string>> LocalJudge::operator()(
    const std::vector<std::string>& contents, const rewards::JudgeConfig& config) {
  const auto b = static_cast<int64_t>(contents.size());
  if (b == 0) return {};
  // Each message as the judge model reads it, left-padded into one batch.
  std::vector<std::vector<tokenizer::TokenId>> prompts;
  size_t longest = 1;
  for (const std::string& content : contents) {
    prompts.push_back(formatter_ ? tokenizer_->encode(formatter_->format(nlohmann::json(content)),
                                                      tokenizer::AddSpecial::kNo)
                                 : tokenizer_->encode(content, tokenizer::AddSpecial::kYes));
    longest = std::max(longest, prompts.back().size());
  }
  const auto p = static_cast<int64_t>(longest);
  torch::Tensor ids = torch::full({b, p}, pad_id_, torch::kLong);
  torch::Tensor mask = torch::zeros({b, p}, torch::kLong);
  for (int64_t i = 0; i < b; ++i) {
    const auto& row = prompts[static_cast<size_t>(i)];
    const auto n = static_cast<int64_t>(row.size());
    if (n == 0) continue;
    ids[i].narrow(0, p - n, n).copy_(torch::tensor(std::vector<int64_t>(row.begin(), row.end())));
    mask[i].narrow(0, p - n, n).fill_(1);
  }
  ops::Generate request;
  request.sampling.temperature = config.temperature;
  request.sampling.seed = seed_ * 7919 + static_cast<uint64_t>(++calls_) * 1000003;
  request.n_samples_per_prompt = config.votes;
  const Message reply = group_.scatter(request,
                                       {{"prompt_ids", ids},
                                        {"prompt_mask", mask},
                                        {"prompt_index", torch::arange(b, torch::kLong)}},
                                       micro_batch_, Dispatch::kLeastLoaded);
  // Row i * votes + v is prompt i's v-th reply: its tokens after the prompt, up to a stop.
  const torch::Tensor seq_t = reply.tensor("sequences").to(torch::kLong).contiguous();
  const torch::Tensor act_t = reply.tensor("action_mask").to(torch::kLong).contiguous();
  const auto seq = seq_t.accessor<int64_t, 2>();
  const auto act = act_t.accessor<int64_t, 2>();
  const int64_t t = seq_t.size(1), a = act_t.size(1);
  std::vector<std::vector<std::string>> out(static_cast<size_t>(b));
  for (int64_t row = 0; row < seq_t.size(0); ++row) {
    std::vector<tokenizer::TokenId> reply_ids;
    for (int64_t j = 0; j < a && act[row][j] != 0; ++j) {
      const int64_t id = seq[row][t - a + j];
      if (id == eos_id_) break;
      reply_ids.push_back(static_cast<tokenizer::TokenId>(id));
    }
    out[static_cast<size_t>(row / config.votes)].push_back(
        tokenizer_->decode(reply_ids, tokenizer::SkipSpecial::kYes));
  }
  return out;
}

}  // namespace rlhf::ppo::job
