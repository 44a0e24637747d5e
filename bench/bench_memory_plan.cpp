// Planned vs measured activation memory: the memory planner's activations + log-prob
// buffers (engine/memory_plan.h) against the measured forward+backward peak of a BF16 preset
// model, with and without per-layer checkpointing, at a few sequence lengths. The engine's
// own terms are checked exactly by tests (tests/engine/memory_plan_test.cpp); this is the
// part that is an estimate. CPU only.
//
// Measurement (bench_model's method; LibTorch keeps no CPU allocator statistics): in a
// forked child, malloc serves every block >= 64 KiB with its own mmap so freed tensors leave
// the resident set at once; peak = VmHWM during forward+backward (reset through
// /proc/self/clear_refs) - RSS before forward, with parameters and .grad already allocated.
#include <malloc.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "bench/flags.h"
#include "bench/proc_memory.h"
#include "engine/memory_plan.h"
#include "models/causal_lm.h"

namespace {

using rlhf::bench::hwm_bytes;
using rlhf::bench::reset_hwm;
using rlhf::bench::rss_bytes;
using rlhf::models::CausalLM;
using rlhf::models::Checkpointing;

// Peak bytes of one forward+backward of the next-token loss above the pre-forward RSS.
double measure(CausalLM& model, const torch::Tensor& ids) {
  for (int pass = 0; pass < 2; ++pass) {  // the first pass allocates .grad and kernels
    model.zero_grad(/*set_to_none=*/false);
    if (pass == 1 && !reset_hwm()) return -1;
    const double before = rss_bytes();
    auto hidden = model.forward(ids, torch::ones_like(ids));
    auto loss = -model.next_token_log_probs(hidden, ids).mean();
    loss.backward();
    if (pass == 1) return hwm_bytes() - before;
  }
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string preset;
  int64_t batch = 1;
  std::vector<int64_t> seqs;
  try {
    rlhf::bench::Flags flags(argc, argv,
                             "usage: bench_memory_plan [--preset 100m] [--batch 1] "
                             "[--seq 128,256,512]");
    preset = flags.text("--preset", "100m");
    batch = flags.integer("--batch", 1);
    seqs = flags.integers("--seq", {128, 256, 512});
    flags.check_all_known();
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "bench_memory_plan: %s\n", e.what());
    return 2;
  }
  torch::set_num_threads(1);
  const auto config = rlhf::models::preset_config(preset);
  std::printf(
      "bench_memory_plan: preset %s (%ld parameters), batch %ld, BF16, activations + log-prob "
      "buffers\n",
      preset.c_str(), static_cast<long>(config.num_parameters()), static_cast<long>(batch));
  std::printf("%-6s %-10s %12s %12s %8s\n", "seq", "checkpoint", "planned MiB", "measured MiB",
              "error");
  for (int64_t T : seqs) {
    for (bool ckpt : {false, true}) {
      const auto child = rlhf::bench::measure_in_child(1, [&] {
        torch::set_num_threads(1);  // the parent's OpenMP pool does not survive fork
        auto model = std::make_shared<CausalLM>(config);
        model->to(torch::kBFloat16);
        model->train();
        model->set_checkpointing(ckpt ? Checkpointing::kPerLayer : Checkpointing::kNone);
        torch::manual_seed(static_cast<uint64_t>(T));
        auto ids =
            torch::randint(0, std::min<int64_t>(config.vocab_size, 259), {batch, T}, torch::kInt64);
        return std::vector<double>{measure(*model, ids)};
      });
      if (!child) return 1;
      const double measured = child->front();
      rlhf::engine::RoleMemoryInput in;
      in.role = "bench";
      in.model = config;
      in.work = rlhf::engine::RoleWork::kTrain;
      in.micro_batch = batch;
      in.seq_len = T;
      in.checkpointing = ckpt;
      const auto terms = rlhf::engine::plan_role(in);
      const double planned = static_cast<double>(terms.activations + terms.log_probs);
      std::printf("%-6ld %-10s %12.1f %12.1f %+7.1f%%\n", static_cast<long>(T),
                  ckpt ? "per-layer" : "none", planned / (1 << 20), measured / (1 << 20),
                  100.0 * (planned - measured) / measured);
    }
  }
  return 0;
}
