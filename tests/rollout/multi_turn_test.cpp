// Multi-turn rollouts (issue 31): the paged engine continues each trajectory over its KV
// cache after a TurnHandler's answer (rollout/trajectory.h), and EnvironmentTurns renders an
// environment's answers with the real chat templates. Asserted: the action mask is 0 on
// exactly the answer tokens; the rollout's log-probs of every model token equal a fresh
// forward of the whole conversation (FP32, 1e-5); preemption, eviction of waiting rows,
// padded decode steps and reading liveness every few steps change no output; for ChatML
// (Qwen) and Llama-3 the prompt, the model's turns and the environment's tokens concatenate
// to exactly the template's rendering of the whole conversation.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/errors.h"
#include "envs/environment.h"
#include "models/causal_lm.h"
#include "models/config.h"
#include "models/paged_kv_cache.h"
#include "rollout/generator.h"
#include "rollout/trajectory.h"
#include "test_paths.h"
#include "tokenizer/prompt_format.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_config.h"
#include "transport/collective_group.h"

namespace rlhf::rollout {
namespace {

const std::vector<int64_t> kStops = {7,   11,  19,  23,  42,  57, 64, 99, 120, 130, 140,
                                     150, 160, 170, 180, 190, 33, 44, 55, 66,  77,  88};

std::shared_ptr<models::CausalLM> tiny_model(uint64_t seed) {
  torch::set_num_threads(1);
  auto config = models::preset_config("tiny");
  config.initializer_range = 0.1;
  auto model = std::make_shared<models::CausalLM>(config);
  model->init_weights(seed);
  model->eval();
  return model;
}

std::pair<torch::Tensor, torch::Tensor> left_padded(const std::vector<int64_t>& lengths) {
  int64_t P = *std::max_element(lengths.begin(), lengths.end());
  const auto B = static_cast<int64_t>(lengths.size());
  auto ids = torch::zeros({B, P}, torch::kInt64), mask = torch::zeros({B, P}, torch::kInt64);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t len = lengths[b];
    ids[b].narrow(0, P - len, len).copy_(torch::randint(1, 200, {len}, torch::kInt64));
    mask[b].narrow(0, P - len, len).fill_(1);
  }
  return {ids, mask};
}

// A token-level environment: row r's turn t is answered with {200 + t, 201, 210 + r % 5}
// after a few polls (so other rows decode meanwhile; how many depends on the row, never on
// the schedule's outcome), and its third turn with "done". It records what it appended.
class ScriptedTurns final : public TurnHandler {
 public:
  explicit ScriptedTurns(int64_t N) : turns_(N, 0) {}
  void end_turn(int64_t row, const std::vector<int64_t>& tokens, bool last) override {
    EXPECT_FALSE(tokens.empty());
    EXPECT_NE(std::find(kStops.begin(), kStops.end(), tokens.back()), kStops.end());
    ++turns_[row];
    pending_.push_back({row, 1 + row % 3, last});
  }
  void finish(int64_t) override {}
  std::vector<Answer> poll(double) override {
    std::vector<Answer> out;
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (--it->polls > 0) {
        ++it;
        continue;
      }
      Answer a;
      a.row = it->row;
      a.done = turns_[a.row] >= 3 || it->last;
      if (!a.done) a.tokens = {200 + turns_[a.row], 201, 210 + a.row % 5};
      answers_.push_back(a);
      out.push_back(a);
      it = pending_.erase(it);
    }
    return out;
  }
  // Answers given to `row` that were not done (the engine may still drop the last one when
  // it does not fit the budget).
  std::vector<std::vector<int64_t>> answers_for(int64_t row) const {
    std::vector<std::vector<int64_t>> out;
    for (const Answer& a : answers_)
      if (a.row == row && !a.done) out.push_back(a.tokens);
    return out;
  }

 private:
  struct Pending {
    int64_t row;
    int64_t polls;
    bool last;
  };
  std::deque<Pending> pending_;
  std::vector<Answer> answers_;
  std::vector<int64_t> turns_;
};

