// Sharded memory and sharded scoring, measured across real processes (one per rank, Gloo):
//   memory: ZeRO-3 training of a model loaded shard by shard from its checkpoint, per rank
//     vs ranks (1, 2, 4): what a rank holds once built, measured as malloc's growth
//     (mallinfo2), against the 1-rank process's own measured growth / N (the limit: a rank
//     holds 1/N of the whole states); the load's and a step's peak RSS growth, and the step's
//     peak as the engine's tracker accounts it;
//   scoring: action log-probs of the same per-rank batch with the whole model (1 rank) and
//     with ZeRO-3 inference over N ranks (one unit all-gathered at a time): the weights a rank
//     holds (malloc's growth over the load), seconds, and the ratio to the whole model's time
//     (the limit: no gather cost at all, ratio 1).
// The 1-rank run always comes first: it is the reference of both.
// Usage: bench_sharded [--preset 100m] [--ranks 1,2,4] [--rows 4] [--len 256]
// On a 2-core machine N ranks share the cores, so scoring times above 2 ranks also count
// the ranks waiting for each other: read the gathered bytes per second beside them.
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "bench/flags.h"
#include "bench/proc_memory.h"
#include "bench/rank_processes.h"
#include "core/timing.h"
#include "engine/sharded_inference.h"
#include "engine/trainer.h"
#include "models/pretrained.h"
#include "tests/support/collective.h"

namespace {

using rlhf::seconds_since;

namespace fs = std::filesystem;
using nlohmann::json;
using rlhf::bench::heap_bytes;
using rlhf::bench::hwm_bytes;
using Clock = std::chrono::steady_clock;

torch::Tensor batch(int64_t rows, int64_t len, int64_t vocab) {
  auto gen = at::detail::createCPUGenerator(11);
  return torch::randint(vocab, {rows, len}, gen, torch::kLong);
}

// One rank of ZeRO-3 BF16 training: sharded load, one step of `rows` x `len` tokens.
json train_rank(int rank, int size, const std::string& store, const std::string& dir, int64_t rows,
                int64_t len) {
  auto group = rlhf::test::join_group(store, rank, size, std::chrono::seconds(300));
  const double hwm0 = hwm_bytes(), heap0 = heap_bytes();
  const rlhf::models::PretrainedSource source(dir);
  rlhf::models::CausalLM model(source.config(), rlhf::models::Materialize::kDeferred);
  model.set_checkpointing(rlhf::models::Checkpointing::kPerLayer);
  rlhf::engine::TrainerConfig config;
  config.zero_stage = rlhf::engine::ZeroStage::kParameters;
  config.tied_embeddings = model.config().tie_word_embeddings;
  config.grad_accum_steps = 1;
  rlhf::engine::Trainer trainer(config, model, *group, &source);
  const double held = heap_bytes() - heap0;  // the built rank: its states, measured
  const double load_growth = hwm_bytes() - hwm0;
  const auto t0 = Clock::now();
  auto tokens = batch(rows, len, model.config().vocab_size);
  auto m = trainer.train_step([&](int64_t) {
    auto hidden = model.forward(tokens, torch::ones_like(tokens));
    return -model.next_token_log_probs(hidden, tokens).mean();
  });
  return {{"heap_growth", held},         {"load_rss_growth", load_growth},
          {"step_peak", m.memory.peak},  {"step_rss_growth", hwm_bytes() - hwm0},
          {"step_s", seconds_since(t0)}, {"params", model.config().num_parameters()}};
}

// One rank scoring `rows` x `len` tokens (3 timed repeats after a warm-up), with the whole
// model when size == 1, else ZeRO-3 inference over the group.
json score_rank(int rank, int size, const std::string& store, const std::string& dir, int64_t rows,
                int64_t len) {
  torch::NoGradGuard no_grad;
  const rlhf::models::PretrainedSource source(dir);
  auto model = std::make_shared<rlhf::models::CausalLM>(source.config(),
                                                        rlhf::models::Materialize::kDeferred);
  std::unique_ptr<rlhf::transport::CollectiveGroup> group;
  if (size > 1) group = rlhf::test::join_group(store, rank, size, std::chrono::seconds(300));
  std::unique_ptr<rlhf::engine::ShardedInference> sharded;
  const double heap0 = heap_bytes();
  if (size == 1) {
    rlhf::models::load_whole(*model, source, source.dtype(), torch::kCPU);
  } else {
    sharded = std::make_unique<rlhf::engine::ShardedInference>(
        *model, *group, source, source.dtype(), torch::kCPU, model->config().tie_word_embeddings);
  }
  const double weight_bytes = heap_bytes() - heap0;  // the weights the rank holds, measured
  auto tokens = batch(rows, len, model->config().vocab_size);
  auto once = [&] {
    auto hidden = model->forward(tokens, torch::ones_like(tokens));
    return model->next_token_log_probs(hidden, tokens);
  };
  once();
  std::vector<double> times;
  for (int i = 0; i < 3; ++i) {
    const auto t0 = Clock::now();
    once();
    times.push_back(seconds_since(t0));
  }
  std::sort(times.begin(), times.end());
  return {{"weight_bytes", weight_bytes}, {"score_s", times[1]}};
}

// Runs `size` ranks of this program in `mode`, returns each rank's JSON.
std::vector<json> run_ranks(const std::string& self, const std::string& mode, int size,
                            const fs::path& work, const std::string& dir, int64_t rows,
                            int64_t len) {
  const std::string store =
      (work / (mode + "_" + std::to_string(size) + "_" + std::to_string(::getpid()))).string();
  std::vector<std::vector<std::string>> argvs;
  std::vector<std::string> outputs;
  for (int r = 0; r < size; ++r) {
    outputs.push_back((work / (mode + std::to_string(r) + ".json")).string());
    argvs.push_back({self, "--child", mode, std::to_string(r), std::to_string(size), store, dir,
                     std::to_string(rows), std::to_string(len), outputs.back()});
  }
  auto out = rlhf::bench::run_rank_processes(argvs, outputs, mode);
  fs::remove(store);
  return out;
}

std::string gib(double bytes) {
  std::ostringstream s;
  s.setf(std::ios::fixed);
  s.precision(3);
  s << bytes / (1ll << 30);
  return s.str();
}

}  // namespace

