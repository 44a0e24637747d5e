// Rollout benchmark: decode tokens/s of the 100m preset (BF16) at several batch sizes and
// prompt lengths, beside the memory-bandwidth bound (bytes a decode step must read: weights +
// KV cache, over the memcpy bandwidth measured here) and the compute bound (2 x parameters
// FLOP per token over a measured BF16 matmul rate).
// Then decode tokens/s of one batch of 32 prompts under a KV budget (rollout.kv_cache_memory_gb)
// of the whole pool, a half and a quarter (sequences preempted and recomputed), and responses
// of varied lengths with continuous batching (bench_varied). Every figure is the one engine's:
// the paged KV cache in blocks of 16 (rollout.kv_block_size's default; the contiguous engine
// it was compared with until issue 40 is gone).
// The actor -> rollout weight sync of the same model is bench_sync's: bench_sync --model 100m.
// Usage: bench_rollout [--threads N] [--new-tokens R] [--quick] [--varied-only]
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "bench/flags.h"
#include "core/timing.h"
#include "models/causal_lm.h"
#include "models/config.h"
#include "rollout/generator.h"

using namespace rlhf;
using Clock = std::chrono::steady_clock;

namespace {

// Best of 5 copies of a 256 MiB buffer: bytes read + written per second.
double memcpy_bandwidth() {
  const size_t bytes = size_t{256} << 20;
  std::vector<char> a(bytes, 1), b(bytes, 2);
  double best = 1e30;
  for (int i = 0; i < 5; ++i) {
    auto t = Clock::now();
    std::memcpy(b.data(), a.data(), bytes);
    best = std::min(best, seconds_since(t));
    a[static_cast<size_t>(i)] =
        b[bytes - 1 - static_cast<size_t>(i)];  // keep the copies observable
  }
  return 2.0 * static_cast<double>(bytes) / best;
}

// Best of 5 BF16 matmuls of a decode-step shape ([64, 768] x [768, 2048], the 100m MLP at
// batch 64): FLOP/s, for the compute bound.
double bf16_matmul_flops() {
  auto a = torch::randn({64, 768}).to(torch::kBFloat16),
       b = torch::randn({768, 2048}).to(torch::kBFloat16);
  torch::matmul(a, b);
  double best = 1e30;
  for (int i = 0; i < 5; ++i) {
    auto t = Clock::now();
    for (int r = 0; r < 20; ++r) torch::matmul(a, b);
    best = std::min(best, seconds_since(t) / 20);
  }
  return 2.0 * 64 * 768 * 2048 / best;
}

std::shared_ptr<models::CausalLM> model_100m(uint64_t seed) {
  auto model = std::make_shared<models::CausalLM>(models::preset_config("100m"));
  model->init_weights(seed);
  model->to(torch::kBFloat16);
  return model;
}

rollout::GenerationTimings run_generate(const std::shared_ptr<models::CausalLM>& model,
                                        int64_t batch, int64_t prompt, int64_t new_tokens,
                                        int64_t kv_cache_bytes = 0) {
  rollout::GenerationConfig config;
  config.max_new_tokens = new_tokens;
  config.micro_batch_size = batch;  // the whole batch decodes at once (within the budget)
  config.kv_cache_bytes = kv_cache_bytes;
  rollout::Generator generator(model, config);
  auto ids = torch::randint(300, 32000, {batch, prompt}, torch::kInt64);
  auto mask = torch::ones_like(ids);
  rollout::SamplingParams params;  // temperature 1: the sampler's cost is included
  auto out = generator.generate(ids, mask, params);
  if (out.action_mask.size(1) != new_tokens) throw std::runtime_error("unexpected early stop");
  return out.timings;
}

void bench_decode(double bandwidth, double flops, int64_t new_tokens, bool quick) {
  auto model = model_100m(0);
  const auto& c = model->config();
  const double weight_bytes = static_cast<double>(c.num_parameters()) * 2.0;
  // K and V of one position in every layer, BF16.
  const double kv_bytes_per_position =
      2.0 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * 2.0;
  std::cout << "model 100m: " << c.num_parameters() / 1e6 << " M parameters, " << weight_bytes / 1e6
            << " MB BF16 weights; " << new_tokens << " new tokens, no stop token\n\n";
  std::cout << std::setw(6) << "batch" << std::setw(8) << "prompt" << std::setw(12) << "prefill_s"
            << std::setw(12) << "decode_s" << std::setw(10) << "ms/step" << std::setw(14)
            << "decode_tok/s" << std::setw(14) << "bw_bound" << std::setw(9) << "ratio"
            << std::setw(12) << "flop_bound" << std::setw(9) << "ratio" << '\n';
  const double flop_bound =
      flops / (2.0 * static_cast<double>(c.num_parameters()));  // tokens/s, matmuls only
  std::vector<int64_t> batches =
      quick ? std::vector<int64_t>{1, 8} : std::vector<int64_t>{1, 8, 32, 64};
  for (int64_t prompt : {int64_t{32}, int64_t{256}}) {
    for (int64_t batch : batches) {
      run_generate(model, batch, std::min<int64_t>(prompt, 8),
                   2);  // warm-up (allocations, oneDNN kernels)
      const auto t = run_generate(model, batch, prompt, new_tokens);
      const double tok_s = static_cast<double>(t.decode_tokens) / t.decode_seconds;
      // Each decode step reads every weight once and the batch's KV cache (average length).
      const double avg_len = static_cast<double>(prompt) + static_cast<double>(new_tokens) / 2.0;
      const double step_bytes =
          weight_bytes + static_cast<double>(batch) * avg_len * kv_bytes_per_position;
      const double bound = static_cast<double>(batch) * bandwidth / step_bytes;
      std::cout << std::setw(6) << batch << std::setw(8) << prompt << std::fixed
                << std::setprecision(3) << std::setw(12) << t.prefill_seconds << std::setw(12)
                << t.decode_seconds << std::setprecision(1) << std::setw(10)
                << 1e3 * t.decode_seconds / static_cast<double>(t.decode_steps) << std::setw(14)
                << tok_s << std::setw(14) << bound << std::setprecision(3) << std::setw(9)
                << tok_s / bound << std::setprecision(1) << std::setw(12) << flop_bound
                << std::setprecision(3) << std::setw(9) << tok_s / flop_bound << '\n';
      std::cout.unsetf(std::ios::fixed);
    }
  }
}

}  // namespace