GenerationConfig multi_turn_config() {
  GenerationConfig c;
  c.max_new_tokens = 40;
  c.n_samples_per_prompt = 2;
  c.micro_batch_size = 4;
  c.kv_block_size = 4;
  c.stop_token_ids = kStops;
  return c;
}

struct Trajectories {
  GenerationOutput out;
  std::unique_ptr<ScriptedTurns> turns;
};

Trajectories run_trajectories(const std::shared_ptr<models::CausalLM>& model,
                              const GenerationConfig& config, const torch::Tensor& ids,
                              const torch::Tensor& mask) {
  SamplingParams params;  // temperature 1: the model's own distribution
  params.seed = 5;
  Trajectories r;
  r.turns = std::make_unique<ScriptedTurns>(ids.size(0) * config.n_samples_per_prompt);
  r.out = Generator(model, config).generate(ids, mask, params, 0, r.turns.get(), 3);
  return r;
}

// log pi(token_t | tokens_<t) for every response position of every row, from one dense
// forward of the row's whole sequence (prompt, model turns and environment turns).
torch::Tensor fresh_log_probs(models::CausalLM& model, const GenerationOutput& out) {
  torch::NoGradGuard no_grad;
  const int64_t N = out.sequences.size(0), R = out.action_mask.size(1);
  auto lp = torch::zeros({N, R}, torch::kFloat32);
  for (int64_t i = 0; i < N; ++i) {
    const auto keep = out.attention_mask[i].nonzero().squeeze(1);
    const auto ids = out.sequences[i].index_select(0, keep).view({1, -1});
    const auto logits = model.logits(model.forward(ids, torch::ones_like(ids)))[0];
    const auto all = torch::log_softmax(logits.to(torch::kFloat32), -1);  // [L, V]
    const int64_t L = ids.size(1), len = out.response_lengths[i].item<int64_t>();
    const int64_t prompt_len = L - len;
    for (int64_t t = 0; t < len; ++t) lp[i][t] = all[prompt_len + t - 1][ids[0][prompt_len + t]];
  }
  return lp;
}

// Row i's response: its answer tokens are where the mask is 0 (within its length), exactly
// the answers the handler gave in order, each right after a stop token; its model turns are
// the runs of 1s.
void expect_mask_covers_the_answers(const Trajectories& r) {
  const auto& out = r.out;
  const int64_t N = out.sequences.size(0), T = out.sequences.size(1), R = out.action_mask.size(1);
  int64_t multi = 0;
  for (int64_t i = 0; i < N; ++i) {
    const int64_t len = out.response_lengths[i].item<int64_t>();
    std::vector<int64_t> env_tokens, runs_of_model;
    bool in_model = false;
    int64_t runs = 0;
    for (int64_t t = 0; t < R; ++t) {
      const bool action = out.action_mask[i][t].item<bool>();
      if (t >= len) {
        EXPECT_FALSE(action) << "row " << i << " position " << t << " past its length";
        continue;
      }
      if (!action) {
        if (in_model) {  // an answer starts right after a stop token
          const int64_t prev = out.sequences[i][T - R + t - 1].item<int64_t>();
          EXPECT_NE(std::find(kStops.begin(), kStops.end(), prev), kStops.end()) << "row " << i;
        }
        env_tokens.push_back(out.sequences[i][T - R + t].item<int64_t>());
        EXPECT_EQ(out.log_probs[i][t].item<float>(), 0.0f);
      } else if (!in_model) {
        ++runs;
      }
      in_model = action;
    }
    std::vector<int64_t> expected;
    for (const auto& a : r.turns->answers_for(i)) {
      if (static_cast<int64_t>(expected.size() + a.size()) >
          static_cast<int64_t>(env_tokens.size()))
        break;  // an answer that did not fit the budget was not appended
      expected.insert(expected.end(), a.begin(), a.end());
    }
    EXPECT_EQ(env_tokens, expected) << "row " << i;
    EXPECT_EQ(out.turns[i].item<int64_t>(), runs) << "row " << i;
    multi += runs > 1 ? 1 : 0;
  }
  EXPECT_GT(multi, N / 2) << "most trajectories should take several turns";
}

