// Paged generation with continuous batching: the PagedBatcher (paged_generation.h, which
// describes the schedule) admits, prefills, decodes, preempts and releases the rows of one
// models::PagedKvCache. Generator::generate_paged (paged_generate.cpp) sizes the pool, runs
// the batcher and assembles the output.
#include "rollout/paged_generation.h"

#include <ATen/ATen.h>
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <numeric>
#include <string>
#include <tuple>
#include <utility>

#include "core/errors.h"
#include "core/timing.h"
#include "models/paged_kv_cache.h"
#include "rollout/decode_graph.h"
#include "rollout/generator.h"
#include "rollout/paged_engine.h"
#include "rollout/route_log.h"

namespace rlhf::rollout {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

PagedBatcher::PagedBatcher(models::CausalLM& model, models::PagedKvCache& cache, Sampler& sampler,
                           PagedDecoder* decoder, Generator::DecodeState outputs,
                           std::vector<std::vector<int64_t>> prompts, Limits limits,
                           TurnHandler* turns)
    : model_(model),
      cache_(cache),
      sampler_(sampler),
      decoder_(decoder),
      out_(std::move(outputs)),
      prompts_(std::move(prompts)),
      limits_(limits),
      device_(model.device()),
      turns_(turns) {
  if (out_.stop_ids.defined()) {  // (tests of admission alone pass no outputs)
    const auto stops = out_.stop_ids.to(torch::kCPU).contiguous();
    stop_ids_.assign(stops.data_ptr<int64_t>(), stops.data_ptr<int64_t>() + stops.numel());
  }
  const auto B = static_cast<int64_t>(prompts_.size());
  const auto i64 = torch::TensorOptions(torch::kInt64).device(device_);
  rows_.resize(static_cast<size_t>(B * limits_.n_samples));
  for (int64_t i = 0; i < B; ++i) waiting_.push_back({i, -1});
  next_ = torch::empty({0}, i64);
  live_ = torch::empty({0}, torch::TensorOptions(torch::kBool).device(device_));
  live_tokens_ = torch::zeros({}, i64);
}

void PagedBatcher::run(int64_t check_every) {
  // Nothing runs and rows wait for their environment: how long each poll may block.
  constexpr double kIdleWaitSeconds = 0.05;
  int64_t step = 0;
  admit();
  while (!running_.empty() || !waiting_.empty() || awaiting_ > 0) {
    finish_full_rows();
    if (running_.empty()) {
      admit();
      if (running_.empty() && awaiting_ > 0) {
        const auto clock = Clock::now();
        serve_answers(kIdleWaitSeconds);
        timings_.env_stall_seconds += seconds_since(clock);
        admit();
      }
      TORCH_CHECK(!running_.empty() || waiting_.empty() || awaiting_ > 0,
                  "paged generation: nothing runs and nothing can be admitted");
      continue;
    }
    reserve_decode_positions();
    if (running_.empty()) continue;
    note_peak();
    decode_step();
    if (poll_) poll_version();
    if (++step % check_every == 0) {
      release_finished();
      serve_answers(0.0);
      flush_groups();
      admit();
    }
  }
  flush_groups();
}

int64_t PagedBatcher::held_tokens(const Waiting& w) const {
  const int64_t n = limits_.n_samples;
  return w.row >= 0
             ? static_cast<int64_t>(prompts_[w.row / n].size() + rows_[w.row].history.size() - 1)
             : static_cast<int64_t>(prompts_[w.prompt].size());
}

std::vector<PagedBatcher::Waiting> PagedBatcher::admissible() const {
  std::vector<Waiting> items;
  int64_t seqs = static_cast<int64_t>(running_.size()) + held_awaiting();
  int64_t free = cache_.free_blocks();
  for (const Waiting& w : waiting_) {
    if (static_cast<int64_t>(items.size()) >= limits_.micro_batch_size) break;
    const int64_t count = w.row >= 0 ? 1 : limits_.n_samples;
    const int64_t need = cache_.blocks_for(held_tokens(w));
    const bool alone = seqs == 0;  // nothing else runs: only the blocks themselves matter
    if (seqs + count > limits_.max_seqs || need + (alone ? 0 : limits_.watermark) > free) break;
    seqs += count;
    free -= need;
    items.push_back(w);
  }
  return items;
}

void PagedBatcher::admit() {
  while (!waiting_.empty()) {
    const std::vector<Waiting> items = admissible();
    if (items.empty()) return;
    waiting_.erase(waiting_.begin(), waiting_.begin() + static_cast<int64_t>(items.size()));
    prefill(items);
  }
}

std::vector<std::vector<int64_t>> PagedBatcher::prefill_tokens(const std::vector<Waiting>& items) {
  std::vector<std::vector<int64_t>> tokens;
  for (const auto& w : items) {
    if (w.row < 0) {
      tokens.push_back(prompts_[w.prompt]);
    } else {
      // Prompt and every sampled token but the last, which the next decode step feeds.
      const RowState& r = rows_[w.row];
      auto t = prompts_[w.row / limits_.n_samples];
      t.insert(t.end(), r.history.begin(), r.history.end() - 1);
      timings_.recomputed_tokens += static_cast<int64_t>(t.size());
      tokens.push_back(std::move(t));
    }
  }
  return tokens;
}

void PagedBatcher::prefill(const std::vector<Waiting>& items) {
  const auto clock = Clock::now();
  const std::vector<std::vector<int64_t>> tokens = prefill_tokens(items);
  int64_t L = 0;
  for (const auto& t : tokens) L = std::max<int64_t>(L, static_cast<int64_t>(t.size()));
  const int64_t b = static_cast<int64_t>(items.size());
  auto ids = torch::full({b, L}, limits_.pad_token_id, torch::kInt64);
  auto mask = torch::zeros({b, L}, torch::kInt64);
  std::vector<int64_t> seqs;
  for (int64_t i = 0; i < b; ++i) {
    const int64_t len = static_cast<int64_t>(tokens[i].size());
    ids[i].narrow(0, L - len, len).copy_(torch::tensor(tokens[i], torch::kInt64));
    mask[i].narrow(0, L - len, len).fill_(1);
    const int64_t seq = cache_.create();
    TORCH_CHECK(cache_.reserve(seq, len), "paged generation: admitted without blocks");
    seqs.push_back(seq);
  }
  note_peak();
  cache_.plan_prefill(seqs, mask);
  auto hidden = model_.forward(ids.to(device_), cache_);               // [b, L, H]
  auto logits = model_.logits(hidden.narrow(1, L - 1, 1)).squeeze(1);  // [b, V]
  if (route_log_) {  // a prompt's routes are each of its n rows'
    std::vector<std::vector<int64_t>> to;
    std::vector<int64_t> lengths;
    for (size_t i = 0; i < items.size(); ++i) {
      const Waiting& w = items[i];
      to.push_back(w.row >= 0 ? std::vector<int64_t>{w.row} : row_range(w.prompt));
      lengths.push_back(static_cast<int64_t>(tokens[i].size()));
    }
    route_log_->prefilled(L, to, lengths);
  }
  hidden = torch::Tensor();
  start_rows(items, seqs, logits);
  if (device_.is_cuda()) torch::cuda::synchronize();
  timings_.prefill_seconds += seconds_since(clock);
  start_preambles();
}

void PagedBatcher::start_preambles() {
  std::vector<int64_t> rows, next;
  std::vector<std::vector<int64_t>> feed;
  for (int64_t row : std::exchange(preamble_rows_, {})) {
    RowState& r = rows_[row];
    const std::vector<int64_t>& q = preambles_[row];
    const auto k = static_cast<int64_t>(q.size());
    if (k + 1 > limits_.max_new_tokens) {  // no room for a model token: no turn at all
      finish_row(row);
      if (turns_) turns_->finish(row, {});
      continue;
    }
    // As an answer's tokens: in the output, log-prob 0, outside the action mask.
    out_.tokens[row].narrow(0, 0, k).copy_(torch::tensor(q, torch::kInt64).to(device_));
    out_.log_probs[row].narrow(0, 0, k).zero_();
    out_.lengths[row].fill_(k);
    r.env_spans.emplace_back(0, k);
    r.sampled = r.turn_start = k;
    rows.push_back(row);
    feed.emplace_back(q.begin(), q.end() - 1);  // the last one is the next decode step's feed
    next.push_back(q.back());
  }
  if (!rows.empty()) extend_rows(rows, feed, next);
}

void PagedBatcher::start_rows(const std::vector<Waiting>& items, const std::vector<int64_t>& seqs,
                              const torch::Tensor& logits) {
  const int64_t n = limits_.n_samples;
  // New prompts: fork the sequence to the n samples and sample each one's first token.
  std::vector<int64_t> first_rows, from;
  std::vector<int64_t> pending;  // recomputed rows' next tokens
  std::vector<int64_t> resumed;
  for (int64_t i = 0; i < static_cast<int64_t>(items.size()); ++i) {
    if (items[i].row >= 0) {
      const int64_t row = items[i].row;
      rows_[row].seq = seqs[i];
      pending.push_back(rows_[row].history.back());
      resumed.push_back(row);
      continue;
    }
    for (int64_t s = 0; s < n; ++s) {
      const int64_t row = items[i].prompt * n + s;
      rows_[row].seq = s == 0 ? seqs[i] : cache_.fork(seqs[i]);
      if (!preambles_.empty() && !preambles_[row].empty()) {
        preamble_rows_.push_back(row);  // its first token follows its preamble
        continue;
      }
      first_rows.push_back(row);
      from.push_back(i);
    }
  }
  if (!first_rows.empty()) sample_first_tokens(first_rows, from, logits);
  if (!resumed.empty()) {
    for (int64_t row : resumed) rows_[row].history.clear();
    running_.insert(running_.end(), resumed.begin(), resumed.end());
    next_ = torch::cat({next_, torch::tensor(pending, torch::kInt64).to(device_)});
    live_ = torch::cat({live_, torch::ones({static_cast<int64_t>(resumed.size())},
                                           torch::TensorOptions(torch::kBool).device(device_))});
  }
}

void PagedBatcher::sample_first_tokens(const std::vector<int64_t>& first_rows,
                                       const std::vector<int64_t>& from,
                                       const torch::Tensor& logits) {
  const auto row_index = torch::tensor(first_rows, torch::kInt64).to(device_);
  const auto first_logits = logits.index_select(0, torch::tensor(from, torch::kInt64).to(device_));
  const auto u = out_.uniforms.defined() ? out_.uniforms.index_select(0, row_index).select(1, 0)
                                         : torch::Tensor();
  const auto sampled = sampler_.sample_uniform(first_logits, u);
  out_.tokens.select(1, 0).index_copy_(0, row_index, sampled.tokens);
  out_.log_probs.select(1, 0).index_copy_(0, row_index, sampled.log_probs);
  out_.lengths.index_fill_(0, row_index, 1);
  auto alive = torch::isin(sampled.tokens, out_.stop_ids).logical_not();
  if (limits_.max_new_tokens == 1) alive.fill_(false);
  for (int64_t row : first_rows) rows_[row].sampled = 1;
  running_.insert(running_.end(), first_rows.begin(), first_rows.end());
  next_ = torch::cat({next_, torch::where(alive, sampled.tokens, out_.pad)});
  live_ = torch::cat({live_, alive});
}

void PagedBatcher::finish_full_rows() {
  std::vector<int64_t> keep;
  for (int64_t i = 0; i < static_cast<int64_t>(running_.size()); ++i) {
    if (rows_[running_[i]].sampled >= limits_.max_new_tokens)
      end_row(running_[i]);
    else
      keep.push_back(i);
  }
  keep_running(keep);
}

void PagedBatcher::reserve_decode_positions() {
  bool released = false;
  for (size_t i = 0; i < running_.size();) {
    if (cache_.reserve(rows_[running_[i]].seq, 1)) {
      ++i;
    } else if (!released) {
      release_finished();
      released = true;
      i = 0;  // positions moved; reservations already made stay
    } else if (!evict_awaiting()) {
      TORCH_CHECK(running_.size() > 1, "paged generation: one sequence exceeds the pool");
      preempt_last();
    }
  }
}

void PagedBatcher::decode_step() {
  const int64_t C = static_cast<int64_t>(running_.size());
  std::vector<int64_t> seqs(C), t(C);
  for (int64_t i = 0; i < C; ++i) {
    seqs[i] = rows_[running_[i]].seq;
    t[i] = rows_[running_[i]].sampled;
  }
  torch::Tensor row_index, t_index, logits;
  if (decoder_) {
    // The rows and their token counts travel with the step's inputs, in one copy.
    std::vector<int64_t> extra(running_);
    extra.insert(extra.end(), t.begin(), t.end());
    torch::Tensor index;
    logits = decoder_->step(seqs, next_, extra, &index);  // [C, V]
    row_index = index.narrow(0, 0, C);
    t_index = index.narrow(0, C, C);
  } else {
    row_index = torch::tensor(running_, torch::kInt64).to(device_);
    t_index = torch::tensor(t, torch::kInt64).to(device_);
    cache_.plan_decode(seqs);
    logits = model_.logits(model_.forward(next_.view({C, 1}), cache_)).squeeze(1);  // [C, V]
    if (route_log_) {  // each row fed its last token, output position t - 1
      std::vector<int64_t> at(C);
      for (int64_t i = 0; i < C; ++i) at[i] = prompt_length(running_[i]) + t[i] - 1;
      route_log_->decoded(running_, at, live_);
    }
  }
  ++timings_.decode_steps;
  const auto u =
      out_.uniforms.defined() ? out_.uniforms.index({row_index, t_index}) : torch::Tensor();
  const auto sampled = sampler_.sample_uniform(logits, u);
  out_.tokens.index_put_({row_index, t_index}, torch::where(live_, sampled.tokens, out_.pad));
  out_.log_probs.index_put_(
      {row_index, t_index},
      torch::where(live_, sampled.log_probs, torch::zeros_like(sampled.log_probs)));
  out_.lengths.index_put_(
      {row_index}, torch::where(live_, t_index + 1, out_.lengths.index_select(0, row_index)));
  live_tokens_ += live_.sum();
  live_ = live_ & torch::isin(sampled.tokens, out_.stop_ids).logical_not() &
          (t_index + 1 < limits_.max_new_tokens);
  next_ = torch::where(live_, sampled.tokens, out_.pad);
  for (int64_t row : running_) ++rows_[row].sampled;
}

void PagedBatcher::release_finished() {
  if (running_.empty()) return;
  const auto host = live_.to(torch::kCPU);
  const bool* alive = host.data_ptr<bool>();
  std::vector<int64_t> keep;
  for (int64_t i = 0; i < static_cast<int64_t>(running_.size()); ++i) {
    if (alive[i])
      keep.push_back(i);
    else
      end_row(running_[i]);
  }
  keep_running(keep);
}

void PagedBatcher::preempt_last() {
  const int64_t row = running_.back();
  RowState& r = rows_[row];
  const auto tokens = out_.tokens[row].narrow(0, 0, r.sampled).to(torch::kCPU).contiguous();
  r.history.assign(tokens.data_ptr<int64_t>(), tokens.data_ptr<int64_t>() + r.sampled);
  cache_.release(r.seq);
  r.seq = -1;
  std::vector<int64_t> keep(running_.size() - 1);
  std::iota(keep.begin(), keep.end(), 0);
  keep_running(keep);
  // After rows preempted earlier, before prompts not yet started.
  auto it =
      std::find_if(waiting_.begin(), waiting_.end(), [](const Waiting& w) { return w.row < 0; });
  waiting_.insert(it, Waiting{-1, row});
  ++timings_.preempted;
}

void PagedBatcher::finish_row(int64_t row) {
  cache_.release(rows_[row].seq);
  rows_[row].seq = -1;
  rows_[row].done = true;
  if (!on_groups_done_) return;
  const int64_t n = limits_.n_samples, prompt = row / n;
  rows_ended_.resize(prompts_.size(), 0);
  if (++rows_ended_[static_cast<size_t>(prompt)] == n) groups_ended_.push_back(prompt);
}

void PagedBatcher::flush_groups() {
  if (!on_groups_done_ || groups_ended_.empty()) return;
  on_groups_done_(std::exchange(groups_ended_, {}));
}

void PagedBatcher::end_row(int64_t row) {
  if (!turns_) return finish_row(row);
  RowState& r = rows_[row];
  // Its real length: on a GPU a row that stopped is fed padding until the next check.
  const int64_t length = out_.lengths[row].item<int64_t>();
  r.sampled = length;
  const auto turn =
      out_.tokens[row].narrow(0, r.turn_start, length - r.turn_start).to(torch::kCPU).contiguous();
  const std::vector<int64_t> tokens(turn.data_ptr<int64_t>(),
                                    turn.data_ptr<int64_t>() + turn.numel());
  ++r.turns;
  const bool stopped = !tokens.empty() && std::find(stop_ids_.begin(), stop_ids_.end(),
                                                    tokens.back()) != stop_ids_.end();
  if (!stopped) {  // the budget ended it mid-turn: nothing to step
    finish_row(row);
    turns_->finish(row, tokens);
    return;
  }
  // An answer needs a token of its own and one the model samples after it.
  const bool last = r.turns >= limits_.max_turns || length + 2 > limits_.max_new_tokens;
  if (last) {
    finish_row(row);  // scored by the environment, nothing appended: the blocks can go
  } else {
    // The cache holds the prompt and the turn but its stop token (the next feed), without
    // the padding fed after it.
    cache_.truncate(r.seq,
                    static_cast<int64_t>(prompts_[row / limits_.n_samples].size()) + length - 1);
  }
  r.awaiting = true;
  ++awaiting_;
  turns_->end_turn(row, tokens, last);
}

void PagedBatcher::serve_answers(double wait_s) {
  if (!turns_ || awaiting_ == 0) return;
  std::vector<int64_t> rows, next;
  std::vector<std::vector<int64_t>> feed;
  for (TurnHandler::Answer& a : turns_->poll(wait_s)) {
    RowState& r = rows_[a.row];
    TORCH_CHECK(r.awaiting, "paged generation: an answer for row ", a.row,
                ", which waits for none");
    r.awaiting = false;
    --awaiting_;
    if (r.done) continue;  // its last turn: scored, not appended
    const auto k = static_cast<int64_t>(a.tokens.size());
    if (a.done || k == 0 || r.sampled + k >= limits_.max_new_tokens) {
      if (!a.done) turns_->finish(a.row, {});  // no room for the answer and a model token
      if (r.seq >= 0) finish_row(a.row);
      r.done = true;
      continue;
    }
    // The answer's tokens join the output (log-prob 0, outside the action mask).
    const auto answer = torch::tensor(a.tokens, torch::kInt64).to(device_);
    out_.tokens[a.row].narrow(0, r.sampled, k).copy_(answer);
    out_.log_probs[a.row].narrow(0, r.sampled, k).zero_();
    out_.lengths[a.row].fill_(r.sampled + k);
    r.env_spans.emplace_back(r.sampled, k);
    // The cache takes the turn's stop token and the answer but its last token, which the
    // next decode step feeds (as after a prefill).
    std::vector<int64_t> f{out_.tokens[a.row][r.sampled - 1].item<int64_t>()};
    f.insert(f.end(), a.tokens.begin(), a.tokens.end() - 1);
    r.sampled += k;
    r.turn_start = r.sampled;
    if (r.seq < 0) {  // its blocks were taken while it waited: recompute
      requeue(a.row);
      continue;
    }
    rows.push_back(a.row);
    feed.push_back(std::move(f));
    next.push_back(a.tokens.back());
  }
  if (!rows.empty()) extend_rows(rows, feed, next);
}

void PagedBatcher::extend_rows(const std::vector<int64_t>& rows,
                               const std::vector<std::vector<int64_t>>& feed,
                               const std::vector<int64_t>& next) {
  const auto clock = Clock::now();
  std::vector<int64_t> seqs, kept, kept_next;
  std::vector<const std::vector<int64_t>*> kept_feed;
  int64_t T = 0;
  std::vector<int64_t> fed_nothing, fed_nothing_next;  // a one-token preamble: nothing to extend
  for (size_t i = 0; i < rows.size(); ++i) {
    RowState& r = rows_[rows[i]];
    if (feed[i].empty()) {
      fed_nothing.push_back(rows[i]);
      fed_nothing_next.push_back(next[i]);
      continue;
    }
    if (!cache_.reserve(r.seq, static_cast<int64_t>(feed[i].size()))) {
      cache_.release(r.seq);  // short of blocks: prefill it whole later, as a preempted row
      r.seq = -1;
      requeue(rows[i]);
      continue;
    }
    seqs.push_back(r.seq);
    kept.push_back(rows[i]);
    kept_next.push_back(next[i]);
    kept_feed.push_back(&feed[i]);
    T = std::max<int64_t>(T, static_cast<int64_t>(feed[i].size()));
  }
  if (!fed_nothing.empty()) {
    running_.insert(running_.end(), fed_nothing.begin(), fed_nothing.end());
    next_ = torch::cat({next_, torch::tensor(fed_nothing_next, torch::kInt64).to(device_)});
    live_ = torch::cat({live_, torch::ones({static_cast<int64_t>(fed_nothing.size())},
                                           torch::TensorOptions(torch::kBool).device(device_))});
  }
  if (kept.empty()) return;
  const int64_t b = static_cast<int64_t>(kept.size());
  auto ids = torch::full({b, T}, limits_.pad_token_id, torch::kInt64);
  auto mask = torch::zeros({b, T}, torch::kInt64);
  for (int64_t i = 0; i < b; ++i) {
    const auto len = static_cast<int64_t>(kept_feed[i]->size());
    ids[i].narrow(0, 0, len).copy_(torch::tensor(*kept_feed[i], torch::kInt64));
    mask[i].narrow(0, 0, len).fill_(1);
  }
  note_peak();
  cache_.plan_extend(seqs, mask);
  model_.forward(ids.to(device_), cache_);  // keys and values only: the next step samples
  if (route_log_) {                         // the feed ends at the output's last position but one
    std::vector<int64_t> at, lengths;
    for (int64_t i = 0; i < b; ++i) {
      lengths.push_back(static_cast<int64_t>(kept_feed[i]->size()));
      at.push_back(prompt_length(kept[i]) + rows_[kept[i]].sampled - 1 - lengths.back());
    }
    route_log_->extended(T, kept, at, lengths);
  }
  running_.insert(running_.end(), kept.begin(), kept.end());
  next_ = torch::cat({next_, torch::tensor(kept_next, torch::kInt64).to(device_)});
  live_ = torch::cat({live_, torch::ones({b}, torch::TensorOptions(torch::kBool).device(device_))});
  if (device_.is_cuda()) torch::cuda::synchronize();
  timings_.extend_seconds += seconds_since(clock);
  timings_.extended_tokens += mask.sum().item<int64_t>();
}

void PagedBatcher::requeue(int64_t row) {
  RowState& r = rows_[row];
  const auto tokens = out_.tokens[row].narrow(0, 0, r.sampled).to(torch::kCPU).contiguous();
  r.history.assign(tokens.data_ptr<int64_t>(), tokens.data_ptr<int64_t>() + r.sampled);
  auto it =
      std::find_if(waiting_.begin(), waiting_.end(), [](const Waiting& w) { return w.row < 0; });
  waiting_.insert(it, Waiting{-1, row});
}

bool PagedBatcher::evict_awaiting() {
  for (int64_t row = static_cast<int64_t>(rows_.size()) - 1; row >= 0; --row) {
    RowState& r = rows_[row];
    if (!r.awaiting || r.seq < 0) continue;
    cache_.release(r.seq);
    r.seq = -1;
    ++timings_.preempted;
    return true;
  }
  return false;
}

int64_t PagedBatcher::held_awaiting() const {
  if (awaiting_ == 0) return 0;
  int64_t held = 0;
  for (const RowState& r : rows_) held += r.awaiting && r.seq >= 0 ? 1 : 0;
  return held;
}

void PagedBatcher::keep_running(const std::vector<int64_t>& keep) {
  if (static_cast<int64_t>(keep.size()) == static_cast<int64_t>(running_.size())) return;
  std::vector<int64_t> kept;
  for (int64_t k : keep) kept.push_back(running_[k]);
  running_ = std::move(kept);
  const auto index = torch::tensor(keep, torch::kInt64).to(device_);
  next_ = next_.index_select(0, index);
  live_ = live_.index_select(0, index);
}

void PagedBatcher::poll_version() {
  const int64_t now = poll_();
  const int64_t last = updates_.empty() ? version_ : updates_.back().first;
  if (now == last) return;
  std::vector<int64_t> at;
  at.reserve(rows_.size());
  for (const RowState& r : rows_) at.push_back(r.sampled);
  updates_.emplace_back(now, std::move(at));
}

torch::Tensor PagedBatcher::token_versions(int64_t R) const {
  auto versions = torch::full({static_cast<int64_t>(rows_.size()), R}, version_, torch::kInt64);
  for (const auto& [version, at] : updates_)
    for (size_t row = 0; row < at.size(); ++row)
      if (at[row] < R)
        versions[static_cast<int64_t>(row)].narrow(0, at[row], R - at[row]).fill_(version);
  return versions;
}

void PagedBatcher::note_peak() {
  timings_.kv_peak_bytes = std::max(
      timings_.kv_peak_bytes, (cache_.num_blocks() - cache_.free_blocks()) * limits_.block_bytes);
}

}  // namespace rlhf::rollout
