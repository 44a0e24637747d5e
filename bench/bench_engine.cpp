// Engine benchmark: ZeRO-3 step time and tokens/s on the ~100M preset for N = 1, 2 ranks
// (real processes, real Gloo group), and all-gather / reduce-scatter bandwidth against a
// plain memcpy of the same bytes. Prints figures and ratios; asserts nothing.
// Usage: bench_engine [--steps S] [--seq T] [--micro-batch B] [--comm-mib M] [--train 0|1]
//        [--threads K per rank; default cores / N]
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/flags.h"
#include "bench/rank_processes.h"
#include "core/timing.h"
#include "engine/trainer.h"
#include "models/causal_lm.h"
#include "models/config.h"
#include "tests/support/collective.h"

using namespace rlhf;
using Clock = std::chrono::steady_clock;

namespace {

struct Options {
  int64_t steps = 3;
  int64_t seq = 256;
  int64_t micro_batch = 1;
  int64_t comm_mib = 64;
  bool train = true;
  int64_t threads = 0;  // per rank; 0: the machine's cores / N
};

double best_of(int reps, const std::function<void()>& fn) {
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    auto t0 = Clock::now();
    fn();
    best = std::min(best, seconds_since(t0));
  }
  return best;
}

// One rank of the training benchmark; rank 0 writes its figures to `out`.
void train_rank(transport::CollectiveGroup& group, const Options& o, std::ostream& out) {
  auto config = models::preset_config("100m");
  auto model = std::make_shared<models::CausalLM>(config);
  model->init_weights(0);
  model->set_checkpointing(models::Checkpointing::kPerLayer);
  engine::TrainerConfig tc;
  tc.zero_stage = engine::ZeroStage::kParameters;
  tc.compute_dtype = torch::kBFloat16;
  tc.lr = 1e-5;
  tc.lr_scheduler = engine::LrScheduler::kConstant;
  tc.tied_embeddings = config.tie_word_embeddings;
  tc.total_steps = o.steps;
  engine::Trainer trainer(tc, *model, group);
  auto gen = at::detail::createCPUGenerator(7 + group.rank());
  std::vector<double> times;
  double phase[3] = {0, 0, 0};  // forward, backward (with recompute and reductions), optimizer step
  engine::StepMetrics last;
  for (int64_t s = 0; s < o.steps; ++s) {
    auto tokens = torch::randint(config.vocab_size, {o.micro_batch, o.seq}, gen, torch::kLong);
    auto t0 = Clock::now();
    auto hidden = model->forward(tokens, torch::ones_like(tokens));
    auto loss = -model->next_token_log_probs(hidden, tokens).mean();
    auto t1 = Clock::now();
    trainer.backward(loss);
    auto t2 = Clock::now();
    last = trainer.step();
    times.push_back(seconds_since(t0));
    if (s > 0 || o.steps == 1) {
      phase[0] += std::chrono::duration<double>(t1 - t0).count();
      phase[1] += std::chrono::duration<double>(t2 - t1).count();
      phase[2] += seconds_since(t2);
    }
  }
  if (group.rank() != 0) return;
  // The machine's BF16 matmul rate with this rank's threads, measured now (a loaded machine
  // slows both alike): [T, H] x [H, I] as in the MLP.
  auto a = torch::randn({o.micro_batch * o.seq, config.hidden_size}).to(torch::kBFloat16);
  auto b = torch::randn({config.hidden_size, config.intermediate_size}).to(torch::kBFloat16);
  const double mm_flop = 2.0 * a.size(0) * a.size(1) * b.size(1);
  const double mm_time = best_of(10, [&] { torch::matmul(a, b); });
  double steady = 0;  // mean over steps after the first (warm-up)
  for (size_t i = 1; i < times.size(); ++i) steady += times[i];
  steady /= std::max<size_t>(1, times.size() - 1);
  const double tokens = double(group.size() * o.micro_batch * o.seq);
  const auto& m = last.memory;
  out << "N=" << group.size() << "  params=" << config.num_parameters() / 1e6 << "M  first step "
      << times[0] << " s  steady step " << steady << " s  tokens/s " << tokens / steady << "  loss "
      << last.loss << "\n"
      << "      steady step split: forward " << phase[0] / std::max<int64_t>(1, o.steps - 1)
      << " s, backward " << phase[1] / std::max<int64_t>(1, o.steps - 1) << " s, optimizer step "
      << phase[2] / std::max<int64_t>(1, o.steps - 1) << " s\n"
      << "      model FLOP/s per rank (8 x P x tokens: forward, recompute, backward) "
      << 8.0 * config.num_parameters() * o.micro_batch * o.seq / steady / 1e9
      << " G vs BF16 matmul " << mm_flop / mm_time / 1e9 << " G measured now\n"
      << "      per-rank model states " << m.model_states() / 1e6
      << " MB (16 B x P / N = " << 16.0 * config.num_parameters() / group.size() / 1e6
      << " MB), engine peak " << m.peak / 1e6 << " MB\n";
}