TEST(MultiTurn, ContinuedOverTheCacheEqualsAFreshForwardOfTheWholeConversation) {
  auto model = tiny_model(9);
  torch::manual_seed(1);
  auto [ids, mask] = left_padded({4, 6, 2, 5});
  const Trajectories r = run_trajectories(model, multi_turn_config(), ids, mask);
  expect_mask_covers_the_answers(r);
  EXPECT_GT(r.out.timings.extended_tokens, 0);
  // FP32 both ways; only the summation order differs (cached blocks vs one forward).
  const auto expected = fresh_log_probs(*model, r.out);
  const auto diff = (r.out.log_probs - expected).abs().masked_select(r.out.action_mask);
  EXPECT_LT(diff.max().item<double>(), 1e-5);
}

TEST(MultiTurn, PreemptionEvictionPaddingAndLateChecksChangeNothing) {
  auto model = tiny_model(9);
  torch::manual_seed(1);
  auto [ids, mask] = left_padded({4, 6, 2, 5});
  const GenerationConfig config = multi_turn_config();
  const Trajectories reference = run_trajectories(model, config, ids, mask);
  const int64_t block = models::PagedKvCache::block_bytes(model->config(), 4, torch::kFloat32);
  struct Variant {
    std::string name;
    GenerationConfig config;
    bool preempts;
  };
  std::vector<Variant> variants;
  GenerationConfig small_pool = config;
  small_pool.kv_cache_bytes = 14 * block;  // 2 + 40 positions need 11 blocks: rows preempt
  variants.push_back({"a pool of 14 blocks", small_pool, true});
  GenerationConfig padded = small_pool;
  padded.decode_steps = DecodeSteps::kPadded;
  variants.push_back({"padded decode steps", padded, true});
  GenerationConfig late = config;
  late.sync_interval = 3;  // rows that stopped are fed padding until the check: truncated
  variants.push_back({"liveness read every 3 steps", late, false});
  GenerationConfig few = config;
  few.max_num_seqs = 2;
  variants.push_back({"two rows at once", few, false});
  for (const auto& v : variants) {
    const Trajectories got = run_trajectories(model, v.config, ids, mask);
    EXPECT_TRUE(torch::equal(got.out.sequences, reference.out.sequences)) << v.name;
    EXPECT_TRUE(torch::equal(got.out.action_mask, reference.out.action_mask)) << v.name;
    EXPECT_TRUE(torch::equal(got.out.turns, reference.out.turns)) << v.name;
    EXPECT_LT((got.out.log_probs - reference.out.log_probs).abs().max().item<double>(), 1e-5)
        << v.name;
    if (v.preempts) {
      EXPECT_GT(got.out.timings.preempted, 0) << v.name;
    }
    std::cout << v.name << ": " << got.out.timings.preempted << " preempted, "
              << got.out.timings.recomputed_tokens << " recomputed, "
              << got.out.timings.extended_tokens << " extended\n";
  }
}

TEST(MultiTurn, NeedsThePagedEngine) {
  auto model = tiny_model(9);
  auto [ids, mask] = left_padded({3});
  GenerationConfig config = multi_turn_config();
  config.kv_block_size = 0;
  ScriptedTurns turns(2);
  EXPECT_THROW(Generator(model, config).generate(ids, mask, SamplingParams{}, 0, &turns, 3),
               InputError);
}

// The environment of the template tests: answers the exact tool call kCall with "5" (a tool
// result, reward 0.5) and ends the trajectory on anything else (reward 1 when it says 5).
const char* const kCall =
    R"(<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>)";