// Decode tokens/s of 32 prompts of 256 tokens (1 sample each) with the KV pool bounded to
// the whole batch's blocks, a half and a quarter (sequences beyond it are preempted and
// recomputed): the limit is the unbounded figure.
void bench_kv_budget(int64_t new_tokens) {
  auto model = model_100m(0);
  const auto& c = model->config();
  const int64_t batch = 32, prompt = 256, block = 16;
  const int64_t per_prompt = 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim *
                             ((prompt + new_tokens + block - 1) / block) * block * 2;  // BF16
  std::cout << "\nKV budget: " << batch << " prompts of " << prompt << " tokens, " << new_tokens
            << " new tokens\n"
            << std::setw(12) << "budget_MB" << std::setw(10) << "prompts" << std::setw(14)
            << "decode_tok/s" << std::setw(14) << "vs unbounded" << std::setw(11) << "preempted"
            << '\n';
  double unbounded = 0;
  for (int64_t share : {1, 2, 4}) {
    const int64_t budget = share == 1 ? 0 : per_prompt * batch / share;
    run_generate(model, batch, 8, 2, 0);  // warm-up
    const auto t = run_generate(model, batch, prompt, new_tokens, budget);
    const double tok_s = static_cast<double>(t.decode_tokens) / t.decode_seconds;
    if (share == 1) unbounded = tok_s;
    std::cout << std::fixed << std::setprecision(1) << std::setw(12)
              << static_cast<double>(per_prompt * batch / share) / 1e6 << std::setw(10)
              << batch / share << std::setw(14) << tok_s << std::setprecision(3) << std::setw(14)
              << tok_s / unbounded << std::setw(11) << t.preempted << '\n';
  }
}

