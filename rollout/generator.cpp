// Generator: prefill, copy the prompt's cache to its samples, decode with compaction of
// finished rows. See generator.h.
#include "rollout/generator.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <numeric>
#include <string>

#include "core/errors.h"
#include "models/kv_cache.h"

namespace rlhf::rollout {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

torch::Tensor index_tensor(const std::vector<int64_t>& v, torch::Device device) {
  return torch::tensor(v, torch::kInt64).to(device);
}

// Output bookkeeping of one micro batch, on the CPU.
struct Responses {
  torch::Tensor tokens;          // [N, R] int64, pad where nothing was generated
  torch::Tensor log_probs;       // [N, R] FP32
  std::vector<int64_t> lengths;  // [N]
};

}  // namespace

void GenerationConfig::validate() const {
  if (max_new_tokens < 1)
    throw InputError("rollout.max_new_tokens must be >= 1, got " + std::to_string(max_new_tokens));
  if (n_samples_per_prompt < 1)
    throw InputError("rollout.n_samples_per_prompt must be >= 1, got " +
                     std::to_string(n_samples_per_prompt));
  if (micro_batch_size < 1)
    throw InputError("rollout.micro_batch_size must be >= 1, got " +
                     std::to_string(micro_batch_size));
  if (!(compact_fraction >= 0.0 && compact_fraction < 1.0))
    throw InputError("generation: compact_fraction must be in [0, 1), got " +
                     std::to_string(compact_fraction));
}

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