class AddEnvironment final : public envs::Environment {
 public:
  void reset(int64_t id, const nlohmann::json& row) override {
    labels_[id] = row.value("label", "");
  }
  void step(int64_t id, const std::string& action) override { steps_.emplace_back(id, action); }
  std::vector<std::pair<int64_t, envs::Observation>> poll(double) override {
    std::vector<std::pair<int64_t, envs::Observation>> out;
    for (auto& [id, action] : steps_) {
      envs::Observation o;
      if (action == kCall) {
        o.text = "5";
        o.reward = 0.5;
        o.tool_calls = 1;
      } else {
        o.done = true;
        o.reward = action.find(labels_[id]) != std::string::npos ? 1.0 : 0.0;
      }
      out.emplace_back(id, o);
    }
    steps_.clear();
    return out;
  }
  void close(int64_t id) override { closed_.push_back(id); }
  const std::string& name() const override { return name_; }
  std::vector<int64_t> closed_;

 private:
  std::string name_ = "test:add";
  std::map<int64_t, std::string> labels_;
  std::vector<std::pair<int64_t, std::string>> steps_;
};

// For each template: prompt + the model's call and its end-of-turn token + the answer's
// tokens + the model's final turn equals the tokenization of the template applied to the
// whole conversation (user, assistant, tool, assistant): the answer tokens (action mask 0)
// are exactly the environment's, every other response token is the model's.
TEST(MultiTurn, EnvironmentTokensAreExactlyTheTemplatesToolTurn) {
  for (const std::string family : {"qwen2", "llama3"}) {
    const auto dir = std::filesystem::path(RLHF_SOURCE_DIR) / ".cache/tokenizers" / family;
    if (!std::filesystem::exists(dir)) GTEST_SKIP() << dir << " missing (scripts/setup makes it)";
    const auto tok = tokenizer::load_tokenizer(dir.string());
    tokenizer::PromptFormatConfig fc;
    fc.apply_chat_template = true;
    const tokenizer::PromptFormatter formatter(fc, tokenizer::read_tokenizer_config(dir.string()));
    const std::string eot = family == "qwen2" ? "<|im_end|>" : "<|eot_id|>";
    const int64_t eot_id = tok->token_to_id(eot).value();
    auto encode = [&](const std::string& text) {
      const auto ids = tok->encode(text, tokenizer::AddSpecial::kNo);
      return std::vector<int64_t>(ids.begin(), ids.end());
    };
    const std::vector<tokenizer::ChatMessage> user = {{"user", "What is 2 + 3?"}};
    std::vector<int64_t> sequence = encode(formatter.format_messages(user));
    std::vector<int64_t> call = encode(kCall);
    call.push_back(eot_id);
    AddEnvironment env;
    const std::vector<nlohmann::json> rows = {nlohmann::json{{"label", "5"}}};
    EnvironmentTurns turns(&env, *tok, formatter, nullptr, torch::kCPU, 7, 1, 1, rows);
    turns.end_turn(0, call, false);
    const auto answers = turns.poll(0);
    ASSERT_EQ(answers.size(), 1u) << family;
    ASSERT_FALSE(answers[0].done);
    const std::vector<int64_t> answer = answers[0].tokens;
    std::vector<tokenizer::TokenId> answer_ids(answer.begin(), answer.end());
    EXPECT_EQ(tok->decode(answer_ids, tokenizer::SkipSpecial::kNo),
              formatter.environment_turn("tool", "5"));
    std::vector<int64_t> final_turn = encode("The answer is 5.");
    final_turn.push_back(eot_id);
    turns.end_turn(0, final_turn, true);
    const auto last = turns.poll(0);
    ASSERT_EQ(last.size(), 1u);
    EXPECT_TRUE(last[0].done);
    for (const std::vector<int64_t>& part : {call, answer, final_turn})
      sequence.insert(sequence.end(), part.begin(), part.end());
    auto conversation = user;
    conversation.push_back({"assistant", kCall});
    conversation.push_back({"tool", "5"});
    const std::vector<int64_t> expected =
        encode(formatter.format_messages(conversation) + "The answer is 5." + eot);
    EXPECT_EQ(sequence, expected) << family;
    const auto& stats = turns.stats();
    EXPECT_DOUBLE_EQ(stats.reward[0], 1.5);
    EXPECT_EQ(stats.tool_calls[0], 1);
    EXPECT_EQ(stats.tool_errors[0], 0);
    ASSERT_EQ(stats.turns[0].size(), 3u);
    EXPECT_EQ(stats.turns[0][0]["content"], kCall);  // the end-of-turn token stripped
    EXPECT_EQ(stats.turns[0][1]["role"], "tool");
    EXPECT_EQ(stats.turns[0][2]["content"], "The answer is 5.");
    EXPECT_EQ(env.closed_, std::vector<int64_t>{7});  // trajectory id = first_row + row
  }
}

