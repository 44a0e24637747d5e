// Generator: checks a request and runs it through the paged engine (paged_generation.cpp);
// the output's assembly. See generator.h.
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
#include "rollout/paged_engine.h"
#include "rollout/paged_generation.h"
#include "rollout/route_log.h"

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
  if (max_turns < 1)
    throw InputError("rollout.max_turns must be >= 1, got " + std::to_string(max_turns));
  const int64_t started_with = weight_version_;
  auto out = generate_paged(ids, mask, sampler, first_prompt * n, turns, max_turns);
  // The newest weights that sampled a token (an update after the last one changes none).
  out.weight_version = newest_version(out, started_with);
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

void Generator::hook(PagedBatcher& batcher, const torch::Tensor& prompt_ids,
                     const torch::Tensor& prompt_mask, const DecodeState& d, bool single_turn,
                     const RouteLog* routes) {
  batcher.set_version_poll(weight_version_, between_steps_);
  if (!on_groups_done_ || !single_turn) return;
  const int64_t n = config_.n_samples_per_prompt, R = config_.max_new_tokens;
  batcher.set_on_groups_done([this, &batcher, prompt_ids, prompt_mask, &d, n, R,
                              routes](const std::vector<int64_t>& prompts) {
    GenerationOutput part = select_groups(prompt_ids, prompt_mask, n, d, batcher.token_versions(R),
                                          prompts, weight_version_);
    if (routes) {
      std::vector<int64_t> rows;
      for (int64_t p : prompts)
        for (int64_t s = 0; s < n; ++s) rows.push_back(p * n + s);
      part.routes = routes->columns(rows, prompt_mask, n, part.attention_mask);
    }
    on_groups_done_(std::move(part), prompts);
  });
}

int64_t newest_version(const GenerationOutput& out, int64_t fallback) {
  const auto sampled = out.token_versions.masked_select(out.action_mask.to(torch::kBool));
  return sampled.numel() > 0 ? sampled.max().item<int64_t>() : fallback;
}

GenerationOutput select_groups(const torch::Tensor& prompt_ids, const torch::Tensor& prompt_mask,
                               int64_t n, const Generator::DecodeState& d,
                               const torch::Tensor& token_versions,
                               const std::vector<int64_t>& prompts, int64_t fallback) {
  std::vector<int64_t> rows;
  for (int64_t p : prompts)
    for (int64_t s = 0; s < n; ++s) rows.push_back(p * n + s);
  const auto pi = torch::tensor(prompts, torch::kInt64);
  const auto ri = torch::tensor(rows, torch::kInt64);
  const auto rd = ri.to(d.tokens.device());
  GenerationOutput part = assemble_output(
      prompt_ids.index_select(0, pi), prompt_mask.index_select(0, pi), n,
      d.tokens.index_select(0, rd), d.log_probs.index_select(0, rd), d.lengths.index_select(0, rd));
  part.token_versions =
      token_versions.index_select(0, ri).narrow(1, 0, part.action_mask.size(1)).contiguous();
  part.weight_version = newest_version(part, fallback);
  return part;
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
  std::vector<torch::Tensor> versions, routes;
  for (const auto& part : parts) {
    out.weight_version = std::max(out.weight_version, part.weight_version);
    const int64_t pad = response_length - part.action_mask.size(1);
    if (part.token_versions.defined())
      versions.push_back(at::constant_pad_nd(part.token_versions, {0, pad},
                                             static_cast<double>(part.weight_version)));
    if (part.routes.defined())  // [N, P + R, S, k]: pad columns
      routes.push_back(at::constant_pad_nd(part.routes, {0, 0, 0, 0, 0, pad}, -1));
    out.timings.prefill_seconds += part.timings.prefill_seconds;
    out.timings.decode_seconds += part.timings.decode_seconds;
    out.timings.decode_steps += part.timings.decode_steps;
    out.timings.decode_tokens += part.timings.decode_tokens;
    out.timings.kv_pool_bytes = std::max(out.timings.kv_pool_bytes, part.timings.kv_pool_bytes);
    out.timings.kv_peak_bytes = std::max(out.timings.kv_peak_bytes, part.timings.kv_peak_bytes);
  }
  // Outputs assembled by hand (tests) may carry no versions.
  if (versions.size() == parts.size()) out.token_versions = torch::cat(versions, 0);
  if (!routes.empty()) {
    TORCH_CHECK(routes.size() == parts.size(), "concat_outputs: some parts carry no routes");
    out.routes = torch::cat(routes, 0);
  }
  if (parts[0].turns.defined()) {
    std::vector<torch::Tensor> turns;
    for (const auto& part : parts) turns.push_back(part.turns);
    out.turns = torch::cat(turns);
  }
  return out;
}

}  // namespace rlhf::rollout