// Responses of varied lengths (a stop set of 1/32 of the vocabulary: lengths roughly
// geometric, mean ~32, cut at R), 16 sequences decoding at once, rows replaced as they
// finish (continuous batching); then the same under a KV budget of a quarter of the
// unbounded pool (limit: the unbounded figure). Throughput = response tokens / (prefill +
// decode seconds); outputs are identical.
void bench_varied(int64_t new_tokens, bool quick) {
  auto model = model_100m(0);
  std::cout << "\nvaried lengths, paged KV cache (blocks of 16), 100m BF16\n";
  std::cout << std::setw(34) << "workload" << std::setw(12) << "tok/s" << std::setw(14)
            << "vs unbounded" << std::setw(13) << "preempted" << '\n';
  run_generate(model, 8, 8, 2);  // warm-up
  const int64_t prompts = quick ? 32 : 64, R = 4 * new_tokens, P = 64;
  std::vector<int64_t> stops;
  for (int64_t id = 300; id < 32000; id += 32) stops.push_back(id);
  auto ids = torch::randint(300, 32000, {prompts, P}, torch::kInt64);
  auto mask = torch::ones_like(ids);
  rollout::SamplingParams params;
  params.seed = 3;
  auto throughput = [&](int64_t budget, int64_t* preempted) {
    rollout::GenerationConfig config;
    config.max_new_tokens = R;
    config.micro_batch_size = 16;
    config.stop_token_ids = stops;
    config.kv_cache_bytes = budget;
    rollout::Generator generator(model, config);
    const auto out = generator.generate(ids, mask, params);
    *preempted = out.timings.preempted;
    const double tokens = static_cast<double>(out.response_lengths.sum().item<int64_t>());
    return tokens / (out.timings.prefill_seconds + out.timings.decode_seconds);
  };
  auto row = [](const std::string& what, double tok_s, double unbounded, int64_t preempted) {
    std::cout << std::setw(34) << what << std::fixed << std::setprecision(1) << std::setw(12)
              << tok_s << std::setprecision(3) << std::setw(14) << tok_s / unbounded
              << std::setw(13) << preempted << '\n';
    std::cout.unsetf(std::ios::fixed);
  };
  int64_t preempted = 0;
  const double unbounded = throughput(0, &preempted);
  row("16 at once", unbounded, unbounded, preempted);
  const auto& mc = model->config();
  const int64_t block = 16;
  const int64_t full = 2 * mc.num_hidden_layers * mc.num_key_value_heads * mc.head_dim *
                       ((P + R + block - 1) / block) * block * 2 * 16;  // 16 sequences, BF16
  row("same, KV budget 1/4", throughput(full / 4, &preempted), unbounded, preempted);
}

int main(int argc, char** argv) {
  try {
    bench::Flags flags(argc, argv,
                       "usage: bench_rollout [--threads N] [--new-tokens R] [--quick] "
                       "[--varied-only]",
                       {"--quick", "--varied-only"});
    const int threads = static_cast<int>(flags.integer("--threads", 1));
    const int64_t new_tokens = flags.integer("--new-tokens", 32);
    const bool quick = flags.on("--quick"), varied_only = flags.on("--varied-only");
    flags.check_all_known();
    torch::set_num_threads(threads);
    std::ifstream cpuinfo("/proc/cpuinfo");
    const std::string info((std::istreambuf_iterator<char>(cpuinfo)), {});
    std::cout << "threads " << at::get_num_threads() << "; CPU has amx_bf16: "
              << (info.find("amx_bf16") != std::string::npos ? "yes" : "no")
              << ", avx512_bf16: " << (info.find("avx512_bf16") != std::string::npos ? "yes" : "no")
              << '\n';
    const double bw = memcpy_bandwidth();
    std::cout << "memcpy bandwidth (read + write, 1 thread, 256 MiB): " << bw / 1e9 << " GB/s\n";
    const double flops = bf16_matmul_flops();
    std::cout << "BF16 matmul [64, 768] x [768, 2048], 1 thread: " << flops / 1e9 << " GFLOP/s\n";
    if (!varied_only) {
      bench_decode(bw, flops, new_tokens, quick);
      bench_kv_budget(new_tokens);
    }
    bench_varied(new_tokens, quick);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "bench_rollout: " << e.what() << '\n';
    return 1;
  }
}
