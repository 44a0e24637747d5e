// The contiguous-cache reference generator. See contiguous_reference.h.
#include "tests/rollout/contiguous_reference.h"

#include <algorithm>
#include <vector>

#include "models/kv_cache.h"

namespace rlhf::rollout::test {
namespace {

// Finished rows are compacted out when they are more than this share of the batch.
constexpr double kCompactFraction = 0.25;

struct Outputs {
  torch::Tensor tokens, log_probs, lengths;
};

// One micro batch: prompts [b, P]; rows first_row.. of the request.
GenerationOutput micro_batch(models::CausalLM& model, const GenerationConfig& config,
                             const torch::Tensor& prompt_ids, const torch::Tensor& prompt_mask,
                             Sampler& sampler, int64_t first_row) {
  torch::NoGradGuard no_grad;
  const auto device = model.device();
  const int64_t b = prompt_ids.size(0), P = prompt_ids.size(1), n = config.n_samples_per_prompt;
  const int64_t N = b * n, R = config.max_new_tokens;
  models::KvCache cache(model.shard_config(), b, P + R, model.dtype(), device);
  const auto mask_dev = prompt_mask.to(device);
  auto hidden = model.forward(prompt_ids.to(device), mask_dev, {}, &cache);  // [b, P, H]
  auto logits = model.logits(hidden.narrow(1, P - 1, 1)).squeeze(1);         // [b, V]
  const auto expand = torch::arange(b, torch::kInt64).repeat_interleave(n);  // [N]
  const auto expand_dev = expand.to(device);
  if (n > 1) {
    cache.select_rows(expand);
    logits = logits.index_select(0, expand_dev);
  }
  // Without left padding every key is a plain token: the forward then needs no mask.
  torch::Tensor attention;
  if ((prompt_mask == 0).any().item<bool>()) {
    attention = torch::zeros({N, P + R}, torch::TensorOptions(torch::kInt64).device(device));
    attention.narrow(1, 0, P).copy_(mask_dev.index_select(0, expand_dev));
  }
  const auto prompt_len = prompt_mask.sum(1).index_select(0, expand).to(device);  // [N]

  const auto i64 = torch::TensorOptions(torch::kInt64).device(device);
  const auto uniforms = sampler.draws(first_row, N, R);
  const auto uniforms_dev = uniforms.defined() ? uniforms.to(device) : torch::Tensor();
  const auto stop_ids = torch::tensor(config.stop_token_ids, torch::kInt64).to(device);
  const auto pad = torch::full({}, config.pad_token_id, i64);
  Outputs out{torch::full({N, R}, config.pad_token_id, i64),
              torch::zeros({N, R}, torch::TensorOptions(torch::kFloat32).device(device)),
              torch::zeros({N}, i64)};
  auto rows = torch::arange(N, i64);
  auto live = torch::ones({N}, torch::TensorOptions(torch::kBool).device(device));
  int64_t steps = 0, live_tokens = 0;
  for (int64_t t = 0; t < R; ++t) {
    const auto u =
        uniforms_dev.defined() ? uniforms_dev.index_select(0, rows).select(1, t) : torch::Tensor();
    const auto sampled = sampler.sample_uniform(logits, u);
    out.tokens.select(1, t).index_copy_(0, rows, torch::where(live, sampled.tokens, pad));
    out.log_probs.select(1, t).index_copy_(
        0, rows, torch::where(live, sampled.log_probs, torch::zeros_like(sampled.log_probs)));
    out.lengths.index_copy_(
        0, rows,
        torch::where(live, torch::full_like(rows, t + 1), out.lengths.index_select(0, rows)));
    if (t > 0) live_tokens += live.sum().item<int64_t>();
    live = live & torch::isin(sampled.tokens, stop_ids).logical_not();
    const int64_t n_live = live.sum().item<int64_t>();
    if (t == R - 1 || n_live == 0) break;
    auto next = torch::where(live, sampled.tokens, pad);
    const int64_t C = rows.size(0);
    if (C - n_live > 0 &&
        static_cast<double>(C - n_live) > kCompactFraction * static_cast<double>(C)) {
      const auto keep = live.nonzero().squeeze(1);
      cache.select_rows(keep);
      if (attention.defined()) attention = attention.index_select(0, keep);
      rows = rows.index_select(0, keep);
      next = next.index_select(0, keep);
      live = torch::ones({n_live}, torch::TensorOptions(torch::kBool).device(device));
    }
    torch::Tensor step_mask;
    if (attention.defined()) {
      attention.select(1, P + t).fill_(1);
      step_mask = attention.narrow(1, 0, P + t + 1);
    }
    const auto positions = prompt_len.index_select(0, rows) + t;
    hidden = model.forward(next.view({rows.size(0), 1}), step_mask,
                           positions.view({rows.size(0), 1}), &cache);
    logits = model.logits(hidden).squeeze(1);
    ++steps;
  }
  auto result = assemble_output(prompt_ids, prompt_mask, n, out.tokens, out.log_probs, out.lengths);
  result.timings.decode_steps = steps;
  result.timings.decode_tokens = live_tokens;
  result.timings.kv_pool_bytes = result.timings.kv_peak_bytes =
      models::KvCache::bytes(model.shard_config(), b + (n > 1 ? N : 0), P + R, model.dtype());
  return result;
}

}  // namespace

GenerationOutput contiguous_reference(const std::shared_ptr<models::CausalLM>& model,
                                      const GenerationConfig& config,
                                      const torch::Tensor& prompt_ids,
                                      const torch::Tensor& prompt_mask,
                                      const SamplingParams& params, int64_t first_prompt) {
  model->eval();
  const auto ids = prompt_ids.to(torch::kCPU);
  const auto mask = prompt_mask.to(torch::kCPU, torch::kInt64);
  const int64_t B = ids.size(0), n = config.n_samples_per_prompt, mb = config.micro_batch_size;
  Sampler sampler(params, B * n, first_prompt * n);
  std::vector<GenerationOutput> parts;
  int64_t longest = 0;
  for (int64_t begin = 0; begin < B; begin += mb) {
    const int64_t b = std::min(mb, B - begin);
    parts.push_back(micro_batch(*model, config, ids.narrow(0, begin, b), mask.narrow(0, begin, b),
                                sampler, (first_prompt + begin) * n));
    longest = std::max(longest, parts.back().action_mask.size(1));
  }
  return parts.size() == 1 ? std::move(parts[0])
                           : concat_outputs(parts, longest, config.pad_token_id);
}

}  // namespace rlhf::rollout::test