GenerationOutput Generator::generate(const torch::Tensor& prompt_ids,
                                     const torch::Tensor& prompt_mask, const SamplingParams& params,
                                     int64_t first_prompt) {
  TORCH_CHECK(prompt_ids.dim() == 2 && prompt_ids.scalar_type() == torch::kInt64 &&
                  prompt_ids.size(0) > 0 && prompt_ids.size(1) > 0,
              "generate: prompt_ids must be int64 [B, P] with B, P > 0, got ",
              prompt_ids.scalar_type(), prompt_ids.sizes());
  TORCH_CHECK(prompt_mask.sizes() == prompt_ids.sizes(),
              "generate: prompt_mask must be [B, P] like prompt_ids, got ", prompt_mask.sizes());
  params.validate();
  const auto mask = prompt_mask.to(torch::kCPU, torch::kInt64);
  if ((mask.sum(1) == 0).any().item<bool>())
    throw InputError("generate: a prompt row has no tokens (all padding)");
  const int64_t V = model_->config().vocab_size;
  const auto ids = prompt_ids.to(torch::kCPU);
  if (ids.min().item<int64_t>() < 0 || ids.max().item<int64_t>() >= V)
    throw InputError("generate: prompt token ids outside the vocabulary [0, " + std::to_string(V) +
                     ")");

  const int64_t B = ids.size(0), n = config_.n_samples_per_prompt, mb = config_.micro_batch_size;
  TORCH_CHECK(first_prompt >= 0, "generate: first_prompt must be >= 0, got ", first_prompt);
  Sampler sampler(params, B * n, first_prompt * n);
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

GenerationOutput Generator::generate_micro_batch(const torch::Tensor& prompt_ids,
                                                 const torch::Tensor& prompt_mask, Sampler& sampler,
                                                 int64_t first_row) {
  torch::NoGradGuard no_grad;
  models::CausalLM& model = *model_;
  const auto device = model.device();
  const int64_t b = prompt_ids.size(0), P = prompt_ids.size(1), n = config_.n_samples_per_prompt;
  const int64_t N = b * n, R = config_.max_new_tokens;
  const auto& stops = config_.stop_token_ids;

  // Prefill each prompt once, then copy its cache rows to its n samples.
  GenerationTimings timings;
  auto clock = Clock::now();
  models::KvCache cache(model.config(), b, P + R, model.dtype(), device);
  const auto mask_dev = prompt_mask.to(device);
  auto hidden = model.forward(prompt_ids.to(device), mask_dev, {}, &cache);  // [b, P, H]
  auto logits = model.logits(hidden.narrow(1, P - 1, 1)).squeeze(1);         // [b, V]
  hidden = torch::Tensor();
  const auto expand = torch::arange(b, torch::kInt64).repeat_interleave(n);  // [N]
  if (n > 1) {
    cache.select_rows(expand);
    logits = logits.index_select(0, expand.to(device));
  }
  auto attention =
      torch::zeros({N, P + R}, torch::TensorOptions(torch::kInt64).device(device));  // [C, P + R]
  attention.narrow(1, 0, P).copy_(mask_dev.index_select(0, expand.to(device)));
  const auto prompt_len_t = prompt_mask.sum(1).index_select(0, expand).contiguous();
  const std::vector<int64_t> prompt_len(prompt_len_t.data_ptr<int64_t>(),
                                        prompt_len_t.data_ptr<int64_t>() + N);
  timings.prefill_seconds = seconds_since(clock);
  clock = Clock::now();

  Responses out{torch::full({N, R}, config_.pad_token_id, torch::kInt64),
                torch::zeros({N, R}, torch::kFloat32), std::vector<int64_t>(N, 0)};
  auto* out_tokens = out.tokens.data_ptr<int64_t>();
  auto* out_log_probs = out.log_probs.data_ptr<float>();
  // Cache row c holds micro-batch row rows[c]; live[c] says it is still generating.
  std::vector<int64_t> rows(N);
  std::iota(rows.begin(), rows.end(), 0);
  std::vector<char> live(N, 1);
  std::vector<int64_t> last(N, config_.pad_token_id);
  int64_t n_live = N, steps = 0;
  for (int64_t t = 0; t < R; ++t) {
    std::vector<int64_t> local, request_rows;
    for (size_t c = 0; c < rows.size(); ++c) {
      if (!live[c]) continue;
      local.push_back(static_cast<int64_t>(c));
      request_rows.push_back(first_row + rows[c]);
    }
    // Finished rows are not sampled: only the live rows' logits reach the sampler.
    auto to_sample =
        local.size() == rows.size() ? logits : logits.index_select(0, index_tensor(local, device));
    auto sampled = sampler.sample(to_sample, request_rows);
    if (t > 0) timings.decode_tokens += static_cast<int64_t>(local.size());
    const auto tokens = sampled.tokens.to(torch::kCPU).contiguous();
    const auto log_probs = sampled.log_probs.to(torch::kCPU).contiguous();
    for (size_t j = 0; j < local.size(); ++j) {
      const auto c = static_cast<size_t>(local[j]);
      const int64_t row = rows[c], token = tokens.data_ptr<int64_t>()[j];
      out_tokens[row * R + t] = token;
      out_log_probs[row * R + t] = log_probs.data_ptr<float>()[j];
      out.lengths[static_cast<size_t>(row)] = t + 1;
      last[c] = token;
      if (std::find(stops.begin(), stops.end(), token) != stops.end()) {
        live[c] = 0;
        --n_live;
      }
    }
    steps = t + 1;
    if (n_live == 0 || t == R - 1) break;

    const auto C = static_cast<int64_t>(rows.size());
    if (C - n_live > 0 &&
        static_cast<double>(C - n_live) > config_.compact_fraction * static_cast<double>(C)) {
      std::vector<int64_t> keep;
      for (int64_t c = 0; c < C; ++c) {
        if (live[static_cast<size_t>(c)]) keep.push_back(c);
      }
      const auto keep_t = index_tensor(keep, device);
      cache.select_rows(keep_t);
      attention = attention.index_select(0, keep_t);
      std::vector<int64_t> kept_rows, kept_last;
      for (int64_t c : keep) {
        kept_rows.push_back(rows[static_cast<size_t>(c)]);
        kept_last.push_back(last[static_cast<size_t>(c)]);
      }
      rows = std::move(kept_rows);
      last = std::move(kept_last);
      live.assign(rows.size(), 1);
    }
    // Decode one position: the token just sampled (pad for finished rows still in the
    // batch) at position prompt_len + t.
    std::vector<int64_t> next(rows.size()), positions(rows.size());
    for (size_t c = 0; c < rows.size(); ++c) {
      next[c] = live[c] ? last[c] : config_.pad_token_id;
      positions[c] = prompt_len[static_cast<size_t>(rows[c])] + t;
    }
    attention.select(1, P + t).fill_(1);
    const auto C2 = static_cast<int64_t>(rows.size());
    hidden =
        model.forward(index_tensor(next, device).view({C2, 1}), attention.narrow(1, 0, P + t + 1),
                      index_tensor(positions, device).view({C2, 1}), &cache);
    logits = model.logits(hidden).squeeze(1);  // [C, V]
    ++timings.decode_steps;
  }
  timings.decode_seconds = seconds_since(clock);

  GenerationOutput result;
  const auto lengths = torch::tensor(out.lengths, torch::kInt64);  // [N]
  result.action_mask =
      torch::arange(steps, torch::kInt64).unsqueeze(0) < lengths.unsqueeze(1);  // [N, R]
  result.sequences =
      torch::cat({prompt_ids.index_select(0, expand), out.tokens.narrow(1, 0, steps)}, 1);
  result.attention_mask =
      torch::cat({prompt_mask.index_select(0, expand), result.action_mask.to(torch::kInt64)}, 1);
  result.log_probs = out.log_probs.narrow(1, 0, steps).contiguous();
  result.response_lengths = lengths;
  result.prompt_length = P;
  result.timings = timings;
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
  }
  return out;
}

}  // namespace rlhf::rollout
