// Model benchmark: BF16 forward+backward tokens/s and activation memory of a preset model
// (default: ~100M) with and without per-layer checkpointing, at two sequence lengths, and
// the achieved FLOP/s against this machine's measured matmul FLOP/s. CPU only (on a GPU
// the same numbers come from the CUDA caching allocator; not done here).
//
// Activation memory on CPU (LibTorch keeps no CPU allocator statistics): malloc is told
// to serve every allocation >= 64 KiB with its own mmap (M_MMAP_THRESHOLD, which also
// disables the dynamic threshold) so freed tensors leave the resident set at once; then
//   held = RSS after forward - RSS before forward   (what autograd keeps for backward)
//   peak = VmHWM during forward+backward - RSS before forward (HWM reset through
//          /proc/self/clear_refs), with parameters and their .grad already allocated.
#include <malloc.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "bench/flags.h"
#include "bench/proc_memory.h"
#include "core/timing.h"
#include "models/causal_lm.h"
#include "models/config.h"

namespace {

using rlhf::seconds_since;

using Clock = std::chrono::steady_clock;
using rlhf::models::CausalLM;
using rlhf::models::Checkpointing;

using rlhf::bench::hwm_bytes;
using rlhf::bench::reset_hwm;
using rlhf::bench::rss_bytes;

std::string cpu_bf16_flags() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string text((std::istreambuf_iterator<char>(cpuinfo)), {});
  std::string out;
  for (const char* f : {"amx_bf16", "avx512_bf16"})
    if (text.find(std::string(" ") + f) != std::string::npos)
      out += std::string(out.empty() ? "" : ", ") + f;
  return out.empty() ? "none" : out;
}

// FLOP/s of [M, K] x [K, N] in `dtype`, repeated for at least `min_s` seconds.
double matmul_flops(int64_t M, int64_t K, int64_t N, torch::Dtype dtype, double min_s = 1.0) {
  auto a = torch::randn({M, K}).to(dtype), b = torch::randn({K, N}).to(dtype);
  torch::matmul(a, b);  // warm-up (oneDNN primitive creation)
  int64_t iters = 0;
  auto t0 = Clock::now();
  while (seconds_since(t0) < min_s || iters < 3) {
    auto c = torch::matmul(a, b);
    ++iters;
  }
  return 2.0 * M * K * N * iters / seconds_since(t0);
}

struct StepFigures {
  double seconds = 0;  // mean forward+backward time
  double held = 0;     // bytes kept by autograd after forward
  double peak = 0;     // peak bytes above the pre-forward RSS
};

// One forward+backward of the next-token loss; `held` gets the RSS growth over forward.
double train_step(CausalLM& model, const torch::Tensor& ids, double* held) {
  model.zero_grad(/*set_to_none=*/false);  // keep .grad allocated: not activation memory
  const double before = rss_bytes();
  auto hidden = model.forward(ids, torch::ones_like(ids));
  auto loss = -model.next_token_log_probs(hidden, ids).mean();
  if (held) *held = rss_bytes() - before;
  loss.backward();
  return before;
}

double time_steps(CausalLM& model, const torch::Tensor& ids, int steps) {
  train_step(model, ids, nullptr);  // warm-up: allocates .grad, creates kernels
  auto t0 = Clock::now();
  for (int i = 0; i < steps; ++i) train_step(model, ids, nullptr);
  return seconds_since(t0) / steps;
}

// Needs mallopt(M_MMAP_THRESHOLD) in force (see the file comment).
void measure_memory(CausalLM& model, const torch::Tensor& ids, StepFigures& f) {
  train_step(model, ids, nullptr);  // warm-up under the new malloc settings
  reset_hwm();
  const double before = train_step(model, ids, &f.held);
  f.peak = hwm_bytes() - before;
}

// Model FLOPs of one forward+backward (no recompute counted): 6 x matmul parameters x tokens
// (layers and the LM head), plus attention's QK^T and PV: 3 x 4 x B x T^2 x heads x head_dim
// per layer (the explicit kernel computes the full square, masked).
double step_flops(const rlhf::models::ModelConfig& c, int64_t B, int64_t T) {
  const double layer_params =
      static_cast<double>(c.num_parameters() - c.vocab_size * c.hidden_size -
                          (c.num_hidden_layers * 2 + 1) * c.hidden_size) /
      c.num_hidden_layers;
  const double matmul_params =
      c.num_hidden_layers * layer_params + static_cast<double>(c.vocab_size) * c.hidden_size;
  const double attention =
      3.0 * 4.0 * B * T * T * c.num_attention_heads * c.head_dim * c.num_hidden_layers;
  return 6.0 * matmul_params * B * T + attention;
}

std::string mib(double bytes) {
  std::ostringstream s;
  s.setf(std::ios::fixed);
  s.precision(1);
  s << bytes / (1 << 20) << " MiB";
  return s.str();
}

}  // namespace