int main(int argc, char** argv) {
  torch::set_num_threads(1);
  try {
    if (argc > 1 && std::string(argv[1]) == "--child") {
      const std::string mode = argv[2];
      const int rank = std::stoi(argv[3]), size = std::stoi(argv[4]);
      const int64_t rows = std::stoll(argv[7]), len = std::stoll(argv[8]);
      json out = mode == "train" ? train_rank(rank, size, argv[5], argv[6], rows, len)
                                 : score_rank(rank, size, argv[5], argv[6], rows, len);
      std::ofstream(argv[9]) << out.dump();
      return 0;
    }
    std::string preset;
    std::vector<int> ranks;
    int64_t rows = 4, len = 256;
    try {
      rlhf::bench::Flags flags(
          argc, argv,
          "usage: bench_sharded [--preset 100m] [--ranks 1,2,4] [--rows 4] [--len 256]");
      preset = flags.text("--preset", "100m");
      rows = flags.integer("--rows", 4);
      len = flags.integer("--len", 256);
      for (int64_t n : flags.integers("--ranks", {1, 2, 4})) ranks.push_back(static_cast<int>(n));
      flags.check_all_known();
    } catch (const std::invalid_argument& e) {
      std::cerr << "bench_sharded: " << e.what() << '\n';
      return 2;
    }
    const std::string self = fs::read_symlink("/proc/self/exe").string();
    const fs::path work =
        fs::temp_directory_path() / ("bench_sharded_" + std::to_string(::getpid()));
    fs::create_directories(work);
    const std::string dir = (work / "model").string();
    {
      rlhf::models::CausalLM model(rlhf::models::preset_config(preset));
      model.to(torch::kBFloat16);
      rlhf::models::save_pretrained(model, dir);
    }
    // 1 rank first: its process measures the whole (states, weights, scoring time).
    ranks.erase(std::remove(ranks.begin(), ranks.end(), 1), ranks.end());
    ranks.insert(ranks.begin(), 1);
    std::cout << "preset " << preset << ", BF16 checkpoint, ZeRO-3, " << rows << " x " << len
              << " tokens per rank, torch threads 1 per rank\n\n";
    std::cout << "memory per rank (rank 0; GiB; held = malloc's growth over the load)\n"
              << "ranks    held  1-rank/N  ratio  load peak RSS growth  step tracked peak  "
                 "step peak RSS growth  step s\n";
    double whole = 0, params = 0;
    for (int n : ranks) {
      const json r0 = run_ranks(self, "train", n, work, dir, rows, len)[0];
      const double held = r0["heap_growth"].get<double>();
      if (n == 1) whole = held, params = r0["params"].get<double>();
      std::printf("%5d  %6s  %8s  %5.3f  %20s  %17s  %20s  %6.2f\n", n, gib(held).c_str(),
                  gib(whole / n).c_str(), held / (whole / n),
                  gib(r0["load_rss_growth"].get<double>()).c_str(),
                  gib(r0["step_peak"].get<double>()).c_str(),
                  gib(r0["step_rss_growth"].get<double>()).c_str(), r0["step_s"].get<double>());
    }
    std::cout << "(for reference, ZeRO's 16 P bytes of states: " << gib(16.0 * params)
              << " GiB, against " << gib(whole) << " GiB held by the 1-rank process)\n";
    std::cout << "\nscoring (action log-probs; rank 0; weights held = malloc's growth over the "
                 "load)\n"
              << "ranks  weights held GiB  1-rank/N  ratio  seconds  vs whole model\n";
    double whole_weights = 0, whole_s = 0;
    for (int n : ranks) {
      const json r0 = run_ranks(self, "score", n, work, dir, rows, len)[0];
      const double held = r0["weight_bytes"].get<double>(), s = r0["score_s"].get<double>();
      if (n == 1) whole_weights = held, whole_s = s;
      std::printf("%5d  %16s  %8s  %5.3f  %7.3f  %13.3fx\n", n, gib(held).c_str(),
                  gib(whole_weights / n).c_str(), held / (whole_weights / n), s, s / whole_s);
    }
    fs::remove_all(work);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "bench_sharded: " << e.what() << '\n';
    return 1;
  }
}
