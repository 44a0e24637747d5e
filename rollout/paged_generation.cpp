// Paged generation with continuous batching (Generator::generate_paged, see generator.h):
// every row of the request goes through one models::PagedKvCache.
//
// The schedule, as vLLM's (v0) scheduler with recompute preemption:
// - waiting: prompts not yet started, and preempted rows (first, oldest first);
// - a prompt is admitted when max_num_seqs leaves room for its n samples and the pool has
//   blocks for its tokens (plus a small watermark while others run); it is prefilled once,
//   its first token sampled for every sample, and its n sequences share the prompt's blocks;
// - each decode step feeds every running row its last token; a row that needs a block when
//   none is free first waits for finished rows to be released, then the latest-admitted row
//   is preempted: its blocks return to the pool and it waits to be prefilled again with its
//   prompt and the tokens it had (its sampled tokens stay; the next one continues its
//   stream), so preemption changes no output;
// - finished rows leave at the next check of the device (every step on the CPU, every
//   sync_interval on a GPU) and new prompts join in their place.
#include <ATen/ATen.h>
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <numeric>
#include <string>

#include "core/errors.h"
#include "models/paged_kv_cache.h"
#include "rollout/decode_graph.h"
#include "rollout/generator.h"

namespace rlhf::rollout {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// One output row's place in the schedule.
struct RowState {
  int64_t seq = -1;              // its PagedKvCache sequence; -1 while not resident
  int64_t sampled = 0;           // tokens sampled so far
  bool done = false;             // ended (stop token or max_new_tokens), blocks released
  std::vector<int64_t> history;  // preempted: the tokens it had sampled (host copy)
};

// A waiting item: a whole prompt (its n rows), or one preempted row.
struct Waiting {
  int64_t prompt = -1;
  int64_t row = -1;
};

}  // namespace