int main(int argc, char** argv) {
  std::string preset;
  int64_t batch = 1;
  std::vector<int64_t> seqs;
  int steps = 1;
  try {
    rlhf::bench::Flags flags(argc, argv,
                             "usage: bench_model [--preset 100m] [--batch 1] [--seq 256,512] "
                             "[--threads N] [--steps 2]");
    preset = flags.text("--preset", "100m");
    batch = flags.integer("--batch", 1);
    seqs = flags.integers("--seq", {256, 512});
    steps = static_cast<int>(flags.integer("--steps", 1));
    const int64_t threads = flags.integer("--threads", 0);
    flags.check_all_known();
    if (threads > 0) torch::set_num_threads(static_cast<int>(threads));
  } catch (const std::invalid_argument& e) {
    std::cerr << "bench_model: " << e.what() << '\n';
    return 2;
  }
  std::string load;
  std::getline(std::ifstream("/proc/loadavg"), load);
  std::printf(
      "bench_model: preset %s, batch %ld, BF16, %d torch threads, CPU BF16 units: %s; loadavg %s\n",
      preset.c_str(), static_cast<long>(batch), torch::get_num_threads(), cpu_bf16_flags().c_str(),
      load.c_str());
  const double mm_bf16 = matmul_flops(1024, 768, 2048, torch::kBFloat16);
  const double mm_fp32 = matmul_flops(1024, 768, 2048, torch::kFloat32);
  std::printf("matmul [1024,768]x[768,2048]: BF16 %.1f GFLOP/s, FP32 %.1f GFLOP/s\n", mm_bf16 / 1e9,
              mm_fp32 / 1e9);

  auto config = rlhf::models::preset_config(preset);
  std::printf("model: %ld parameters (%s of BF16 weights)\n\n",
              static_cast<long>(config.num_parameters()),
              mib(config.num_parameters() * 2.0).c_str());
  const std::vector<int64_t> lengths = seqs;
  std::vector<std::array<StepFigures, 2>> figures(lengths.size());
  auto make_model = [&] {
    auto m = std::make_shared<CausalLM>(config);
    m->to(torch::kBFloat16);
    m->train();
    return m;
  };
  auto make_input = [&](int64_t T) {
    torch::manual_seed(static_cast<uint64_t>(T));
    return torch::randint(0, std::min<int64_t>(config.vocab_size, 259), {batch, T}, torch::kInt64);
  };

  // Memory in a forked child whose malloc mmaps every block >= 64 KiB from the start (see
  // the file comment); the parent waits, then times with the default malloc.
  const auto child = rlhf::bench::measure_in_child(lengths.size() * 4, [&] {
    std::vector<double> out;
    // One thread: the parent's OpenMP pool does not survive fork (a parallel region in the
    // child waits forever for its workers).
    torch::set_num_threads(1);
    if (!reset_hwm()) ::_exit(4);
    auto model = make_model();
    for (size_t s = 0; s < lengths.size(); ++s)
      for (int m = 0; m < 2; ++m) {
        model->set_checkpointing(m ? Checkpointing::kPerLayer : Checkpointing::kNone);
        measure_memory(*model, make_input(lengths[s]), figures[s][m]);
        out.push_back(figures[s][m].held);
        out.push_back(figures[s][m].peak);
      }
    return out;
  });
  if (!child) return 1;
  for (size_t s = 0; s < lengths.size(); ++s)
    for (int m = 0; m < 2; ++m) {
      figures[s][m].held = (*child)[4 * s + 2 * static_cast<size_t>(m)];
      figures[s][m].peak = (*child)[4 * s + 2 * static_cast<size_t>(m) + 1];
    }
  const bool hwm_ok = true;

  auto model = make_model();
  for (size_t s = 0; s < lengths.size(); ++s)
    for (int m = 0; m < 2; ++m) {
      model->set_checkpointing(m ? Checkpointing::kPerLayer : Checkpointing::kNone);
      figures[s][m].seconds = time_steps(*model, make_input(lengths[s]), steps);
    }

  std::printf("%-6s %-11s %10s %12s %10s %12s %12s\n", "seq", "checkpoint", "step s", "tokens/s",
              "GFLOP/s", "held", "peak");
  for (size_t s = 0; s < lengths.size(); ++s) {
    const int64_t T = lengths[s];
    const auto& f = figures[s];
    for (int m = 0; m < 2; ++m) {
      std::printf("%-6ld %-11s %10.2f %12.0f %10.1f %12s %12s\n", static_cast<long>(T),
                  m ? "per-layer" : "none", f[m].seconds, batch * T / f[m].seconds,
                  step_flops(config, batch, T) / f[m].seconds / 1e9, mib(f[m].held).c_str(),
                  hwm_ok ? mib(f[m].peak).c_str() : "n/a");
    }
    std::printf(
        "  seq %ld: checkpointing keeps %.1fx less after forward, peak %.2fx lower, costs %.2fx "
        "time; "
        "model FLOP/s = %.0f%% of measured BF16 matmul (%.0f%% without checkpointing)\n",
        static_cast<long>(T), f[0].held / std::max(f[1].held, 1.0),
        f[0].peak / std::max(f[1].peak, 1.0), f[1].seconds / f[0].seconds,
        100.0 * step_flops(config, batch, T) / f[1].seconds / mm_bf16,
        100.0 * step_flops(config, batch, T) / f[0].seconds / mm_bf16);
  }
  std::getline(std::ifstream("/proc/loadavg"), load);
  std::printf("loadavg at the end: %s (other processes share these cores: figures scale with it)\n",
              load.c_str());
  return 0;
}
