// Fused projections (issue 32.2) on the CPU: prefill and KV-cached decode-step time of one
// model with q/k/v and gate/up as separate GEMMs and of the same weights fused
// (CausalLM::fuse_projections), in FP32 (this CPU emulates BF16), interleaved round by round
// so both see the same machine load; the best round (least disturbed by other processes)
// and the median, with the fused / unfused ratios of each.
// On a GPU (--device cuda, BF16) the same comparison counts the launch cost fusing saves.
// Usage: bench_fused [--shape 100m|0.5b] [--batch 1,16] [--prompt 128] [--decode 16]
//                    [--rounds 5] [--threads N] [--device cpu|cuda]
#include <ATen/CPUGeneratorImpl.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "bench/flags.h"
#include "core/timing.h"
#include "models/causal_lm.h"
#include "models/config.h"
#include "models/kv_cache.h"

using namespace rlhf;
using Clock = std::chrono::steady_clock;

namespace {

// The preset "100m", or Qwen2.5-0.5B's shape (hidden 896, 24 layers, 14 heads over 2 KV
// heads, intermediate 4864, q/k/v biases, tied 151936-token embedding).
models::ModelConfig shape_config(const std::string& shape) {
  if (shape == "100m") return models::preset_config("100m");
  if (shape != "0.5b") throw std::invalid_argument("--shape: expected 100m or 0.5b");
  models::ModelConfig c = models::preset_config("100m");
  c.model_type = "qwen2";
  c.hidden_size = 896;
  c.intermediate_size = 4864;
  c.num_hidden_layers = 24;
  c.num_attention_heads = 14;
  c.num_key_value_heads = 2;
  c.head_dim = 64;
  c.vocab_size = 151936;
  c.qkv_bias = true;
  c.tie_word_embeddings = true;
  c.rope_theta = 1000000.0;
  return c;
}

struct Times {
  std::vector<double> prefill, decode;  // seconds per prefill, per decode step
};

// One round: a fresh cache, a prefill of `prompt` tokens, `steps` one-token decode steps.
// Every step ends in argmax, read by the next forward; the device is synchronized before
// each clock reading.
void round_of(models::CausalLM& model, const torch::Tensor& prompt, int64_t steps, Times& t) {
  const int64_t B = prompt.size(0), P = prompt.size(1);
  const torch::Device device = model.device();
  auto sync = [&] {
    if (device.is_cuda()) torch::cuda::synchronize();
  };
  models::KvCache cache(model.config(), B, P + steps, model.dtype(), device);
  const auto ones = torch::ones({B, P + steps}, torch::TensorOptions(torch::kInt64).device(device));
  sync();
  auto start = Clock::now();
  auto h = model.forward(prompt, {}, {}, &cache);
  auto next = model.logits(h.narrow(1, P - 1, 1)).argmax(-1);  // [B, 1]
  sync();
  t.prefill.push_back(seconds_since(start));
  start = Clock::now();
  for (int64_t s = 0; s < steps; ++s) {
    h = model.forward(next, ones.narrow(1, 0, P + s + 1), {}, &cache);
    next = model.logits(h).argmax(-1);
  }
  sync();
  t.decode.push_back(seconds_since(start) / static_cast<double>(steps));
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double best(const std::vector<double>& v) {
  return *std::min_element(v.begin(), v.end());
}

// One row: plain and fused milliseconds and their ratio, for `stat` of the rounds.
template <typename Stat>
void print_row(const char* what, int64_t B, const Times& plain, const Times& fused, Stat stat) {
  const double pp = stat(plain.prefill), pf = stat(fused.prefill);
  const double dp = stat(plain.decode), df = stat(fused.decode);
  std::printf("%6ld %-7s %11.2f ms %11.2f ms %7.3f  %11.2f ms %11.2f ms %7.3f\n",
              static_cast<long>(B), what, pp * 1e3, pf * 1e3, pf / pp, dp * 1e3, df * 1e3, df / dp);
}

}  // namespace

int main(int argc, char** argv) {
  std::string shape;
  std::vector<int64_t> batches;
  int64_t prompt_len = 0, steps = 0, rounds = 0;
  std::string device_name;
  try {
    bench::Flags flags(argc, argv,
                       "usage: bench_fused [--shape 100m|0.5b] [--batch 1,16] [--prompt 128] "
                       "[--decode 16] [--rounds 5] [--threads N] [--device cpu|cuda]");
    shape = flags.text("--shape", "100m");
    batches = flags.integers("--batch", {1, 16});
    prompt_len = flags.integer("--prompt", 128);
    steps = flags.integer("--decode", 16);
    rounds = flags.integer("--rounds", 5);
    const int64_t threads = flags.integer("--threads", 0);
    device_name = flags.text("--device", "cpu");
    flags.check_all_known();
    if (threads > 0) torch::set_num_threads(static_cast<int>(threads));
    shape_config(shape);
  } catch (const std::invalid_argument& e) {
    std::cerr << "bench_fused: " << e.what() << '\n';
    return 2;
  }
  torch::NoGradGuard no_grad;
  const models::ModelConfig config = shape_config(shape);
  models::CausalLM plain(config);  // FP32, init_weights(0)
  models::CausalLM fused(config);  // the same draws (init_weights is order-stable), then fused
  fused.fuse_projections();
  const torch::Device device(device_name);
  if (device.is_cuda() && !torch::cuda::is_available()) {
    std::cerr << "bench_fused: --device cuda, but torch sees no CUDA device\n";
    return 1;
  }
  const torch::Dtype dtype = device.is_cuda() ? torch::kBFloat16 : torch::kFloat32;
  for (auto* m : {&plain, &fused}) {
    m->to(device, dtype);
    m->eval();
  }
  std::string load;
  std::getline(std::ifstream("/proc/loadavg"), load);
  std::printf(
      "bench_fused: shape %s (%.1fM parameters), %s on %s, %d torch threads, prompt %ld, %ld "
      "decode steps, %ld rounds interleaved; loadavg %s\n",
      shape.c_str(), static_cast<double>(config.num_parameters()) / 1e6,
      dtype == torch::kFloat32 ? "FP32" : "BF16", device.str().c_str(), torch::get_num_threads(),
      static_cast<long>(prompt_len), static_cast<long>(steps), static_cast<long>(rounds),
      load.c_str());
  std::printf("%6s %-7s %14s %14s %7s  %14s %14s %7s\n", "batch", "stat", "prefill plain",
              "prefill fused", "ratio", "decode plain", "decode fused", "ratio");
  for (int64_t B : batches) {
    auto gen = at::detail::createCPUGenerator(B);
    const auto prompt =
        torch::randint(config.vocab_size, {B, prompt_len}, gen, torch::kInt64).to(device);
    Times tp, tf;
    round_of(plain, prompt, 2, tp);  // warm-up (allocator, BLAS)
    round_of(fused, prompt, 2, tf);
    tp = {};
    tf = {};
    for (int64_t r = 0; r < rounds; ++r) {  // alternate which goes first
      if (r % 2 == 0) round_of(plain, prompt, steps, tp);
      round_of(fused, prompt, steps, tf);
      if (r % 2 == 1) round_of(plain, prompt, steps, tp);
    }
    print_row("best", B, tp, tf, best);
    print_row("median", B, tp, tf, median);
  }
  std::getline(std::ifstream("/proc/loadavg"), load);
  std::printf("loadavg after: %s\n", load.c_str());
  return 0;
}
