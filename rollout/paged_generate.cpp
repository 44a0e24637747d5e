// Generator::generate_paged (generator.h): sizes the request's paged KV pool (kept between
// calls with CUDA graphs, paged_engine.h), opens multi-turn rows, runs a PagedBatcher
// (paged_generation.h: the schedule) over every row and assembles the output, with the
// routes it recorded for routing replay (route_log.h).
#include <ATen/ATen.h>
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <numeric>
#include <string>
#include <utility>

#include "core/errors.h"
#include "core/timing.h"
#include "models/paged_kv_cache.h"
#include "rollout/decode_graph.h"
#include "rollout/generator.h"
#include "rollout/paged_engine.h"
#include "rollout/paged_generation.h"
#include "rollout/route_log.h"

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

// The batcher's timings with the call's: its run took `seconds` (prefill included), the
// environments' resets `reset_wait` before it, its pool held `pool_bytes`.
GenerationTimings call_timings(const PagedBatcher& batcher, double seconds, double reset_wait,
                               int64_t pool_bytes) {
  GenerationTimings timings = batcher.timings();
  timings.env_stall_seconds += reset_wait;  // nothing ran until the resets answered
  timings.kv_pool_bytes = pool_bytes;
  timings.decode_seconds = seconds - timings.prefill_seconds;
  timings.decode_tokens = batcher.decode_tokens().item<int64_t>();
  return timings;
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
  const std::unique_ptr<RouteLog> routes = log_routes(
      record_routes_, model, batcher, decoder != nullptr, N, opened.prompt_ids.size(1) + R);
  hook(batcher, opened.prompt_ids, opened.prompt_mask, d, turns == nullptr, routes.get());
  auto clock = Clock::now();
  batcher.run(check_every);
  if (device.is_cuda()) torch::cuda::synchronize();
  GenerationTimings timings =
      call_timings(batcher, seconds_since(clock), opened.wait_seconds, num_blocks * per_block);
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
  if (routes) result.routes = routes->columns(opened.prompt_mask, n, result.attention_mask);
  return result;
}

}  // namespace rlhf::rollout