GenerationOutput Generator::generate_paged(const torch::Tensor& prompt_ids,
                                           const torch::Tensor& prompt_mask, Sampler& sampler,
                                           int64_t first_row) {
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
  // Padded decode steps, CUDA graphs on a GPU (decode_graph.h), where the whole call runs on
  // the decode stream.
  // Not under tensor parallelism: its all-reduces run outside any graph (Gloo cannot be
  // captured), so a TP rank decodes eagerly.
  const bool padded_steps = config_.decode_steps == DecodeSteps::kPadded ||
                            (config_.decode_steps == DecodeSteps::kAuto && device.is_cuda() &&
                             !model.tensor_parallel().enabled());
  DecodeStream on_decode_stream(padded_steps ? device : torch::Device(torch::kCPU));

  // Each prompt's tokens (left padding dropped), on the host.
  std::vector<std::vector<int64_t>> prompts(B);
  {
    const auto ids = prompt_ids.to(torch::kCPU, torch::kInt64).contiguous();
    const auto mask = prompt_mask.to(torch::kCPU, torch::kInt64).contiguous();
    const int64_t* id = ids.data_ptr<int64_t>();
    const int64_t* m = mask.data_ptr<int64_t>();
    for (int64_t i = 0; i < B; ++i)
      for (int64_t j = 0; j < P; ++j)
        if (m[i * P + j] != 0) prompts[i].push_back(id[i * P + j]);
  }

  // The pool: the budget's blocks, or what the most sequences at full length can hold.
  const int64_t per_block = models::PagedKvCache::block_bytes(mc, bs, model.dtype());
  const int64_t blocks_per_row = (P + R + bs - 1) / bs;
  int64_t num_blocks = std::min(max_seqs, N) * blocks_per_row;
  if (config_.kv_cache_bytes > 0) {
    num_blocks = std::min(num_blocks, config_.kv_cache_bytes / per_block);
    if (num_blocks < blocks_per_row) {
      const double gib = static_cast<double>(blocks_per_row * per_block) / (1ll << 30);
      throw InputError("rollout.kv_cache_memory_gb (" +
                       std::to_string(static_cast<double>(config_.kv_cache_bytes) / (1ll << 30)) +
                       " GiB) holds less than one sequence: " + std::to_string(P) + " prompt + " +
                       std::to_string(R) + " new tokens in blocks of " + std::to_string(bs) +
                       " need " + std::to_string(gib) + " GiB");
    }
  }
  models::PagedKvCache cache(mc, num_blocks, bs, model.dtype(), device);
  // Blocks kept free when admitting while others run, so a decode step rarely preempts.
  const int64_t watermark = std::max<int64_t>(1, num_blocks / 100);
  std::unique_ptr<PagedDecoder> decoder;
  if (padded_steps)
    decoder = std::make_unique<PagedDecoder>(model, cache, std::min(max_seqs, N), blocks_per_row,
                                             device.is_cuda());

  GenerationTimings timings;
  timings.kv_pool_bytes = num_blocks * per_block;
  const auto i64 = torch::TensorOptions(torch::kInt64).device(device);
  DecodeState d = decode_state(sampler, first_row, N, device);
  const auto& uniforms_dev = d.uniforms;
  const auto& stop_ids = d.stop_ids;
  const auto& pad = d.pad;
  auto& out_tokens = d.tokens;
  auto& out_log_probs = d.log_probs;
  auto& lengths = d.lengths;

  std::vector<RowState> rows(N);
  std::deque<Waiting> waiting;
  for (int64_t i = 0; i < B; ++i) waiting.push_back({i, -1});
  // Running rows in decode order (admission order), with their next token and liveness on
  // the device, aligned with `running`.
  std::vector<int64_t> running;
  torch::Tensor next = torch::empty({0}, i64);
  torch::Tensor live = torch::empty({0}, torch::TensorOptions(torch::kBool).device(device));
  auto live_tokens = torch::zeros({}, i64);

  auto note_peak = [&] {
    timings.kv_peak_bytes =
        std::max(timings.kv_peak_bytes, (num_blocks - cache.free_blocks()) * per_block);
  };
  // Keeps running positions `keep` (host indices into running), in order.
  auto keep_running = [&](const std::vector<int64_t>& keep) {
    if (static_cast<int64_t>(keep.size()) == static_cast<int64_t>(running.size())) return;
    std::vector<int64_t> kept;
    for (int64_t k : keep) kept.push_back(running[k]);
    running = std::move(kept);
    const auto index = torch::tensor(keep, torch::kInt64).to(device);
    next = next.index_select(0, index);
    live = live.index_select(0, index);
  };
  auto finish_row = [&](int64_t row) {
    cache.release(rows[row].seq);
    rows[row].seq = -1;
    rows[row].done = true;
  };
  // Reads liveness (the loop's wait for the device) and releases rows that ended.
  auto release_finished = [&] {
    if (running.empty()) return;
    const auto host = live.to(torch::kCPU);
    const bool* alive = host.data_ptr<bool>();
    std::vector<int64_t> keep;
    for (int64_t i = 0; i < static_cast<int64_t>(running.size()); ++i) {
      if (alive[i])
        keep.push_back(i);
      else
        finish_row(running[i]);
    }
    keep_running(keep);
  };
  // Evicts the latest-admitted running row: its blocks go back, it waits to be recomputed.
  auto preempt_last = [&] {
    const int64_t row = running.back();
    RowState& r = rows[row];
    const auto tokens = out_tokens[row].narrow(0, 0, r.sampled).to(torch::kCPU).contiguous();
    r.history.assign(tokens.data_ptr<int64_t>(), tokens.data_ptr<int64_t>() + r.sampled);
    cache.release(r.seq);
    r.seq = -1;
    std::vector<int64_t> keep(running.size() - 1);
    std::iota(keep.begin(), keep.end(), 0);
    keep_running(keep);
    // After rows preempted earlier, before prompts not yet started.
    auto it =
        std::find_if(waiting.begin(), waiting.end(), [](const Waiting& w) { return w.row < 0; });
    waiting.insert(it, Waiting{-1, row});
    ++timings.preempted;
  };

  // Prefills the admitted items in one forward and adds their rows to `running`.
  auto prefill = [&](const std::vector<Waiting>& items) {
    const auto clock = Clock::now();
    std::vector<std::vector<int64_t>> tokens;  // what each item's sequence holds after prefill
    for (const auto& w : items) {
      if (w.row < 0) {
        tokens.push_back(prompts[w.prompt]);
      } else {
        // Prompt and every sampled token but the last, which the next decode step feeds.
        const RowState& r = rows[w.row];
        auto t = prompts[w.row / n];
        t.insert(t.end(), r.history.begin(), r.history.end() - 1);
        timings.recomputed_tokens += static_cast<int64_t>(t.size());
        tokens.push_back(std::move(t));
      }
    }
    int64_t L = 0;
    for (const auto& t : tokens) L = std::max<int64_t>(L, static_cast<int64_t>(t.size()));
    const int64_t b = static_cast<int64_t>(items.size());
    auto ids = torch::full({b, L}, config_.pad_token_id, torch::kInt64);
    auto mask = torch::zeros({b, L}, torch::kInt64);
    std::vector<int64_t> seqs;
    for (int64_t i = 0; i < b; ++i) {
      const int64_t len = static_cast<int64_t>(tokens[i].size());
      ids[i].narrow(0, L - len, len).copy_(torch::tensor(tokens[i], torch::kInt64));
      mask[i].narrow(0, L - len, len).fill_(1);
      const int64_t seq = cache.create();
      TORCH_CHECK(cache.reserve(seq, len), "paged generation: admitted without blocks");
      seqs.push_back(seq);
    }
    note_peak();
    cache.plan_prefill(seqs, mask);
    auto hidden = model.forward(ids.to(device), cache);                 // [b, L, H]
    auto logits = model.logits(hidden.narrow(1, L - 1, 1)).squeeze(1);  // [b, V]
    hidden = torch::Tensor();

    // New prompts: fork the sequence to the n samples and sample each one's first token.
    std::vector<int64_t> first_rows, from;
    std::vector<int64_t> pending;  // recomputed rows' next tokens
    std::vector<int64_t> resumed;
    for (int64_t i = 0; i < b; ++i) {
      if (items[i].row >= 0) {
        const int64_t row = items[i].row;
        rows[row].seq = seqs[i];
        pending.push_back(rows[row].history.back());
        resumed.push_back(row);
        continue;
      }
      for (int64_t s = 0; s < n; ++s) {
        const int64_t row = items[i].prompt * n + s;
        rows[row].seq = s == 0 ? seqs[i] : cache.fork(seqs[i]);
        first_rows.push_back(row);
        from.push_back(i);
      }
    }
    if (!first_rows.empty()) {
      const auto row_index = torch::tensor(first_rows, torch::kInt64).to(device);
      const auto first_logits =
          logits.index_select(0, torch::tensor(from, torch::kInt64).to(device));
      const auto u = uniforms_dev.defined() ? uniforms_dev.index_select(0, row_index).select(1, 0)
                                            : torch::Tensor();
      const auto sampled = sampler.sample_uniform(first_logits, u);
      out_tokens.select(1, 0).index_copy_(0, row_index, sampled.tokens);
      out_log_probs.select(1, 0).index_copy_(0, row_index, sampled.log_probs);
      lengths.index_fill_(0, row_index, 1);
      auto alive = torch::isin(sampled.tokens, stop_ids).logical_not();
      if (R == 1) alive.fill_(false);
      for (int64_t row : first_rows) rows[row].sampled = 1;
      running.insert(running.end(), first_rows.begin(), first_rows.end());
      next = torch::cat({next, torch::where(alive, sampled.tokens, pad)});
      live = torch::cat({live, alive});
    }
    if (!resumed.empty()) {
      for (int64_t row : resumed) rows[row].history.clear();
      running.insert(running.end(), resumed.begin(), resumed.end());
      next = torch::cat({next, torch::tensor(pending, torch::kInt64).to(device)});
      live = torch::cat({live, torch::ones({static_cast<int64_t>(resumed.size())},
                                           torch::TensorOptions(torch::kBool).device(device))});
    }
    if (device.is_cuda()) torch::cuda::synchronize();
    timings.prefill_seconds += seconds_since(clock);
  };

  // Admits waiting items while sequences and blocks allow, at most micro_batch_size per
  // prefill forward.
  auto admit = [&] {
    while (!waiting.empty()) {
      std::vector<Waiting> items;
      int64_t seqs = static_cast<int64_t>(running.size()), free = cache.free_blocks();
      while (!waiting.empty() && static_cast<int64_t>(items.size()) < config_.micro_batch_size) {
        const Waiting& w = waiting.front();
        const int64_t count = w.row >= 0 ? 1 : n;
        const int64_t held =
            w.row >= 0
                ? static_cast<int64_t>(prompts[w.row / n].size() + rows[w.row].history.size() - 1)
                : static_cast<int64_t>(prompts[w.prompt].size());
        const int64_t need = cache.blocks_for(held);
        const bool alone = seqs == 0;  // nothing else runs: only the blocks themselves matter
        if (seqs + count > max_seqs || need + (alone ? 0 : watermark) > free) break;
        seqs += count;
        free -= need;
        items.push_back(w);
        waiting.pop_front();
      }
      if (items.empty()) return;
      prefill(items);
    }
  };

  auto clock = Clock::now();
  int64_t step = 0;
  admit();
  while (!running.empty() || !waiting.empty()) {
    // Rows that sampled max_new_tokens end without asking the device.
    {
      std::vector<int64_t> keep;
      for (int64_t i = 0; i < static_cast<int64_t>(running.size()); ++i) {
        if (rows[running[i]].sampled >= R)
          finish_row(running[i]);
        else
          keep.push_back(i);
      }
      keep_running(keep);
    }
    if (running.empty()) {
      admit();
      TORCH_CHECK(!running.empty() || waiting.empty(),
                  "paged generation: nothing runs and nothing can be admitted");
      continue;
    }
    // One position for every running row; short of blocks, first release rows that ended,
    // then preempt from the back (the row being served may be the one preempted).
    bool released = false;
    for (size_t i = 0; i < running.size();) {
      if (cache.reserve(rows[running[i]].seq, 1)) {
        ++i;
      } else if (!released) {
        release_finished();
        released = true;
        i = 0;  // positions moved; reservations already made stay
      } else {
        TORCH_CHECK(running.size() > 1, "paged generation: one sequence exceeds the pool");
        preempt_last();
      }
    }
    if (running.empty()) continue;
    note_peak();

    const int64_t C = static_cast<int64_t>(running.size());
    std::vector<int64_t> seqs(C), t(C);
    for (int64_t i = 0; i < C; ++i) {
      seqs[i] = rows[running[i]].seq;
      t[i] = rows[running[i]].sampled;
    }
    torch::Tensor row_index, t_index, logits;
    if (decoder) {
      // The rows and their token counts travel with the step's inputs, in one copy.
      std::vector<int64_t> extra(running);
      extra.insert(extra.end(), t.begin(), t.end());
      torch::Tensor index;
      logits = decoder->step(seqs, next, extra, &index);  // [C, V]
      row_index = index.narrow(0, 0, C);
      t_index = index.narrow(0, C, C);
    } else {
      row_index = torch::tensor(running, torch::kInt64).to(device);
      t_index = torch::tensor(t, torch::kInt64).to(device);
      cache.plan_decode(seqs);
      logits = model.logits(model.forward(next.view({C, 1}), cache)).squeeze(1);  // [C, V]
    }
    ++timings.decode_steps;
    const auto u =
        uniforms_dev.defined() ? uniforms_dev.index({row_index, t_index}) : torch::Tensor();
    const auto sampled = sampler.sample_uniform(logits, u);
    out_tokens.index_put_({row_index, t_index}, torch::where(live, sampled.tokens, pad));
    out_log_probs.index_put_(
        {row_index, t_index},
        torch::where(live, sampled.log_probs, torch::zeros_like(sampled.log_probs)));
    lengths.index_put_({row_index},
                       torch::where(live, t_index + 1, lengths.index_select(0, row_index)));
    live_tokens += live.sum();
    live = live & torch::isin(sampled.tokens, stop_ids).logical_not() & (t_index + 1 < R);
    next = torch::where(live, sampled.tokens, pad);
    for (int64_t row : running) ++rows[row].sampled;

    if (++step % check_every == 0) {
      release_finished();
      admit();
    }
  }
  if (device.is_cuda()) torch::cuda::synchronize();
  timings.decode_seconds = seconds_since(clock) - timings.prefill_seconds;
  timings.decode_tokens = live_tokens.item<int64_t>();
  if (decoder && device.is_cuda()) {
    timings.cuda_graphs = decoder->graphs();
    timings.graph_capture_seconds = decoder->capture_seconds();
  }

  auto result = assemble_output(prompt_ids, prompt_mask, n, out_tokens, out_log_probs, lengths);
  result.timings = timings;
  return result;
}

}  // namespace rlhf::rollout
