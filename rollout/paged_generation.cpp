// Paged generation with continuous batching (Generator::generate_paged, see generator.h):
// every row of the request goes through one models::PagedKvCache, scheduled by a
// PagedBatcher (paged_generation.h, which describes the schedule). generate_paged sizes the
// pool and assembles the output; the batcher admits, prefills, decodes, preempts and
// releases.
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

namespace rlhf::rollout {
namespace {

using Clock = std::chrono::steady_clock;

// Each prompt's tokens (left padding dropped), on the host. prompt_ids, prompt_mask: [B, P].
std::vector<std::vector<int64_t>> unpadded_prompts(const torch::Tensor& prompt_ids,
                                                   const torch::Tensor& prompt_mask) {
  const int64_t B = prompt_ids.size(0), P = prompt_ids.size(1);
  std::vector<std::vector<int64_t>> prompts(B);
  const auto ids = prompt_ids.to(torch::kCPU, torch::kInt64).contiguous();
  const auto mask = prompt_mask.to(torch::kCPU, torch::kInt64).contiguous();
  const int64_t* id = ids.data_ptr<int64_t>();
  const int64_t* m = mask.data_ptr<int64_t>();
  for (int64_t i = 0; i < B; ++i)
    for (int64_t j = 0; j < P; ++j)
      if (m[i * P + j] != 0) prompts[i].push_back(id[i * P + j]);
  return prompts;
}

// Multi-turn rows that start from openings (TurnHandler::openings: [N] token lists, row
// p * n + s of prompt p): each prompt becomes the tokens its rows' openings share (at most P,
// so the [B, P] prompt columns still hold it), and each row's preamble the rest of its
// opening. Returns the new prompt_ids and prompt_mask [B, P] (left-padded with pad_id).
std::pair<torch::Tensor, torch::Tensor> split_openings(
    const std::vector<std::vector<int64_t>>& openings, int64_t n, int64_t P, int64_t pad_id,
    std::vector<std::vector<int64_t>>& prompts, std::vector<std::vector<int64_t>>& preambles) {
  const auto B = static_cast<int64_t>(prompts.size());
  TORCH_CHECK(static_cast<int64_t>(openings.size()) == B * n, "paged generation: ", openings.size(),
              " openings for ", B * n, " rows");
  auto ids = torch::full({B, P}, pad_id, torch::kInt64), mask = torch::zeros({B, P}, torch::kInt64);
  preambles.assign(static_cast<size_t>(B * n), {});
  for (int64_t p = 0; p < B; ++p) {
    size_t shared = std::min<size_t>(openings[p * n].size(), static_cast<size_t>(P));
    for (int64_t s = 1; s < n; ++s) {
      const auto& o = openings[p * n + s];
      shared = static_cast<size_t>(
          std::mismatch(o.begin(), o.begin() + std::min(shared, o.size()), openings[p * n].begin())
              .first -
          o.begin());
    }
    TORCH_CHECK(shared > 0, "paged generation: the openings of prompt ", p,
                " share no first token");
    prompts[p].assign(openings[p * n].begin(), openings[p * n].begin() + shared);
    for (int64_t s = 0; s < n; ++s)
      preambles[p * n + s].assign(openings[p * n + s].begin() + shared, openings[p * n + s].end());
    const auto len = static_cast<int64_t>(shared);
    ids[p].narrow(0, P - len, len).copy_(torch::tensor(prompts[p], torch::kInt64));
    mask[p].narrow(0, P - len, len).fill_(1);
  }
  return {ids, mask};
}

// What a multi-turn request's rows start from: the prompt columns the output shows ([B, P],
// the request's own when no row has an opening), each row's preamble, and the seconds the
// handler's openings took (it waits for the environment's resets).
struct Openings {
  torch::Tensor prompt_ids, prompt_mask;
  std::vector<std::vector<int64_t>> preambles;  // [N] or empty
  double wait_seconds = 0.0;
};

Openings open_rows(TurnHandler* turns, int64_t n, const torch::Tensor& prompt_ids,
                   const torch::Tensor& prompt_mask, int64_t pad_id,
                   std::vector<std::vector<int64_t>>& prompts) {
  Openings o{prompt_ids, prompt_mask, {}, 0.0};
  if (!turns) return o;
  const auto clock = Clock::now();
  const auto openings = turns->openings(prompts, n);
  o.wait_seconds = seconds_since(clock);
  if (!openings.empty())
    std::tie(o.prompt_ids, o.prompt_mask) =
        split_openings(openings, n, prompt_ids.size(1), pad_id, prompts, o.preambles);
  return o;
}

// The pool's blocks for prompts of P tokens: the budget's (config.kv_cache_bytes), or what
// `rows` sequences at full length (P + max_new_tokens) can hold. Throws InputError when the
// budget holds less than one sequence.
int64_t pool_blocks(const GenerationConfig& config, int64_t P, int64_t rows, int64_t block_bytes) {
  const int64_t R = config.max_new_tokens, bs = config.kv_block_size;
  const int64_t blocks_per_row = (P + R + bs - 1) / bs;
  int64_t num_blocks = rows * blocks_per_row;
  if (config.kv_cache_bytes <= 0) return num_blocks;
  num_blocks = std::min(num_blocks, config.kv_cache_bytes / block_bytes);
  if (num_blocks < blocks_per_row) {
    const double gib = static_cast<double>(blocks_per_row * block_bytes) / (1ll << 30);
    throw InputError("rollout.kv_cache_memory_gb (" +
                     std::to_string(static_cast<double>(config.kv_cache_bytes) / (1ll << 30)) +
                     " GiB) holds less than one sequence: " + std::to_string(P) + " prompt + " +
                     std::to_string(R) + " new tokens in blocks of " + std::to_string(bs) +
                     " need " + std::to_string(gib) + " GiB");
  }
  return num_blocks;
}

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

void Generator::release_paged_engine() {
  paged_engine_.reset();
}

Generator::PagedEngine& Generator::paged_engine(int64_t num_blocks, int64_t max_batch,
                                                int64_t max_blocks) {
  auto& e = paged_engine_;
  if (e && e->num_blocks >= num_blocks && e->max_batch >= max_batch &&
      e->max_blocks >= max_blocks && e->cache->free_blocks() == e->cache->num_blocks()) {
    e->cache->forget_released();
    return *e;
  }
  // Larger than both the old engine and this call: a request that grows now and then does
  // not recapture at every size.
  auto next = std::make_unique<PagedEngine>();
  next->num_blocks = std::max(num_blocks, e ? e->num_blocks : 0);
  next->max_batch = std::max(max_batch, e ? e->max_batch : 0);
  next->max_blocks = std::max(max_blocks, e ? e->max_blocks : 0);
  e.reset();  // the old pool's memory first
  models::CausalLM& model = *model_;
  next->cache = std::make_unique<models::PagedKvCache>(
      model.shard_config(), next->num_blocks, config_.kv_block_size, model.dtype(), model.device());
  next->cache->set_in_place_decode(config_.gpu_kernels);
  next->decoder = std::make_unique<PagedDecoder>(model, *next->cache, next->max_batch,
                                                 next->max_blocks, /*capture=*/true);
  e = std::move(next);
  return *e;
}

namespace {

PagedBatcher::Limits batcher_limits(const GenerationConfig& config, int64_t max_seqs,
                                    int64_t num_blocks, int64_t block_bytes, int64_t max_turns) {
  PagedBatcher::Limits limits;
  limits.n_samples = config.n_samples_per_prompt;
  limits.max_new_tokens = config.max_new_tokens;
  limits.max_seqs = max_seqs;
  limits.micro_batch_size = config.micro_batch_size;
  // Blocks kept free when admitting while others run, so a decode step rarely preempts.
  limits.watermark = std::max<int64_t>(1, num_blocks / 100);
  limits.block_bytes = block_bytes;
  limits.pad_token_id = config.pad_token_id;
  limits.max_turns = max_turns;
  return limits;
}

// Multi-turn: each row's model turns, and the environment's tokens taken out of the action
// mask (they stay in the sequence and its attention mask).
void mark_environment_tokens(const PagedBatcher& batcher, int64_t N, GenerationOutput& result) {
  result.turns = torch::zeros({N}, torch::kInt64);
  for (int64_t row = 0; row < N; ++row) {
    result.turns[row] = batcher.turns(row);
    for (const auto& [start, length] : batcher.env_spans(row))
      result.action_mask[row].narrow(0, start, length).fill_(false);
  }
}

// Padded decode steps, CUDA graphs on a GPU (decode_graph.h), where the whole call runs on
// the decode stream. Not under tensor parallelism: its all-reduces run outside any graph
// (Gloo cannot be captured), so a TP rank decodes eagerly. Nor for a mixture of experts: its
// block reads each expert's token count on the host (models/moe.cpp), which a graph cannot.
bool uses_padded_steps(const GenerationConfig& config, const torch::Device& device,
                       bool tensor_parallel, bool mixture_of_experts) {
  return config.decode_steps == DecodeSteps::kPadded ||
         (config.decode_steps == DecodeSteps::kAuto && device.is_cuda() && !tensor_parallel &&
          !mixture_of_experts);
}

}  // namespace

GenerationOutput Generator::generate_paged(const torch::Tensor& prompt_ids,
                                           const torch::Tensor& prompt_mask, Sampler& sampler,
                                           int64_t first_row, TurnHandler* turns,
                                           int64_t max_turns) {
  torch::NoGradGuard no_grad;
  models::CausalLM& model = *model_;
  const auto device = model.device();
  const auto& mc = model.shard_config();  // a TP rank's cache holds its kv heads only
  const int64_t B = prompt_ids.size(0), P = prompt_ids.size(1);
  const int64_t n = config_.n_samples_per_prompt, N = B * n, R = config_.max_new_tokens;
  const int64_t bs = config_.kv_block_size;
  const int64_t max_seqs =
      config_.max_num_seqs > 0 ? config_.max_num_seqs : config_.micro_batch_size * n;
  const int64_t check_every =
      config_.sync_interval > 0 ? config_.sync_interval : (device.is_cpu() ? 1 : 8);
  const bool padded_steps = uses_padded_steps(config_, device, model.tensor_parallel().enabled(),
                                              model.config().moe.num_experts > 0);
  DecodeStream on_decode_stream(padded_steps ? device : torch::Device(torch::kCPU));
  std::vector<std::vector<int64_t>> prompts = unpadded_prompts(prompt_ids, prompt_mask);
  // Multi-turn: rows may start from their environment's initial observation (openings).
  Openings opened = open_rows(turns, n, prompt_ids, prompt_mask, config_.pad_token_id, prompts);

  const int64_t per_block = models::PagedKvCache::block_bytes(mc, bs, model.dtype());
  const int64_t blocks_per_row = (P + R + bs - 1) / bs;
  int64_t num_blocks = pool_blocks(config_, P, std::min(max_seqs, N), per_block);
  // CUDA graphs: the pool and the graphs stay for the next call (captured once per shape).
  // Otherwise this call's own pool and padded steps (eager).
  std::unique_ptr<models::PagedKvCache> own_cache;
  std::unique_ptr<PagedDecoder> own_decoder;
  models::PagedKvCache* cache = nullptr;
  PagedDecoder* decoder = nullptr;
  const bool kept = padded_steps && device.is_cuda();
  int64_t graphs_before = 0;
  double capture_before = 0.0;
  if (kept) {
    PagedEngine& engine = paged_engine(num_blocks, max_seqs, blocks_per_row);
    cache = engine.cache.get();
    decoder = engine.decoder.get();
    num_blocks = engine.num_blocks;
    graphs_before = decoder->graphs();
    capture_before = decoder->capture_seconds();
  } else {
    own_cache = std::make_unique<models::PagedKvCache>(mc, num_blocks, bs, model.dtype(), device);
    own_cache->set_in_place_decode(config_.gpu_kernels);
    cache = own_cache.get();
    if (padded_steps) {
      own_decoder = std::make_unique<PagedDecoder>(model, *cache, std::min(max_seqs, N),
                                                   blocks_per_row, /*capture=*/false);
      decoder = own_decoder.get();
    }
  }

  const DecodeState d = decode_state(sampler, first_row, N, device);
  const PagedBatcher::Limits limits =
      batcher_limits(config_, max_seqs, num_blocks, per_block, max_turns);
  PagedBatcher batcher(model, *cache, sampler, decoder, d, std::move(prompts), limits, turns);
  batcher.set_preambles(std::move(opened.preambles));
  hook(batcher, opened.prompt_ids, opened.prompt_mask, d, turns == nullptr);
  auto clock = Clock::now();
  batcher.run(check_every);
  if (device.is_cuda()) torch::cuda::synchronize();
  GenerationTimings timings = batcher.timings();
  timings.env_stall_seconds += opened.wait_seconds;  // nothing ran until the resets answered
  timings.kv_pool_bytes = num_blocks * per_block;
  timings.decode_seconds = seconds_since(clock) - timings.prefill_seconds;
  timings.decode_tokens = batcher.decode_tokens().item<int64_t>();
  if (kept) {  // the graphs this call captured (0 when every shape was there already)
    timings.cuda_graphs = decoder->graphs() - graphs_before;
    timings.graph_capture_seconds = decoder->capture_seconds() - capture_before;
    timings.graph_kernels = decoder->kernels_per_step();
  }

  auto result =
      assemble_output(opened.prompt_ids, opened.prompt_mask, n, d.tokens, d.log_probs, d.lengths);
  result.timings = timings;
  result.token_versions = batcher.token_versions(config_.max_new_tokens)
                              .narrow(1, 0, result.action_mask.size(1))
                              .contiguous();
  if (turns) mark_environment_tokens(batcher, N, result);
  return result;
}

}  // namespace rlhf::rollout
