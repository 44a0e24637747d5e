// Rollout tensor parallelism, measured across real processes (one per TP rank, Gloo): each
// rank loads only its slices of a checkpoint and the ranks decode in lockstep (an
// all-reduce after attention and after the MLP of every layer, the logits all-gathered).
// Per TP size: the memory a rank holds after the load, measured as malloc's growth
// (mallinfo2), against the whole model measured the same way in the TP 1 process, divided by
// TP (the limit: every rank holds 1/TP of the whole; the replicated norms add 0.04 MiB at the
// 100m preset); the load's peak RSS growth; greedy decode tokens/s at batches 1 and 32, with
// the speedup over TP 1 of the same run against TP x (every rank does 1/TP of the matmuls and
// the collectives cost nothing); and the bytes one decode step all-reduces per rank.
// TP 1 always runs first: it is the reference of both.
// Usage: bench_tp [--preset 100m] [--tp 1,2] [--prompt 64] [--new-tokens 32] [--batches 1,32]
// One torch thread per rank: on the 2-core VM, TP 2 has one core per rank.
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
#include "models/pretrained.h"
#include "models/tensor_parallel.h"
#include "rollout/generator.h"
#include "tests/support/collective.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// One TP rank: load its slices, then greedy decode of each batch size (a warm-up call, then
// the median of 3).
json tp_rank(int rank, int size, const std::string& store, const std::string& dir, int64_t prompt,
             int64_t new_tokens, const std::vector<int64_t>& batches) {
  rlhf::models::TensorParallel tp;
  tp.rank = rank;
  tp.size = size;
  if (size > 1) tp.group = rlhf::test::join_group(store, rank, size, std::chrono::seconds(600));
  const double hwm0 = rlhf::bench::hwm_bytes(), heap0 = rlhf::bench::heap_bytes();
  auto model = rlhf::models::load_pretrained(dir, {}, tp);
  // What the rank holds once the load is over (its temporaries freed, the checkpoint unmapped).
  const double held = rlhf::bench::heap_bytes() - heap0;
  const double load_growth = rlhf::bench::hwm_bytes() - hwm0;
  int64_t weight_bytes = 0;
  for (const auto& p : model->parameters()) weight_bytes += p.numel() * p.element_size();
  json out = {
      {"weight_bytes", weight_bytes}, {"heap_growth", held}, {"load_rss_growth", load_growth}};
  for (int64_t b : batches) {
    rlhf::rollout::GenerationConfig config;
    config.max_new_tokens = new_tokens;
    config.micro_batch_size = b;
    config.kv_block_size = 16;
    config.stop_token_ids = {};  // every row decodes new_tokens tokens
    rlhf::rollout::Generator generator(model, config);
    auto gen = at::detail::createCPUGenerator(3);
    const auto ids = torch::randint(model->config().vocab_size, {b, prompt}, gen, torch::kLong);
    const auto mask = torch::ones_like(ids);
    rlhf::rollout::SamplingParams greedy;
    greedy.temperature = 0.0;
    generator.generate(ids, mask, greedy);
    std::vector<double> rates;
    for (int i = 0; i < 3; ++i) {
      const auto t = generator.generate(ids, mask, greedy).timings;
      rates.push_back(static_cast<double>(t.decode_tokens) / t.decode_seconds);
    }
    std::sort(rates.begin(), rates.end());
    out["tok_s_" + std::to_string(b)] = rates[1];
    // The collectives of one decode step alone, at this batch: 2 x layers + 1 all-reduces
    // of [b, H] and one all-gather of the [b, V / tp] logits (median of 20 steps).
    if (tp.enabled()) {
      const auto& c = model->config();
      std::vector<double> steps;
      for (int i = 0; i < 21; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        for (int64_t k = 0; k < 2 * c.num_hidden_layers + 1; ++k) {
          auto h = torch::ones({b, c.hidden_size}, torch::kBFloat16);
          rlhf::models::tensor_parallel_all_reduce(tp, h);
        }
        rlhf::models::tensor_parallel_gather_vocab(
            tp, torch::ones({b, c.vocab_size / tp.size}, torch::kBFloat16));
        if (i > 0) steps.push_back(rlhf::seconds_since(t0));
      }
      std::sort(steps.begin(), steps.end());
      out["collective_ms_" + std::to_string(b)] = steps[steps.size() / 2] * 1e3;
    }
  }
  return out;
}

std::vector<json> run_ranks(const std::string& self, int size, const fs::path& work,
                            const std::string& dir, int64_t prompt, int64_t new_tokens,
                            const std::string& batches) {
  const std::string store = (work / ("tp_" + std::to_string(size) + ".store")).string();
  std::vector<std::vector<std::string>> argvs;
  std::vector<std::string> outputs;
  for (int r = 0; r < size; ++r) {
    outputs.push_back((work / ("rank" + std::to_string(r) + ".json")).string());
    argvs.push_back({self, "--child", std::to_string(r), std::to_string(size), store, dir,
                     std::to_string(prompt), std::to_string(new_tokens), batches, outputs.back()});
  }
  auto out = rlhf::bench::run_rank_processes(argvs, outputs, "TP " + std::to_string(size));
  fs::remove(store);
  return out;
}

