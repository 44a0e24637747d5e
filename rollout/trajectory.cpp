// EnvironmentTurns: the environment's answers to the batcher's turns. See trajectory.h.
#include "rollout/trajectory.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

#include "core/bits.h"
#include "core/errors.h"
#include "core/timing.h"
#include "transport/collective_group.h"

namespace rlhf::rollout {
namespace {

// Fields of one answer on the wire (int64 each), before its tokens.
enum Field : int64_t { kRow, kDone, kCount, kCalls, kErrors, kTimedOut, kReward, kFields };

}  // namespace

EnvironmentTurns::EnvironmentTurns(envs::Environment* env, const tokenizer::Tokenizer& tokenizer,
                                   const tokenizer::PromptFormatter& formatter,
                                   transport::CollectiveGroup* group, torch::Device device,
                                   int64_t first_row, int64_t N, int64_t n,
                                   const std::vector<nlohmann::json>& rows_json)
    : env_(env),
      tokenizer_(tokenizer),
      formatter_(formatter),
      group_(group),
      device_(device),
      first_row_(first_row),
      pending_(static_cast<size_t>(N)) {
  stats_.reward.assign(N, 0.0);
  stats_.tool_calls.assign(N, 0);
  stats_.tool_errors.assign(N, 0);
  stats_.timed_out.assign(N, 0);
  stats_.env_seconds.assign(N, 0.0);
  stats_.turns.assign(N, nlohmann::json::array());
  if (!env_) return;
  reset_at_ = std::chrono::steady_clock::now();
  for (int64_t r = 0; r < N; ++r) {
    const size_t prompt = static_cast<size_t>(r / n);
    env_->reset(first_row_ + r, prompt < rows_json.size() ? rows_json[prompt] : nlohmann::json());
    pending_[r].open = true;
  }
}

EnvironmentTurns::~EnvironmentTurns() {
  if (!env_) return;
  for (int64_t r = 0; r < static_cast<int64_t>(pending_.size()); ++r) {
    try {
      close(r);
    } catch (...) {  // a failed environment already stopped the request; nothing to add
    }
  }
}

void EnvironmentTurns::close(int64_t row) {
  if (!env_ || !pending_[row].open) return;
  pending_[row].open = false;
  env_->close(first_row_ + row);
}

std::vector<std::string> EnvironmentTurns::reset_observations() {
  constexpr double kWaitSeconds = 0.05;  // one poll's wait; the environment times resets out
  const auto N = static_cast<int64_t>(pending_.size());
  std::vector<std::string> texts(static_cast<size_t>(N));
  std::vector<bool> answered(static_cast<size_t>(N), false);
  for (int64_t left = N; left > 0;) {
    for (auto& [id, text] : env_->poll_resets(kWaitSeconds)) {
      const int64_t row = id - first_row_;
      TORCH_CHECK(row >= 0 && row < N && !answered[row], "environment ", env_->name(),
                  " answered a reset of trajectory ", id, " it was not waiting for");
      answered[row] = true;
      --left;
      stats_.env_seconds[row] += seconds_since(reset_at_);
      if (!text.empty()) stats_.turns[row].push_back({{"role", "observation"}, {"content", text}});
      texts[row] = std::move(text);
    }
  }
  return texts;
}

std::vector<std::vector<int64_t>> EnvironmentTurns::openings(
    const std::vector<std::vector<int64_t>>& prompts, int64_t n) {
  std::vector<std::vector<int64_t>> lists;
  bool failed = false;
  std::string error;
  if (env_) {
    try {
      const std::vector<std::string> texts = reset_observations();
      const bool any =
          std::any_of(texts.begin(), texts.end(), [](const std::string& t) { return !t.empty(); });
      for (size_t r = 0; any && r < texts.size(); ++r) {
        const std::vector<int64_t>& prompt = prompts.at(r / static_cast<size_t>(n));
        if (texts[r].empty()) {
          lists.push_back(prompt);
          continue;
        }
        // The prompt's text is what the chat template rendered (rlhf formats and encodes it
        // the same way): decoded with its special tokens, it takes the observation as
        // format_messages would, and is encoded again.
        const std::vector<tokenizer::TokenId> ids(prompt.begin(), prompt.end());
        const std::string text = formatter_.append_to_last_message(
            tokenizer_.decode(ids, tokenizer::SkipSpecial::kNo), texts[r]);
        const auto encoded = tokenizer_.encode(text, tokenizer::AddSpecial::kNo);
        lists.emplace_back(encoded.begin(), encoded.end());
      }
    } catch (const std::exception& e) {
      if (!group_) throw;
      failed = true;  // the other ranks must hear of it before rank 0 throws
      error = e.what();
    }
  }
  if (!group_) return lists;
  return broadcast_lists(std::move(lists), failed, error);
}

std::vector<std::vector<int64_t>> EnvironmentTurns::broadcast_lists(
    std::vector<std::vector<int64_t>> lists, bool failed, const std::string& error) {
  const auto i64 = torch::TensorOptions(torch::kInt64);
  const bool root = group_->rank() == 0;
  // The wire: the count, each list's length, then every list's tokens.
  std::vector<int64_t> wire;
  if (root && !lists.empty()) {
    wire.push_back(static_cast<int64_t>(lists.size()));
    for (const auto& l : lists) wire.push_back(static_cast<int64_t>(l.size()));
    for (const auto& l : lists) wire.insert(wire.end(), l.begin(), l.end());
  }
  auto size = torch::full({1}, failed ? -1 : static_cast<int64_t>(wire.size()), i64).to(device_);
  group_->broadcast(size, 0);
  const int64_t count = size.to(torch::kCPU).item<int64_t>();
  if (count < 0) {
    if (root) throw RuntimeError(error);
    throw RuntimeError("rollout tensor parallel rank " + std::to_string(group_->rank()) +
                       ": rank 0's environment failed (its error stops the request)");
  }
  if (count == 0 || root) {
    if (count > 0) {
      auto payload = torch::tensor(wire, i64).to(device_);
      group_->broadcast(payload, 0);
    }
    return lists;
  }
  auto payload = torch::empty({count}, i64.device(device_));
  group_->broadcast(payload, 0);
  const auto host = payload.to(torch::kCPU).contiguous();
  const int64_t* w = host.data_ptr<int64_t>();
  std::vector<std::vector<int64_t>> out(static_cast<size_t>(w[0]));
  const int64_t* tokens = w + 1 + w[0];
  for (int64_t i = 0; i < w[0]; ++i) {
    out[i].assign(tokens, tokens + w[1 + i]);
    tokens += w[1 + i];
  }
  return out;
}

void EnvironmentTurns::end_turn(int64_t row, const std::vector<int64_t>& tokens, bool last) {
  Pending& p = pending_[row];
  TORCH_CHECK(!p.waiting, "EnvironmentTurns: row ", row, " already waits for its environment");
  p.waiting = true;
  p.last = last;
  p.since = std::chrono::steady_clock::now();
  // The turn as the model wrote it, its end-of-turn token stripped; special tokens kept (a
  // tool call may be written with them, "<tool_call>" in Qwen's vocabulary).
  std::vector<tokenizer::TokenId> ids(tokens.begin(), tokens.end() - (tokens.empty() ? 0 : 1));
  const std::string text = tokenizer_.decode(ids, tokenizer::SkipSpecial::kNo);
  stats_.turns[row].push_back({{"role", "assistant"}, {"content", text}});
  if (env_) env_->step(first_row_ + row, text);
}

void EnvironmentTurns::finish(int64_t row, const std::vector<int64_t>& cut_turn) {
  // The conversation shows what the model wrote before the budget ended it (its reward is
  // scored on it as the last model turn), marked so.
  if (!cut_turn.empty()) {
    const std::vector<tokenizer::TokenId> ids(cut_turn.begin(), cut_turn.end());
    stats_.turns[row].push_back({{"role", "assistant"},
                                 {"content", tokenizer_.decode(ids, tokenizer::SkipSpecial::kNo)},
                                 {"truncated", true}});
  }
  close(row);
}

std::vector<TurnHandler::Answer> EnvironmentTurns::poll_environment(double wait_s) {
  std::vector<Answer> answers;
  for (auto& [id, obs] : env_->poll(wait_s)) {
    const int64_t row = id - first_row_;
    TORCH_CHECK(row >= 0 && row < static_cast<int64_t>(pending_.size()) && pending_[row].waiting,
                "environment ", env_->name(), " answered trajectory ", id,
                ", which has no step in flight");
    Pending& p = pending_[row];
    p.waiting = false;
    stats_.env_seconds[row] += seconds_since(p.since);
    stats_.reward[row] += obs.reward;
    stats_.tool_calls[row] += obs.tool_calls;
    stats_.tool_errors[row] += obs.tool_errors;
    stats_.timed_out[row] = obs.timed_out ? 1 : 0;
    Answer a;
    a.row = row;
    a.done = obs.done || obs.timed_out || p.last;
    if (!obs.text.empty() || !a.done)
      stats_.turns[row].push_back({{"role", obs.role}, {"content", obs.text}});
    if (!a.done) {
      const auto ids = tokenizer_.encode(formatter_.environment_turn(obs.role, obs.text),
                                         tokenizer::AddSpecial::kNo);
      a.tokens.assign(ids.begin(), ids.end());
    }
    if (a.done) close(row);
    answers.push_back(std::move(a));
  }
  return answers;
}

std::vector<TurnHandler::Answer> EnvironmentTurns::poll(double wait_s) {
  if (!group_) return poll_environment(wait_s);
  std::vector<Answer> answers;
  bool failed = false;
  std::string error;
  if (group_->rank() == 0) {
    try {
      answers = poll_environment(wait_s);
    } catch (const std::exception& e) {
      failed = true;  // the other ranks must hear of it before rank 0 throws
      error = e.what();
    }
  }
  answers = broadcast(std::move(answers), failed);
  if (failed) throw RuntimeError(error);
  return answers;
}

std::vector<TurnHandler::Answer> EnvironmentTurns::broadcast(std::vector<Answer> answers,
                                                             bool failed) {
  const auto i64 = torch::TensorOptions(torch::kInt64);
  const bool root = group_->rank() == 0;
  std::vector<int64_t> wire;
  if (root) {
    for (const Answer& a : answers) {
      const int64_t fields[kFields] = {a.row,
                                       a.done ? 1 : 0,
                                       static_cast<int64_t>(a.tokens.size()),
                                       stats_.tool_calls[a.row],
                                       stats_.tool_errors[a.row],
                                       stats_.timed_out[a.row],
                                       double_bits(stats_.reward[a.row])};
      wire.insert(wire.end(), fields, fields + kFields);
      wire.insert(wire.end(), a.tokens.begin(), a.tokens.end());
    }
  }
  // The size first (-1: rank 0's environment failed), then the answers.
  auto size = torch::full({1}, failed ? -1 : static_cast<int64_t>(wire.size()), i64).to(device_);
  group_->broadcast(size, 0);
  const int64_t count = size.to(torch::kCPU).item<int64_t>();
  if (count < 0) {
    if (root) return {};
    throw RuntimeError("rollout tensor parallel rank " + std::to_string(group_->rank()) +
                       ": rank 0's environment failed (its error stops the request)");
  }
  if (count == 0) return root ? std::move(answers) : std::vector<Answer>{};
  auto payload =
      root ? torch::tensor(wire, i64).to(device_) : torch::empty({count}, i64.device(device_));
  group_->broadcast(payload, 0);
  if (root) return answers;
  const auto host = payload.to(torch::kCPU).contiguous();
  const int64_t* w = host.data_ptr<int64_t>();
  std::vector<Answer> out;
  for (int64_t at = 0; at < count;) {
    Answer a;
    a.row = w[at + kRow];
    a.done = w[at + kDone] != 0;
    stats_.tool_calls[a.row] = w[at + kCalls];
    stats_.tool_errors[a.row] = w[at + kErrors];
    stats_.timed_out[a.row] = w[at + kTimedOut];
    stats_.reward[a.row] = bits_double(w[at + kReward]);
    a.tokens.assign(w + at + kFields, w + at + kFields + w[at + kCount]);
    pending_[a.row].waiting = false;
    at += kFields + w[at + kCount];
    out.push_back(std::move(a));
  }
  return out;
}

}  // namespace rlhf::rollout