// One rank of the collective benchmark: M MiB moved per collective.
void comm_rank(transport::CollectiveGroup& group, const Options& o, std::ostream& out) {
  const int n = group.size();
  const int64_t bytes = o.comm_mib << 20;
  // all-gather: BF16, output `bytes` in total.
  auto ag_in = torch::ones({bytes / 2 / n}, torch::kBFloat16);
  auto ag_out = torch::empty({bytes / 2}, torch::kBFloat16);
  // reduce-scatter: FP32 (as the trainer reduces gradients), input `bytes` in total.
  auto rs_in = torch::ones({bytes / 4}, torch::kFloat);
  auto rs_out = torch::empty({bytes / 4 / n}, torch::kFloat);
  auto ar = torch::ones({bytes / 4}, torch::kFloat);
  group.barrier();
  const double t_ag = best_of(5, [&] { group.all_gather(ag_out, ag_in); });
  const double t_rs = best_of(5, [&] { group.reduce_scatter(rs_out, rs_in); });

  const double t_ar = best_of(5, [&] { group.all_reduce(ar, transport::ReduceOp::kSum); });
  auto src = torch::ones({bytes}, torch::kByte), dst = torch::empty({bytes}, torch::kByte);
  const double t_copy = best_of(5, [&] { dst.copy_(src); });
  if (group.rank() != 0) return;
  const double gb = bytes / 1e9;
  auto line = [&](const char* what, double t) {
    out << "  " << what << ": " << t * 1e3 << " ms, algbw " << gb / t << " GB/s, busbw "
        << gb * (n - 1) / n / t << " GB/s, time / memcpy " << t / t_copy << "\n";
  };
  out << "collectives, N=" << n << ", " << o.comm_mib
      << " MiB each (best of 5); memcpy of the same bytes: " << t_copy * 1e3
      << " ms = " << gb / t_copy << " GB/s\n";
  line("all_gather (BF16)", t_ag);
  line("reduce_scatter (FP32; Gloo all-reduce, keep own slice)", t_rs);
  line("all_reduce (FP32)", t_ar);
}

// Runs `n` copies of this program as ranks of `mode` and prints rank 0's figures.
void run_ranks(const std::string& mode, int n, const Options& o, char** argv) {
  const std::string dir = "/tmp/bench_engine_" + std::to_string(::getpid());
  std::system(("mkdir -p " + dir).c_str());
  const std::string store = dir + "/store_" + mode + std::to_string(n);
  std::remove(store.c_str());
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r)
    pids.push_back(bench::start_process(
        {"/proc/self/exe", "--rank", mode, std::to_string(n), std::to_string(r), store,
         dir + "/out", std::to_string(o.steps), std::to_string(o.seq),
         std::to_string(o.micro_batch), std::to_string(o.comm_mib), std::to_string(o.threads)}));
  for (pid_t pid : pids) bench::wait_process(pid, "a rank (" + mode + ")");
  std::ifstream in(dir + "/out");
  std::cout << in.rdbuf() << std::flush;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc > 1 && std::string(argv[1]) == "--rank") {
      const std::string mode = argv[2];
      const int n = std::stoi(argv[3]), rank = std::stoi(argv[4]);
      Options o{
          std::stoll(argv[7]), std::stoll(argv[8]), std::stoll(argv[9]), std::stoll(argv[10]), true,
          std::stoll(argv[11])};
      const int cores = static_cast<int>(std::thread::hardware_concurrency());
      torch::set_num_threads(o.threads > 0 ? static_cast<int>(o.threads) : std::max(1, cores / n));
      auto group = test::join_group(argv[5], rank, n, std::chrono::minutes(10));
      std::ostringstream out;
      if (mode == "train")
        train_rank(*group, o, out);
      else
        comm_rank(*group, o, out);
      if (rank == 0) std::ofstream(argv[6]) << out.str();
      return 0;
    }
    bench::Flags flags(argc, argv,
                       "usage: bench_engine [--steps S] [--seq T] [--micro-batch B] "
                       "[--comm-mib M] [--train 0|1] [--threads K]");
    Options o;
    o.steps = flags.integer("--steps", o.steps);
    o.seq = flags.integer("--seq", o.seq);
    o.micro_batch = flags.integer("--micro-batch", o.micro_batch);
    o.comm_mib = flags.integer("--comm-mib", o.comm_mib);
    o.train = flags.integer("--train", 1) != 0;
    o.threads = flags.integer("--threads", o.threads);
    flags.check_all_known();
    std::ifstream cpuinfo("/proc/cpuinfo");
    const std::string info((std::istreambuf_iterator<char>(cpuinfo)), {});
    std::cout << "cores " << std::thread::hardware_concurrency() << ", amx_bf16 "
              << (info.find("amx_bf16") != std::string::npos ? "yes" : "no") << ", avx512_bf16 "
              << (info.find("avx512_bf16") != std::string::npos ? "yes" : "no") << "\n";
    run_ranks("comm", 2, o, argv);
    std::cout << "ZeRO-3 BF16 training, preset 100m, micro batch " << o.micro_batch << " x "
              << o.seq << " tokens per rank, per-layer checkpointing, " << o.steps
              << " steps (first is warm-up)\n";
    if (o.train) {
      for (int n : {1, 2}) run_ranks("train", n, o, argv);
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "bench_engine: " << e.what() << "\n";
    return 1;
  }
}