// An environment that fails as a whole (a Python environment that raised).
class FailingEnvironment final : public envs::Environment {
 public:
  void reset(int64_t, const nlohmann::json&) override {}
  void step(int64_t, const std::string&) override {}
  std::vector<std::pair<int64_t, envs::Observation>> poll(double) override {
    throw RuntimeError("environment test:failing raised ValueError");
  }
  void close(int64_t) override {}
  const std::string& name() const override { return name_; }

 private:
  std::string name_ = "test:failing";
};

// Under tensor parallelism rank 0 steps the environment and broadcasts its answers: two
// ranks (threads, a real Gloo group) see the same answer tokens and counts, and when rank
// 0's environment fails, rank 0 throws its error and rank 1 a message naming rank 0.
TEST(MultiTurn, TensorParallelRanksSeeRankZerosAnswers) {
  const auto dir = std::filesystem::path(RLHF_SOURCE_DIR) / ".cache/tokenizers/qwen2";
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << dir << " missing (scripts/setup makes it)";
  const auto tok = tokenizer::load_tokenizer(dir.string());
  tokenizer::PromptFormatConfig fc;
  fc.apply_chat_template = true;
  const tokenizer::PromptFormatter formatter(fc, tokenizer::read_tokenizer_config(dir.string()));
  auto call = tok->encode(kCall, tokenizer::AddSpecial::kNo);
  std::vector<int64_t> turn(call.begin(), call.end());
  turn.push_back(tok->token_to_id("<|im_end|>").value());
  const auto store =
      std::filesystem::temp_directory_path() / ("rlhf_multi_turn_tp_" + std::to_string(::getpid()));
  std::filesystem::remove_all(store);
  std::filesystem::create_directories(store);
  std::vector<std::vector<int64_t>> tokens(2);
  std::vector<int64_t> calls(2);
  std::vector<std::string> errors(2);
  auto rank = [&](int r) {
    transport::CollectiveConfig cc;
    cc.rank = r;
    cc.size = 2;
    cc.store_path = (store / "store").string();
    auto group = transport::make_collective_group(cc);
    AddEnvironment env;
    const std::vector<nlohmann::json> rows = {nlohmann::json{{"label", "5"}}};
    EnvironmentTurns turns(r == 0 ? &env : nullptr, *tok, formatter, group.get(), torch::kCPU, 0, 1,
                           1, rows);
    turns.end_turn(0, turn, false);
    const auto answers = turns.poll(0);
    if (answers.size() == 1) tokens[r] = answers[0].tokens;
    calls[r] = turns.stats().tool_calls[0];
    FailingEnvironment failing;
    EnvironmentTurns broken(r == 0 ? &failing : nullptr, *tok, formatter, group.get(), torch::kCPU,
                            0, 1, 1, rows);
    broken.end_turn(0, turn, false);
    try {
      broken.poll(0);
    } catch (const RuntimeError& e) {
      errors[r] = e.what();
    }
  };
  std::thread one(rank, 1);
  rank(0);
  one.join();
  std::filesystem::remove_all(store);
  ASSERT_FALSE(tokens[0].empty());
  EXPECT_EQ(tokens[1], tokens[0]);
  EXPECT_EQ(calls, (std::vector<int64_t>{1, 1}));
  EXPECT_NE(errors[0].find("test:failing raised ValueError"), std::string::npos) << errors[0];
  EXPECT_NE(errors[1].find("rank 0's environment failed"), std::string::npos) << errors[1];
}

}  // namespace
}  // namespace rlhf::rollout
