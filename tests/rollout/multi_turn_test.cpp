// Multi-turn rollouts (issue 31): the paged engine continues each trajectory over its KV
// cache after a TurnHandler's answer (rollout/trajectory.h), and EnvironmentTurns renders an
// environment's answers with the real chat templates. Asserted: the action mask is 0 on
// exactly the answer tokens; the rollout's log-probs of every model token equal a fresh
// forward of the whole conversation (FP32, 1e-5); preemption, eviction of waiting rows,
// padded decode steps and reading liveness every few steps change no output; for ChatML
// (Qwen) and Llama-3 the prompt, the model's turns and the environment's tokens concatenate
// to exactly the template's rendering of the whole conversation.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/errors.h"
#include "envs/environment.h"
#include "models/causal_lm.h"
#include "models/config.h"
#include "models/paged_kv_cache.h"
#include "rollout/generator.h"
#include "rollout/trajectory.h"
#include "test_paths.h"
#include "tests/rollout/route_check.h"
#include "tests/support/http_env_server.h"
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
// With `openings`, rows start from openings as a reset's observation makes them: prompt p's
// rows share `prompt + {250, 251}` when p is even; when p is odd each row s has its own,
// `prompt[:-1] + {250 + s, 251} + prompt[-1]`, but row 1 of prompt 3 has 40 tokens after the
// prompt (no room for a model token in max_new_tokens 40: it ends without a turn).
class ScriptedTurns final : public TurnHandler {
 public:
  explicit ScriptedTurns(int64_t N, bool openings = false)
      : with_openings_(openings), turns_(N, 0) {}
  std::vector<std::vector<int64_t>> openings(const std::vector<std::vector<int64_t>>& prompts,
                                             int64_t n) override {
    if (!with_openings_) return {};
    openings_.clear();
    for (int64_t row = 0; row < static_cast<int64_t>(turns_.size()); ++row) {
      const int64_t p = row / n, s = row % n;
      std::vector<int64_t> o = prompts[p];
      if (p % 2 == 0) {
        o.insert(o.end(), {250, 251});
      } else if (p == 3 && s == 1) {
        for (int64_t k = 0; k < 40; ++k) o.push_back(300 + k);
      } else {
        o.insert(o.end() - 1, {250 + s, 251});
      }
      openings_.push_back(o);
    }
    return openings_;
  }
  void end_turn(int64_t row, const std::vector<int64_t>& tokens, bool last) override {
    EXPECT_FALSE(tokens.empty());
    EXPECT_NE(std::find(kStops.begin(), kStops.end(), tokens.back()), kStops.end());
    ++turns_[row];
    pending_.push_back({row, 1 + row % 3, last});
  }
  void finish(int64_t row, const std::vector<int64_t>& cut_turn) override {
    finished_.push_back(row);
    if (!cut_turn.empty()) cut_turns_[row] = cut_turn;
  }
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
  const std::vector<std::vector<int64_t>>& given_openings() const { return openings_; }
  const std::vector<int64_t>& finished() const { return finished_; }
  // Rows whose last model turn the token budget cut off, with that turn's tokens.
  const std::map<int64_t, std::vector<int64_t>>& cut_turns() const { return cut_turns_; }

