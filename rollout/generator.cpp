// Generator: prefill, copy the prompt's cache to its samples, decode with compaction of
// finished rows. See generator.h.
#include "rollout/generator.h"

#include <ATen/ATen.h>
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <numeric>
#include <string>

#include "core/errors.h"
#include "core/timing.h"
#include "kernels/kernels.h"
#include "models/kv_cache.h"
#include "rollout/paged_engine.h"

namespace rlhf::rollout {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

Generator::Generator(std::shared_ptr<models::CausalLM> model, GenerationConfig config)
    : model_(std::move(model)), config_(std::move(config)) {
  TORCH_CHECK(model_ != nullptr, "Generator: no model");
  config_.validate();
  if (model_->config().head != models::HeadKind::kLanguageModel)
    throw InputError("Generator: the model has a value head; generation needs an LM head");
  const int64_t V = model_->config().vocab_size;
  for (int64_t id : config_.stop_token_ids) {
    if (id < 0 || id >= V)
      throw InputError("generation: stop token id " + std::to_string(id) +
                       " outside the vocabulary [0, " + std::to_string(V) + ")");
  }
  model_->eval();
}

Generator::~Generator() = default;
Generator::Generator(Generator&&) noexcept = default;
Generator& Generator::operator=(Generator&&) noexcept = default;

GenerationOutput Generator::generate(const torch::Tensor& prompt_ids,
                                     const torch::Tensor& prompt_mask, const SamplingParams& params,
                                     int64_t first_prompt, TurnHandler* turns, int64_t max_turns) {
  TORCH_CHECK(prompt_ids.dim() == 2 && prompt_ids.scalar_type() == torch::kInt64 &&
                  prompt_ids.size(0) > 0 && prompt_ids.size(1) > 0,
              "generate: prompt_ids must be int64 [B, P] with B, P > 0, got ",
              prompt_ids.scalar_type(), prompt_ids.sizes());
  TORCH_CHECK(prompt_mask.sizes() == prompt_ids.sizes(),
              "generate: prompt_mask must be [B, P] like prompt_ids, got ", prompt_mask.sizes());
  params.validate();
  kernels::EnableInScope use_kernels(config_.gpu_kernels);  // the model's forwards, this call
  const auto mask = prompt_mask.to(torch::kCPU, torch::kInt64);
  if ((mask.sum(1) == 0).any().item<bool>())
    throw InputError("generate: a prompt row has no tokens (all padding)");
  const int64_t V = model_->config().vocab_size;
  const auto ids = prompt_ids.to(torch::kCPU);
  if (ids.min().item<int64_t>() < 0 || ids.max().item<int64_t>() >= V)
    throw InputError("generate: prompt token ids outside the vocabulary [0, " + std::to_string(V) +
                     ")");

  const int64_t B = ids.size(0), n = config_.n_samples_per_prompt;
  TORCH_CHECK(first_prompt >= 0, "generate: first_prompt must be >= 0, got ", first_prompt);
  Sampler sampler(params, B * n, first_prompt * n);
  if (turns && config_.kv_block_size <= 0)
    throw InputError(
        "multi-turn rollouts (rollout.max_turns, env.*) need the paged engine: "
        "rollout.kv_block_size > 0");
  if (max_turns < 1)
    throw InputError("rollout.max_turns must be >= 1, got " + std::to_string(max_turns));
  if (config_.kv_block_size > 0) {
    auto out = generate_paged(ids, mask, sampler, first_prompt * n, turns, max_turns);
    out.weight_version = weight_version_;
    return out;
  }
  const int64_t mb = prompts_per_cache(ids.size(1));
  std::vector<GenerationOutput> parts;
  int64_t longest = 0;
  for (int64_t begin = 0; begin < B; begin += mb) {
    const int64_t b = std::min(mb, B - begin);
    parts.push_back(generate_micro_batch(ids.narrow(0, begin, b), mask.narrow(0, begin, b), sampler,
                                         (first_prompt + begin) * n));
    longest = std::max(longest, parts.back().action_mask.size(1));
  }
  auto out = parts.size() == 1 ? std::move(parts[0])
                               : concat_outputs(parts, longest, config_.pad_token_id);
  out.weight_version = weight_version_;
  return out;
}

void Generator::set_samples_per_prompt(int64_t n) {
  if (n < 1)
    throw InputError("generate: n_samples_per_prompt must be >= 1, got " + std::to_string(n));
  if (config_.max_num_seqs > 0 && n > config_.max_num_seqs)
    throw InputError("generate: n_samples_per_prompt " + std::to_string(n) +
                     " exceeds rollout.max_num_seqs " + std::to_string(config_.max_num_seqs));
  config_.n_samples_per_prompt = n;
}

int64_t Generator::prompts_per_cache(int64_t P) const {
  if (config_.kv_cache_bytes <= 0) return config_.micro_batch_size;
  const auto& c = model_->shard_config();  // a TP rank caches its kv heads only
  const int64_t element = c10::elementSize(model_->dtype());
  // K and V per layer for P + R positions (models::KvCache), for the prefilled row and its
  // n sample rows, which live together while the samples are copied.
  const int64_t per_prompt = 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim *
                             (P + config_.max_new_tokens) * element *
                             (config_.n_samples_per_prompt + 1);
  const int64_t fit = config_.kv_cache_bytes / per_prompt;
  if (fit < 1) {
    const double gib = static_cast<double>(per_prompt) / (1ll << 30);
    throw InputError("rollout.kv_cache_memory_gb (" +
                     std::to_string(static_cast<double>(config_.kv_cache_bytes) / (1ll << 30)) +
                     " GiB) holds less than one prompt: a prompt of " + std::to_string(P) +
                     " tokens with " + std::to_string(config_.n_samples_per_prompt) +
                     " samples of up to " + std::to_string(config_.max_new_tokens) +
                     " tokens needs " + std::to_string(gib) + " GiB");
  }
  return std::min(config_.micro_batch_size, fit);
}

Generator::DecodeState Generator::decode_state(Sampler& sampler, int64_t first_row, int64_t N,
                                               torch::Device device) const {
  const int64_t R = config_.max_new_tokens;
  const auto i64 = torch::TensorOptions(torch::kInt64).device(device);
  const auto uniforms = sampler.draws(first_row, N, R);
  DecodeState d;
  if (uniforms.defined()) d.uniforms = uniforms.to(device);
  d.stop_ids = torch::tensor(config_.stop_token_ids, torch::kInt64).to(device);
  d.tokens = torch::full({N, R}, config_.pad_token_id, i64);
  d.log_probs = torch::zeros({N, R}, torch::TensorOptions(torch::kFloat32).device(device));
  d.lengths = torch::zeros({N}, i64);
  d.pad = torch::full({}, config_.pad_token_id, i64);
  return d;
}

GenerationOutput Generator::generate_micro_batch(const torch::Tensor& prompt_ids,
                                                 const torch::Tensor& prompt_mask, Sampler& sampler,
                                                 int64_t first_row) {
  torch::NoGradGuard no_grad;
  models::CausalLM& model = *model_;
  const auto device = model.device();
  const int64_t b = prompt_ids.size(0), P = prompt_ids.size(1), n = config_.n_samples_per_prompt;
  const int64_t N = b * n, R = config_.max_new_tokens;
  // How often the host reads the live-row count (to stop, and to compact): every step on
  // the CPU, where reading costs nothing; every few steps on a GPU, so the host queues
  // decode steps ahead of the device instead of waiting for each token.
  const int64_t check_every =
      config_.sync_interval > 0 ? config_.sync_interval : (device.is_cpu() ? 1 : 8);

  // Prefill each prompt once, then copy its cache rows to its n samples.
  GenerationTimings timings;
  auto clock = Clock::now();
  models::KvCache cache(model.shard_config(), b, P + R, model.dtype(), device);
  const auto mask_dev = prompt_mask.to(device);
  auto hidden = model.forward(prompt_ids.to(device), mask_dev, {}, &cache);  // [b, P, H]
  auto logits = model.logits(hidden.narrow(1, P - 1, 1)).squeeze(1);         // [b, V]
  hidden = torch::Tensor();
  const auto expand = torch::arange(b, torch::kInt64).repeat_interleave(n);  // [N]
  const auto expand_dev = expand.to(device);
  if (n > 1) {
    cache.select_rows(expand);
    logits = logits.index_select(0, expand_dev);
  }
  // Without left padding every key of every decode step is a plain token: the forward then
  // needs no mask (and no check of one).
  const bool padded = (prompt_mask == 0).any().item<bool>();
  auto attention = torch::Tensor();
  if (padded) {
    attention = torch::zeros({N, P + R}, torch::TensorOptions(torch::kInt64).device(device));
    attention.narrow(1, 0, P).copy_(mask_dev.index_select(0, expand_dev));
  }
  const auto prompt_len = prompt_mask.sum(1).index_select(0, expand).to(device);  // [N]
  if (device.is_cuda()) torch::cuda::synchronize();  // the prefill's kernels, in its time
  timings.prefill_seconds = seconds_since(clock);
  clock = Clock::now();

  // Everything the loop touches lives on the device. Cache row c holds micro-batch row
  // rows[c]; live[c] says it is still generating. Sample s of a row draws column t of its
  // uniforms for its t-th token: the same draws the row's stream gives one token at a time.
  const auto i64 = torch::TensorOptions(torch::kInt64).device(device);
  DecodeState d = decode_state(sampler, first_row, N, device);
  const auto& uniforms_dev = d.uniforms;
  const auto& stop_ids = d.stop_ids;
  const auto& pad = d.pad;
  auto& out_tokens = d.tokens;
  auto& out_log_probs = d.log_probs;
  auto& lengths = d.lengths;
  auto rows = torch::arange(N, i64);
  auto live = torch::ones({N}, torch::TensorOptions(torch::kBool).device(device));
  auto live_tokens = torch::zeros({}, i64);  // decode-step tokens sampled for live rows
  int64_t n_live = N;
  for (int64_t t = 0; t < R; ++t) {
    // Every row in the batch is sampled; a finished row's token and log-prob are dropped.
    const auto u =
        uniforms_dev.defined() ? uniforms_dev.index_select(0, rows).select(1, t) : torch::Tensor();
    const auto sampled = sampler.sample_uniform(logits, u);
    const auto tokens = torch::where(live, sampled.tokens, pad);
    out_tokens.select(1, t).index_copy_(0, rows, tokens);
    out_log_probs.select(1, t).index_copy_(
        0, rows, torch::where(live, sampled.log_probs, torch::zeros_like(sampled.log_probs)));
    lengths.index_copy_(
        0, rows, torch::where(live, torch::full_like(rows, t + 1), lengths.index_select(0, rows)));
    if (t > 0) live_tokens += live.sum();
    live = live & torch::isin(sampled.tokens, stop_ids).logical_not();
    if (t == R - 1) break;

    auto next = torch::where(live, sampled.tokens, pad);
    if ((t + 1) % check_every == 0) {
      n_live = live.sum().item<int64_t>();  // the loop's only wait for the device
      if (n_live == 0) break;
      const int64_t C = rows.size(0);
      if (C - n_live > 0 &&
          static_cast<double>(C - n_live) > config_.compact_fraction * static_cast<double>(C)) {
        const auto keep = live.nonzero().squeeze(1);
        cache.select_rows(keep);
        if (attention.defined()) attention = attention.index_select(0, keep);
        rows = rows.index_select(0, keep);
        next = next.index_select(0, keep);
        live = torch::ones({n_live}, torch::TensorOptions(torch::kBool).device(device));
      }
    }
    // Decode one position: the token just sampled (pad for finished rows still in the
    // batch) at position prompt_len + t.
    const int64_t C = rows.size(0);
    torch::Tensor step_mask;
    if (attention.defined()) {
      attention.select(1, P + t).fill_(1);
      step_mask = attention.narrow(1, 0, P + t + 1);
    }
    const auto positions = prompt_len.index_select(0, rows) + t;
    hidden = model.forward(next.view({C, 1}), step_mask, positions.view({C, 1}), &cache);
    logits = model.logits(hidden).squeeze(1);  // [C, V]
    ++timings.decode_steps;
  }
  timings.decode_tokens = live_tokens.item<int64_t>();
  timings.decode_seconds = seconds_since(clock);
  timings.kv_pool_bytes = timings.kv_peak_bytes =
      models::KvCache::bytes(model.shard_config(), b + (n > 1 ? N : 0), P + R, model.dtype());
  auto result = assemble_output(prompt_ids, prompt_mask, n, out_tokens, out_log_probs, lengths);
  result.timings = timings;
  return result;
}

GenerationOutput assemble_output(const torch::Tensor& prompt_ids, const torch::Tensor& prompt_mask,
                                 int64_t n, const torch::Tensor& tokens,
                                 const torch::Tensor& log_probs, const torch::Tensor& lengths) {
  // The longest response: decode steps after every row finished left only padding.
  const auto lengths_cpu = lengths.to(torch::kCPU);
  const int64_t steps = lengths_cpu.max().item<int64_t>();
  const auto expand = torch::arange(prompt_ids.size(0), torch::kInt64).repeat_interleave(n);
  GenerationOutput result;
  result.action_mask =
      torch::arange(steps, torch::kInt64).unsqueeze(0) < lengths_cpu.unsqueeze(1);  // [N, R]
  result.sequences = torch::cat(
      {prompt_ids.index_select(0, expand), tokens.narrow(1, 0, steps).to(torch::kCPU)}, 1);
  result.attention_mask =
      torch::cat({prompt_mask.index_select(0, expand), result.action_mask.to(torch::kInt64)}, 1);
  result.log_probs = log_probs.narrow(1, 0, steps).to(torch::kCPU).contiguous();
  result.response_lengths = lengths_cpu;
  result.prompt_length = prompt_ids.size(1);
  return result;
}

GenerationOutput concat_outputs(const std::vector<GenerationOutput>& parts, int64_t response_length,
                                int64_t pad_token_id) {
  TORCH_CHECK(!parts.empty(), "concat_outputs: no parts");
  std::vector<torch::Tensor> sequences, attention, actions, log_probs, lengths;
  const int64_t P = parts[0].prompt_length;
  for (const auto& part : parts) {
    const int64_t R = part.action_mask.size(1);
    TORCH_CHECK(part.prompt_length == P && R <= response_length,
                "concat_outputs: parts disagree (prompt length ", part.prompt_length, " vs ", P,
                ", response ", R, " vs ", response_length, ")");
    const int64_t pad = response_length - R;
    sequences.push_back(
        at::constant_pad_nd(part.sequences, {0, pad}, static_cast<double>(pad_token_id)));
    attention.push_back(at::constant_pad_nd(part.attention_mask, {0, pad}, 0));
    actions.push_back(
        at::constant_pad_nd(part.action_mask.to(torch::kInt64), {0, pad}, 0).to(torch::kBool));
    log_probs.push_back(at::constant_pad_nd(part.log_probs, {0, pad}, 0));
    lengths.push_back(part.response_lengths);
  }
  GenerationOutput out;
  out.sequences = torch::cat(sequences, 0);
  out.attention_mask = torch::cat(attention, 0);
  out.action_mask = torch::cat(actions, 0);
  out.log_probs = torch::cat(log_probs, 0);
  out.response_lengths = torch::cat(lengths, 0);
  out.prompt_length = P;
  out.weight_version = parts[0].weight_version;
  for (const auto& part : parts) {
    out.timings.prefill_seconds += part.timings.prefill_seconds;
    out.timings.decode_seconds += part.timings.decode_seconds;
    out.timings.decode_steps += part.timings.decode_steps;
    out.timings.decode_tokens += part.timings.decode_tokens;
    out.timings.kv_pool_bytes = std::max(out.timings.kv_pool_bytes, part.timings.kv_pool_bytes);
    out.timings.kv_peak_bytes = std::max(out.timings.kv_peak_bytes, part.timings.kv_peak_bytes);
  }
  if (parts[0].turns.defined()) {
    std::vector<torch::Tensor> turns;
    for (const auto& part : parts) turns.push_back(part.turns);
    out.turns = torch::cat(turns);
  }
  return out;
}

}  // namespace rlhf::rollout