double mib(double bytes) {
  return bytes / (1 << 20);
}

}  // namespace

int main(int argc, char** argv) {
  torch::set_num_threads(1);
  try {
    if (argc == 10 && std::string(argv[1]) == "--child") {
      const json out =
          tp_rank(std::stoi(argv[2]), std::stoi(argv[3]), argv[4], argv[5], std::stoll(argv[6]),
                  std::stoll(argv[7]), rlhf::bench::integer_list(argv[8]));
      std::ofstream(argv[9]) << out.dump();
      return 0;
    }
    std::string preset, batches;
    std::vector<int64_t> sizes;
    int64_t prompt = 64, new_tokens = 32;
    try {
      rlhf::bench::Flags flags(argc, argv,
                               "usage: bench_tp [--preset 100m] [--tp 1,2] [--prompt 64] "
                               "[--new-tokens 32] [--batches 1,32]");
      preset = flags.text("--preset", "100m");
      sizes = flags.integers("--tp", {1, 2});
      prompt = flags.integer("--prompt", 64);
      new_tokens = flags.integer("--new-tokens", 32);
      batches = flags.text("--batches", "1,32");
      rlhf::bench::integer_list(batches);  // checked here, parsed again by each rank
      flags.check_all_known();
    } catch (const std::invalid_argument& e) {
      std::cerr << "bench_tp: " << e.what() << '\n';
      return 2;
    }
    const std::string self = fs::read_symlink("/proc/self/exe").string();
    const fs::path work = fs::temp_directory_path() / ("bench_tp_" + std::to_string(::getpid()));
    fs::create_directories(work);
    const std::string dir = (work / "model").string();
    const auto config = rlhf::models::preset_config(preset);
    {
      rlhf::models::CausalLM model(config);
      model.to(torch::kBFloat16);
      rlhf::models::save_pretrained(model, dir);
    }
    // TP 1 first: its process measures the whole model and the speedups' base.
    sizes.erase(std::remove(sizes.begin(), sizes.end(), 1), sizes.end());
    sizes.insert(sizes.begin(), 1);
    for (int64_t t : sizes)
      rlhf::models::check_tensor_parallel(config, static_cast<int>(t), "--tp");
    std::cout << "preset " << preset << " (" << config.num_parameters() / 1e6
              << "M parameters), BF16, paged engine, greedy, prompt " << prompt << ", "
              << new_tokens << " new tokens per row, torch threads 1 per rank\n\n"
              << "TP  held MiB  whole/TP MiB  ratio  params MiB  load peak RSS growth MiB";
    const auto batch_list = rlhf::bench::integer_list(batches);
    for (int64_t b : batch_list)
      std::cout << "  tok/s b=" << b << "  speedup (ideal "
                << "TP)";
    std::cout << "\n";
    std::vector<double> base(batch_list.size(), 0.0);
    double whole = 0;  // the TP 1 process's heap growth: the whole model, measured
    for (int64_t t : sizes) {
      const json r0 =
          run_ranks(self, static_cast<int>(t), work, dir, prompt, new_tokens, batches)[0];
      const double held = r0["heap_growth"].get<double>();
      if (t == 1) whole = held;
      const double limit = whole / static_cast<double>(t);
      std::printf("%2lld  %8.1f  %12.1f  %5.3f  %10.1f  %24.1f", static_cast<long long>(t),
                  mib(held), mib(limit), held / limit, mib(r0["weight_bytes"].get<double>()),
                  mib(r0["load_rss_growth"].get<double>()));
      for (size_t i = 0; i < batch_list.size(); ++i) {
        const double rate = r0["tok_s_" + std::to_string(batch_list[i])].get<double>();
        if (t == 1) base[i] = rate;
        std::printf("  %9.1f  %5.2fx of %lldx", rate, base[i] > 0 ? rate / base[i] : 0.0,
                    static_cast<long long>(t));
      }
      std::printf("\n");
      for (int64_t b : batch_list) {
        const std::string key = "collective_ms_" + std::to_string(b);
        if (!r0.contains(key)) continue;
        const double step_ms =
            1e3 * static_cast<double>(b) / r0["tok_s_" + std::to_string(b)].get<double>();
        std::printf(
            "    b=%lld: decode step %.2f ms, of which the step's collectives alone take "
            "%.2f ms (%.0f%%)\n",
            static_cast<long long>(b), step_ms, r0[key].get<double>(),
            100.0 * r0[key].get<double>() / step_ms);
      }
    }
    // Per decode step and row, each rank all-reduces 2 x layers + 1 hidden vectors (the
    // embedding, then attention and MLP of each layer) and gathers V logits.
    std::printf(
        "\ncollectives per decoded token and rank: %.1f KiB all-reduced (%lld all-reduces), "
        "%.1f KiB of logits gathered\n",
        (2.0 * config.num_hidden_layers + 1) * config.hidden_size * 2 / 1024.0,
        static_cast<long long>(2 * config.num_hidden_layers + 1), config.vocab_size * 2 / 1024.0);
    fs::remove_all(work);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "bench_tp: " << e.what() << '\n';
    return 1;
  }
}
