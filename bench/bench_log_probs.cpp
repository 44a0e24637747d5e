// Log-probs without full logits (issue 28): peak resident memory and time of a scoring call
// and of an SFT train step at a large vocabulary, for each train.logits_chunk_tokens given
// (the first is "before", default 0: the path before token chunks; the others "after").
// The shape defaults to the report that opened the issue: FP32, 4 rows of 1500 tokens, a
// 2-layer hidden-64 model with Qwen2's 151,936-token vocabulary (that user's step peaked at
// 2.08 GB RSS and took 26 s).
//   scoring: a forward without a graph and every position's next-token log-probs, as the
//     reference's sequence_log_probs does;
//   train step: what a train_sft worker runs: engine::Trainer (ZeRO-1, one rank, FP32 master
//     and AdamW), per-layer checkpointing, forward, log-probs, the mean NLL, backward, step.
// Each runs in its own child process (bench/proc_memory.h: malloc returns freed blocks at
// once); "peak RSS" is that process's VmHWM, what a worker reports as peak_rss_bytes, and
// "above start" its rise over the RSS before the call (model and optimizer already built).
// Usage: bench_log_probs [--rows 4] [--seq 1500] [--vocab 151936] [--steps 2]
//        [--chunks 0,1024] [--dtype fp32|bf16] [--threads 1]
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "bench/flags.h"
#include "bench/proc_memory.h"
#include "core/timing.h"
#include "engine/trainer.h"
#include "models/causal_lm.h"
#include "models/config.h"
#include "transport/collective_group.h"

using namespace rlhf;
using Clock = std::chrono::steady_clock;