 private:
  struct Pending {
    int64_t row;
    int64_t polls;
    bool last;
  };
  bool with_openings_;
  std::deque<Pending> pending_;
  std::vector<Answer> answers_;
  std::vector<int64_t> turns_;
  std::vector<std::vector<int64_t>> openings_;
  std::vector<int64_t> finished_;
  std::map<int64_t, std::vector<int64_t>> cut_turns_;
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
                              const torch::Tensor& mask, bool openings = false,
                              bool routes = false) {
  SamplingParams params;  // temperature 1: the model's own distribution
  params.seed = 5;
  Trajectories r;
  r.turns = std::make_unique<ScriptedTurns>(ids.size(0) * config.n_samples_per_prompt, openings);
  Generator generator(model, config);
  generator.set_record_routes(routes);
  r.out = generator.generate(ids, mask, params, 0, r.turns.get(), 3);
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

// The model tokens' log-probs equal a fresh forward of each row's whole sequence: FP32 both
// ways, only the summation order differs (cached blocks vs one forward), so within 1e-5.
void expect_fresh_forward_log_probs(models::CausalLM& model, const GenerationOutput& out) {
  const auto expected = fresh_log_probs(model, out);
  const auto diff = (out.log_probs - expected).abs().masked_select(out.action_mask);
  EXPECT_LT(diff.max().item<double>(), 1e-5);
}

// Row i's response: its answer tokens are where the mask is 0 (within its length), exactly
// the answers the handler gave in order, each right after a stop token; its model turns are
// the runs of 1s. With openings: the row's tokens (attention mask 1) begin with its opening,
// whose part past the prompt columns is outside the action mask before the first answer.
// Returns the rows whose last turn the budget cut.
int64_t expect_mask_covers_the_answers(const Trajectories& r) {
  const auto& out = r.out;
  const int64_t N = out.sequences.size(0), T = out.sequences.size(1), R = out.action_mask.size(1);
  int64_t multi = 0, cut_rows = 0;
  for (int64_t i = 0; i < N; ++i) {
    const int64_t len = out.response_lengths[i].item<int64_t>();
    std::vector<int64_t> expected;  // the environment's tokens in the response, in order
    if (!r.turns->given_openings().empty()) {
      const auto keep = out.attention_mask[i].nonzero().squeeze(1);
      const auto row = out.sequences[i].index_select(0, keep).contiguous();
      const std::vector<int64_t> tokens(row.data_ptr<int64_t>(),
                                        row.data_ptr<int64_t>() + row.numel());
      const std::vector<int64_t>& opening = r.turns->given_openings()[i];
      const auto in_prompt = static_cast<int64_t>(tokens.size()) - len;
      if (len == 0) {  // no room for a model token after it: no turn, nothing in the output
        EXPECT_EQ(out.turns[i].item<int64_t>(), 0) << "row " << i;
        EXPECT_NE(std::find(r.turns->finished().begin(), r.turns->finished().end(), i),
                  r.turns->finished().end());
        EXPECT_EQ(std::vector<int64_t>(opening.begin(), opening.begin() + in_prompt), tokens);
        continue;
      }
      if (tokens.size() < opening.size()) {
        ADD_FAILURE() << "row " << i << " is shorter than its opening";
        continue;
      }
      EXPECT_EQ(std::vector<int64_t>(tokens.begin(), tokens.begin() + opening.size()), opening)
          << "row " << i;
      expected.assign(opening.begin() + in_prompt, opening.end());
    }
    std::vector<int64_t> env_tokens, runs_of_model, last_run;
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
        last_run.clear();
      }
      if (action) last_run.push_back(out.sequences[i][T - R + t].item<int64_t>());
      in_model = action;
    }
    // A turn the budget cut (no stop token at its end) reaches the handler, which records it
    // in the conversation: exactly the row's last model turn.
    const auto cut = r.turns->cut_turns().find(i);
    if (cut != r.turns->cut_turns().end()) {
      EXPECT_EQ(cut->second, last_run) << "row " << i;
      EXPECT_EQ(std::find(kStops.begin(), kStops.end(), cut->second.back()), kStops.end());
      ++cut_rows;
    } else if (!last_run.empty() &&
               std::find(kStops.begin(), kStops.end(), last_run.back()) == kStops.end()) {
      ADD_FAILURE() << "row " << i << " ended mid-turn without handing the cut turn over";
    }
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
  return cut_rows;
}

TEST(MultiTurn, ContinuedOverTheCacheEqualsAFreshForwardOfTheWholeConversation) {
  auto model = tiny_model(9);
  torch::manual_seed(1);
  auto [ids, mask] = left_padded({4, 6, 2, 5});
  const Trajectories r = run_trajectories(model, multi_turn_config(), ids, mask);
  // Seeded: 5 of the 32 rows run out of budget mid-turn (any would do; none would leave the
  // cut-turn hand-over untested).
  EXPECT_GT(expect_mask_covers_the_answers(r), 0);
  EXPECT_GT(r.out.timings.extended_tokens, 0);
  expect_fresh_forward_log_probs(*model, r.out);
}

