// Multi-turn rollouts (issue 31): what the paged batcher (paged_generation.h) asks between a
// trajectory's turns. A row's model turn ends with a stop token; its tokens go to a
// TurnHandler, the row waits (keeping its KV blocks) while other rows decode, and the
// handler's answer (the environment's turn rendered by the chat template, as tokens) is
// appended over the same cache before decoding goes on. EnvironmentTurns is the handler
// over an envs::Environment, a tokenizer and a chat template; under tensor parallelism rank 0
// steps the environment and broadcasts every answer, so each rank sees the same turns.
// Does not schedule rows (the batcher does) or parse tool calls (the environment does).
#pragma once

#include <torch/types.h>

#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "envs/environment.h"
#include "tokenizer/prompt_format.h"
#include "tokenizer/tokenizer.h"

namespace rlhf::transport {
class CollectiveGroup;
}  // namespace rlhf::transport

namespace rlhf::rollout {

class TurnHandler {
 public:
  // The answer to one row's turn.
  struct Answer {
    int64_t row = -1;             // the request's row (the batcher's)
    std::vector<int64_t> tokens;  // the environment's turn and the next assistant header
    bool done = false;            // the trajectory ends: tokens are not appended
  };

  virtual ~TurnHandler() = default;
  // Before any row is prefilled: the tokens each of the request's rows starts from (row
  // p * n + s is sample s of prompt p; `prompts` are the prompts' tokens without padding), or
  // {} when every row starts from its prompt as is. The same on every TP rank.
  virtual std::vector<std::vector<int64_t>> openings(
      const std::vector<std::vector<int64_t>>& /*prompts*/, int64_t /*n*/) {
    return {};
  }
  // Row `row`'s model turn ended with a stop token; `tokens` are the turn's tokens, the stop
  // token last. `last`: the trajectory ends whatever the answer (rollout.max_turns, or no
  // room left in rollout.max_new_tokens): the environment still scores the turn, but its
  // answer is not appended (poll returns it with done).
  virtual void end_turn(int64_t row, const std::vector<int64_t>& tokens, bool last) = 0;
  // Row `row` ended without a turn to step (its budget ran out mid-turn, or an answer did
  // not fit): its trajectory is over. `cut_turn`: the tokens of the model turn the budget
  // cut off (no stop token), recorded in the conversation; empty when there is none.
  virtual void finish(int64_t row, const std::vector<int64_t>& cut_turn) = 0;
  // Answers that are ready, in an order every TP rank shares. Waits up to `wait_s` for one
  // when turns are pending. Throws RuntimeError naming the environment when it fails.
  virtual std::vector<Answer> poll(double wait_s) = 0;
};

// Per row of a request, what its trajectory gathered (GenerationOutput's multi-turn fields).
struct TrajectoryStats {
  std::vector<double> reward;       // summed environment rewards
  std::vector<int64_t> tool_calls;  // tool calls its turns made
  std::vector<int64_t> tool_errors;
  std::vector<int64_t> timed_out;   // 1: env.timeout_s ended it
  std::vector<double> env_seconds;  // reset to its answer, each turn's end to its answer
  // [{"role", "content"}] after the prompt, in order; first {"role": "observation"} when the
  // reset's initial observation was appended to the prompt's last message.
  std::vector<nlohmann::json> turns;
};

// The TurnHandler over an environment. Rows [first_row, first_row + N) of a request are
// trajectories first_row.. of the environment; row r is reset with rows_json[r / n] (every
// reset in flight at once). openings() waits for the resets' answers: a row whose reset gave
// an initial observation starts from its prompt with the observation appended to the last
// message (PromptFormatter::append_to_last_message), re-tokenized.
class EnvironmentTurns final : public TurnHandler {
 public:
  // `env`: null on TP ranks other than 0 (they receive every answer from rank 0 over
  // `group`; null group without TP). Every pointer must outlive the handler.
  EnvironmentTurns(envs::Environment* env, const tokenizer::Tokenizer& tokenizer,
                   const tokenizer::PromptFormatter& formatter, transport::CollectiveGroup* group,
                   torch::Device device, int64_t first_row, int64_t N, int64_t n,
                   const std::vector<nlohmann::json>& rows_json);
  ~EnvironmentTurns() override;

  std::vector<std::vector<int64_t>> openings(const std::vector<std::vector<int64_t>>& prompts,
                                             int64_t n) override;
  void end_turn(int64_t row, const std::vector<int64_t>& tokens, bool last) override;
  void finish(int64_t row, const std::vector<int64_t>& cut_turn) override;
  std::vector<Answer> poll(double wait_s) override;

  const TrajectoryStats& stats() const { return stats_; }

 private:
  struct Pending {
    bool waiting = false;  // a step is in flight
    bool last = false;
    bool open = false;                            // reset and not closed
    std::chrono::steady_clock::time_point since;  // when the step began
  };
  // Rank 0: the environment's ready observations as answers (stats recorded).
  std::vector<Answer> poll_environment(double wait_s);
  // Rank 0: every row's reset observation ("" for none), recorded in the stats.
  std::vector<std::string> reset_observations();
  // Rank 0's token lists to every rank (failed: rank 0 threw `error`; every rank throws).
  std::vector<std::vector<int64_t>> broadcast_lists(std::vector<std::vector<int64_t>> lists,
                                                    bool failed, const std::string& error);
  // Every answer from rank 0 to every rank (rewards and counts too).
  std::vector<Answer> broadcast(std::vector<Answer> answers, bool failed);
  void close(int64_t row);

  envs::Environment* env_;
  const tokenizer::Tokenizer& tokenizer_;
  const tokenizer::PromptFormatter& formatter_;
  transport::CollectiveGroup* group_;
  torch::Device device_;
  int64_t first_row_;
  std::chrono::steady_clock::time_point reset_at_;  // when the resets were sent
  std::vector<Pending> pending_;
  TrajectoryStats stats_;
};

}  // namespace rlhf::rollout