namespace {

struct Options {
  int64_t rows = 4, seq = 1500, vocab = 151936, steps = 2, threads = 1;
  std::vector<int64_t> chunks = {0, 1024};
  torch::Dtype dtype = torch::kFloat32;
};

struct Figures {
  double peak = 0;     // VmHWM of the process, bytes
  double above = 0;    // VmHWM - RSS before the measured calls, bytes
  double seconds = 0;  // per call (the train step: the mean after the first)
};

std::shared_ptr<models::CausalLM> make_model(const Options& o, int64_t chunk) {
  models::ModelConfig c = models::preset_config("tiny");  // 2 layers, hidden 64
  c.vocab_size = o.vocab;
  c.max_position_embeddings = std::max<int64_t>(c.max_position_embeddings, o.seq);
  auto model = std::make_shared<models::CausalLM>(c);
  model->init_weights(0);
  model->set_logits_chunk_tokens(chunk);
  return model;
}

torch::Tensor tokens(const Options& o) {
  auto gen = at::detail::createCPUGenerator(1);
  return torch::randint(o.vocab, {o.rows, o.seq}, gen, torch::kLong);
}

std::vector<double> scoring(const Options& o, int64_t chunk) {
  auto model = make_model(o, chunk);
  model->to(o.dtype);
  model->eval();
  const auto ids = tokens(o);
  torch::NoGradGuard no_grad;
  const double start = bench::rss_bytes();
  bench::reset_hwm();
  const auto t0 = Clock::now();
  auto lp = model->next_token_log_probs(model->forward(ids, torch::ones_like(ids)), ids);
  const double s = seconds_since(t0);
  if (!std::isfinite(lp.sum().item<double>())) std::fprintf(stderr, "non-finite log-probs\n");
  return {bench::hwm_bytes(), bench::hwm_bytes() - start, s};
}

std::vector<double> train_step(const Options& o, int64_t chunk) {
  auto model = make_model(o, chunk);
  model->set_checkpointing(models::Checkpointing::kPerLayer);
  transport::CollectiveConfig cc;
  const std::string store =
      (std::filesystem::temp_directory_path() / ("bench_log_probs_" + std::to_string(::getpid())))
          .string();
  cc.store_path = store;
  auto group = transport::make_collective_group(cc);
  engine::TrainerConfig tc;
  tc.zero_stage = engine::ZeroStage::kOptimizer;
  tc.compute_dtype = o.dtype;
  tc.lr = 1e-4;
  tc.lr_scheduler = engine::LrScheduler::kConstant;
  tc.total_steps = o.steps;
  engine::Trainer trainer(tc, *model, *group);
  const auto ids = tokens(o);
  const double start = bench::rss_bytes();
  bench::reset_hwm();
  double later = 0;
  for (int64_t s = 0; s < o.steps; ++s) {
    const auto t0 = Clock::now();
    trainer.train_step([&](int64_t) {
      auto lp = model->next_token_log_probs(model->forward(ids, torch::ones_like(ids)), ids);
      return -lp.mean();  // dpo::sft_loss with every response token counted
    });
    if (s > 0 || o.steps == 1) later += seconds_since(t0);
  }
  std::filesystem::remove(store);
  return {bench::hwm_bytes(), bench::hwm_bytes() - start,
          later / static_cast<double>(std::max<int64_t>(1, o.steps - 1))};
}

Options parse(int argc, char** argv) {
  bench::Flags flags(argc, argv,
                     "usage: bench_log_probs [--rows 4] [--seq 1500] [--vocab 151936] "
                     "[--steps 2] [--threads 1] [--chunks 0,1024] [--dtype fp32|bf16]");
  Options o;
  o.rows = flags.integer("--rows", o.rows);
  o.seq = flags.integer("--seq", o.seq);
  o.vocab = flags.integer("--vocab", o.vocab);
  o.steps = flags.integer("--steps", o.steps);
  o.threads = flags.integer("--threads", o.threads);
  o.chunks = flags.integers("--chunks", o.chunks);
  o.dtype = flags.text("--dtype", "fp32") == "bf16" ? torch::kBFloat16 : torch::kFloat32;
  flags.check_all_known();
  return o;
}

double gb(double bytes) {
  return bytes / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  try {
    o = parse(argc, argv);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "bench_log_probs: %s\n", e.what());
    return 2;
  }
  torch::set_num_threads(static_cast<int>(o.threads));
  std::printf(
      "%s, %lld rows x %lld tokens, vocab %lld, tiny preset (2 layers, hidden 64), "
      "%lld thread(s); load average %s",
      o.dtype == torch::kFloat32 ? "FP32" : "BF16", static_cast<long long>(o.rows),
      static_cast<long long>(o.seq), static_cast<long long>(o.vocab),
      static_cast<long long>(o.threads), [] {
        static char buf[64] = "?\n";
        if (FILE* f = std::fopen("/proc/loadavg", "r")) {
          if (!std::fgets(buf, sizeof buf, f)) buf[0] = 0;
          std::fclose(f);
        }
        return buf;
      }());
  std::printf("[tokens, V] FP32 logits of one micro batch: %.2f GB\n\n",
              gb(4.0 * o.rows * o.seq * o.vocab));
  std::printf("%-22s %8s %10s %12s %9s\n", "call", "chunk", "peak RSS", "above start", "seconds");
  std::vector<std::vector<Figures>> all(2);
  for (int which = 0; which < 2; ++which) {
    for (int64_t chunk : o.chunks) {
      auto r = bench::measure_in_child(
          3, [&] { return which == 0 ? scoring(o, chunk) : train_step(o, chunk); });
      Figures f;
      if (r) f = {(*r)[0], (*r)[1], (*r)[2]};
      all[which].push_back(f);
      std::printf("%-22s %8lld %7.3f GB %9.3f GB %9.2f\n",
                  which == 0 ? "scoring (no graph)" : "SFT train step",
                  static_cast<long long>(chunk), gb(f.peak), gb(f.above), f.seconds);
      std::fflush(stdout);
    }
  }
  std::printf("\nbefore / after (chunk %lld against each other):\n",
              static_cast<long long>(o.chunks.front()));
  for (size_t k = 1; k < o.chunks.size(); ++k) {
    for (int which = 0; which < 2; ++which) {
      const Figures &b = all[which].front(), &a = all[which][k];
      std::printf(
          "  %-20s chunk %6lld: peak RSS %.2fx smaller, above start %.2fx smaller, "
          "time after / before %.2f\n",
          which == 0 ? "scoring" : "train step", static_cast<long long>(o.chunks[k]),
          b.peak / a.peak, b.above / a.above, a.seconds / b.seconds);
    }
  }
  return 0;
}