// Rows that start from openings (a reset's initial observation re-rendered into the prompt):
// the shared part sits in the prompt columns, each row's own rest in its response outside the
// action mask, and the model's tokens are conditioned on it: their log-probs equal a fresh
// forward of the row's whole sequence. A row whose opening leaves no room ends without a turn.
TEST(MultiTurn, RowsStartFromTheirOpenings) {
  auto model = tiny_model(9);
  torch::manual_seed(1);
  auto [ids, mask] = left_padded({4, 6, 2, 5});
  const Trajectories r = run_trajectories(model, multi_turn_config(), ids, mask, true);
  ASSERT_EQ(r.turns->given_openings().size(), 8u);
  expect_mask_covers_the_answers(r);
  EXPECT_EQ(r.out.response_lengths[7].item<int64_t>(), 0);  // prompt 3's row 1: no room
  // Prompt 0's rows share their whole opening: it is the prompt (4 + 2 tokens in the 6
  // columns), and their responses begin with a model token. Prompt 1's rows differ after 5
  // tokens: those are the prompt, each row's other 3 begin its response.
  EXPECT_EQ(r.out.attention_mask[0].narrow(0, 0, 6).sum().item<int64_t>(), 6);
  EXPECT_TRUE(r.out.action_mask[0][0].item<bool>());
  EXPECT_EQ(r.out.attention_mask[2].narrow(0, 0, 6).sum().item<int64_t>(), 5);
  EXPECT_FALSE(r.out.action_mask[2][0].item<bool>());
  expect_fresh_forward_log_probs(*model, r.out);
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
  const Trajectories reference_openings = run_trajectories(model, config, ids, mask, true);
  for (const auto& v : variants) {
    const Trajectories opened = run_trajectories(model, v.config, ids, mask, true);
    EXPECT_TRUE(torch::equal(opened.out.sequences, reference_openings.out.sequences)) << v.name;
    EXPECT_TRUE(torch::equal(opened.out.action_mask, reference_openings.out.action_mask))
        << v.name << " (openings)";
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

// Routing replay: a mixture of experts' routes are recorded for every token the engine feeds,
// the environment's answers (extends over the cache), openings and rows recomputed after
// their blocks were taken included: each equals a fresh forward's (FP32).
TEST(MultiTurn, RoutesCoverEveryFedTokenThroughExtendsOpeningsAndRecomputes) {
  auto config = models::preset_config("tiny-moe");
  config.initializer_range = 0.1;
  auto model = std::make_shared<models::CausalLM>(config);
  model->init_weights(9);
  model->eval();
  torch::manual_seed(1);
  auto [ids, mask] = left_padded({4, 6, 2, 5});
  GenerationConfig small_pool = multi_turn_config();
  small_pool.kv_cache_bytes =
      14 * models::PagedKvCache::block_bytes(model->config(), 4, torch::kFloat32);
  for (const bool openings : {false, true}) {
    for (const auto& c : {multi_turn_config(), small_pool}) {
      const Trajectories r = run_trajectories(model, c, ids, mask, openings, /*routes=*/true);
      EXPECT_GT(r.out.timings.extended_tokens, 0);
      const int64_t compared = route_check::expect_routes_of_a_fresh_forward(*model, r.out);
      std::cout << (openings ? "openings, " : "") << r.out.timings.preempted
                << " preempted: " << compared << " routed tokens equal a fresh forward's\n";
    }
  }
}

// The one engine is paged: a block size of 0 (the contiguous cache before issue 40.2) is
// refused when the engine is built.
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

// A row's "observation" is its reset's initial observation.
class AddEnvironment final : public envs::Environment {
 public:
  void reset(int64_t id, const nlohmann::json& row) override {
    labels_[id] = row.value("label", "");
    resets_.emplace_back(id, row.value("observation", ""));
  }
  std::vector<std::pair<int64_t, std::string>> poll_resets(double) override {
    return std::exchange(resets_, {});
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
  std::vector<std::pair<int64_t, std::string>> resets_;
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

// The observation test's Python environment: reset gives "The secret is 7." for a row with
// "secret" (None otherwise); a turn that repeats it earns 1 and ends the trajectory.
constexpr const char* kSecretPy = R"PY(
class Secret:
    def reset(self, row):
        self.observation = f"The secret is {row['secret']}." if "secret" in row else None
        return self.observation
    def step(self, action):
        right = self.observation is not None and self.observation in action
        return "ok", 1.0 if right else 0.0, True
)PY";

// A reset's initial observation reaches the model: for each template, row 0 (whose reset
// answered "The secret is 7.") starts from exactly the tokens of the template applied to its
// prompt with the observation appended to the user message (TRL's environment_factory), row
// 1 (none) from its prompt; the conversation records the observation first, the reset's time
// counts in env_seconds, and a turn repeating the secret earns the environment's reward 1.
struct Template {  // a tokenizer family's tokenizer and chat template, loaded once
  std::string family;
  std::unique_ptr<tokenizer::Tokenizer> tok;
  std::unique_ptr<tokenizer::PromptFormatter> formatter;
};

Template load_template(const std::string& family) {
  const auto dir = std::filesystem::path(RLHF_SOURCE_DIR) / ".cache/tokenizers" / family;
  tokenizer::PromptFormatConfig fc;
  fc.apply_chat_template = true;
  return {family, tokenizer::load_tokenizer(dir.string()),
          std::make_unique<tokenizer::PromptFormatter>(
              fc, tokenizer::read_tokenizer_config(dir.string()))};
}

void expect_opening_with_the_observation(envs::Environment& env, const Template& t,
                                         const std::vector<nlohmann::json>& rows) {
  const std::string& family = t.family;
  const auto& tok = t.tok;
  const tokenizer::PromptFormatter& formatter = *t.formatter;
  auto encode = [&](const std::string& text) {
    const auto ids = tok->encode(text, tokenizer::AddSpecial::kNo);
    return std::vector<int64_t>(ids.begin(), ids.end());
  };
  const std::vector<tokenizer::ChatMessage> asked = {{"user", "What is the secret?"}};
  const std::vector<tokenizer::ChatMessage> other = {{"user", "Say hi."}};
  const std::vector<std::vector<int64_t>> prompts = {encode(formatter.format_messages(asked)),
                                                     encode(formatter.format_messages(other))};
  EnvironmentTurns turns(&env, *tok, formatter, nullptr, torch::kCPU, 0, 2, 1, rows);
  const auto openings = turns.openings(prompts, 1);
  ASSERT_EQ(openings.size(), 2u) << family << " " << env.name();
  auto told = asked;
  told[0].content += "The secret is 7.";
  EXPECT_EQ(openings[0], encode(formatter.format_messages(told))) << family << " " << env.name();
  EXPECT_EQ(openings[1], prompts[1]) << family;
  const auto& stats = turns.stats();
  ASSERT_EQ(stats.turns[0].size(), 1u);
  EXPECT_EQ(stats.turns[0][0],
            (nlohmann::json{{"role", "observation"}, {"content", "The secret is 7."}}));
  EXPECT_TRUE(stats.turns[1].empty());
  EXPECT_GT(stats.env_seconds[0], 0.0);
  std::vector<int64_t> turn = encode("The secret is 7.");
  turn.push_back(tok->token_to_id(family == "qwen2" ? "<|im_end|>" : "<|eot_id|>").value());
  turns.end_turn(0, turn, true);
  std::vector<TurnHandler::Answer> answers;
  for (int i = 0; i < 600 && answers.empty(); ++i) answers = turns.poll(0.1);
  ASSERT_EQ(answers.size(), 1u);
  EXPECT_TRUE(answers[0].done);
  EXPECT_DOUBLE_EQ(stats.reward[0], 1.0) << family << " " << env.name();
  turns.finish(1, {});
}

TEST(MultiTurn, ResetObservationIsAppendedToThePromptAsTheTemplateRendersIt) {
  for (const std::string family : {"qwen2", "llama3"}) {
    const auto dir = std::filesystem::path(RLHF_SOURCE_DIR) / ".cache/tokenizers" / family;
    if (!std::filesystem::exists(dir)) GTEST_SKIP() << dir << " missing (scripts/setup makes it)";
    const Template t = load_template(family);
    AddEnvironment env;
    expect_opening_with_the_observation(
        env, t,
        {nlohmann::json{{"label", "7"}, {"observation", "The secret is 7."}},
         nlohmann::json{{"label", "x"}}});
    // No reset gave an observation: every row starts from its prompt (no openings).
    AddEnvironment plain;
    EnvironmentTurns turns(&plain, *t.tok, *t.formatter, nullptr, torch::kCPU, 0, 1, 1,
                           {nlohmann::json{{"label", "x"}}});
    EXPECT_TRUE(turns.openings({{1, 2, 3}}, 1).empty());
    EXPECT_GT(turns.stats().env_seconds[0], 0.0);
  }
}

// The same through a real Python environment (pyhost's processes) and a real HTTP one
// (tests/envs/http_env_server.py).
TEST(MultiTurn, ResetObservationFromPythonAndHttpEnvironments) {
  const auto qwen = std::filesystem::path(RLHF_SOURCE_DIR) / ".cache/tokenizers/qwen2";
  if (!std::filesystem::exists(qwen)) GTEST_SKIP() << qwen << " missing (scripts/setup makes it)";
  const Template t = load_template("qwen2");
  const std::vector<nlohmann::json> rows = {nlohmann::json{{"secret", 7}},
                                            nlohmann::json{{"label", "x"}}};
  const auto dir = std::filesystem::temp_directory_path() /
                   ("rlhf_multi_turn_secret_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "secret.py") << kSecretPy;
  {
    envs::EnvironmentConfig c;
    c.python = (dir / "secret.py").string() + ":Secret";
    c.python_interpreter = RLHF_PYTHON;
    auto env = envs::make_environment(c);
    expect_opening_with_the_observation(*env, t, rows);
  }
  bool started = false;
  {
    test::HttpEnvServer server;  // killed and reaped at the end of the block
    if (server.port() > 0) {
      envs::EnvironmentConfig c;
      c.url = server.url();
      auto env = envs::make_environment(c);
      expect_opening_with_the_observation(*env, t, rows);
    }
    started = server.port() > 0;
  }
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(started) << "the test HTTP server did not start";
}

// An environment that fails as a whole (a Python environment that raised).
class FailingEnvironment final : public envs::Environment {
 public:
  void reset(int64_t, const nlohmann::json&) override {}
  std::vector<std::pair<int64_t, std::string>> poll_resets(double) override {
    throw RuntimeError("environment test:failing raised ValueError in reset");
  }
  void step(int64_t, const std::string&) override {}
  std::vector<std::pair<int64_t, envs::Observation>> poll(double) override {
    throw RuntimeError("environment test:failing raised ValueError");
  }
  void close(int64_t) override {}
  const std::string& name() const override { return name_; }

 private:
  std::string name_ = "test:failing";
};

// Under tensor parallelism rank 0 resets and steps the environment and broadcasts its
// answers: two ranks (threads, a real Gloo group) see the same opening (the prompt with the
// reset's observation), answer tokens and counts, and when rank 0's environment fails, rank 0
// throws its error and rank 1 a message naming rank 0 (at the resets and at a step).
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
  const auto prompt_ids = tok->encode(formatter.format_messages({{"user", "What is 2 + 3?"}}),
                                      tokenizer::AddSpecial::kNo);
  const std::vector<std::vector<int64_t>> prompts = {
      std::vector<int64_t>(prompt_ids.begin(), prompt_ids.end())};
  std::vector<std::vector<int64_t>> tokens(2), opened(2);
  std::vector<int64_t> calls(2);
  std::vector<std::string> errors(2), reset_errors(2);
  auto rank = [&](int r) {
    transport::CollectiveConfig cc;
    cc.rank = r;
    cc.size = 2;
    cc.store_path = (store / "store").string();
    auto group = transport::make_collective_group(cc);
    AddEnvironment env;
    const std::vector<nlohmann::json> rows = {
        nlohmann::json{{"label", "5"}, {"observation", " Use the add tool."}}};
    EnvironmentTurns turns(r == 0 ? &env : nullptr, *tok, formatter, group.get(), torch::kCPU, 0, 1,
                           1, rows);
    const auto openings = turns.openings(prompts, 1);
    if (openings.size() == 1) opened[r] = openings[0];
    turns.end_turn(0, turn, false);
    const auto answers = turns.poll(0);
    if (answers.size() == 1) tokens[r] = answers[0].tokens;
    calls[r] = turns.stats().tool_calls[0];
    FailingEnvironment failing;
    EnvironmentTurns broken(r == 0 ? &failing : nullptr, *tok, formatter, group.get(), torch::kCPU,
                            0, 1, 1, rows);
    try {
      broken.openings(prompts, 1);
    } catch (const RuntimeError& e) {
      reset_errors[r] = e.what();
    }
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
  const auto told =
      tok->encode(formatter.format_messages({{"user", "What is 2 + 3? Use the add tool."}}),
                  tokenizer::AddSpecial::kNo);
  EXPECT_EQ(opened[0], std::vector<int64_t>(told.begin(), told.end()));
  EXPECT_EQ(opened[1], opened[0]);
  EXPECT_NE(reset_errors[0].find("raised ValueError in reset"), std::string::npos)
      << reset_errors[0];
  EXPECT_NE(reset_errors[1].find("rank 0's environment failed"), std::string::npos)
      << reset_errors[1];
  EXPECT_EQ(calls, (std::vector<int64_t>{1, 1}));
  EXPECT_NE(errors[0].find("test:failing raised ValueError"), std::string::npos) << errors[0];
  EXPECT_NE(errors[1].find("rank 0's environment failed"), std::string::npos) << errors[1];
}

}  // namespace
}  // namespace rlhf::rollout
