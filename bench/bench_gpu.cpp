// GPU benchmark: rollout decode and one trainer step of Qwen2.5-0.5B- and 1.5B-shaped models
// (built in code, random init, BF16) on one device, each figure beside its limit:
//  a. decode tokens/s (rollout::Generator, greedy and temperature 1, no stop token) against
//     the weight-bandwidth bound, copy bandwidth measured here / BF16 weight bytes x batch,
//     and the tighter bound that adds the KV cache each step reads;
//  b. training step (engine::Trainer, 1-rank NCCL group, ZeRO stage 1 unless --zero 3,
//     per-layer checkpointing, mean next-token NLL): MFU of model FLOPs (6 x P + 12 x L x H x T
//     per token) against the BF16 dense peak of the spec sheet and a measured 8192^3 BF16
//     GEMM, and the hardware-FLOPs utilisation that counts the recompute;
//  c. peak device memory of each measurement (CUDA caching allocator, allocated and reserved).
// `--device cpu` runs the same code on the tiny preset with small shapes (a smoke test; its
// figures say nothing about GPUs). bench/hf_gpu_reference.py measures the same figures with
// HF transformers and bench/gpu_compare.py prints the ratios of the two --out files.
// Usage: bench_gpu --device cuda|cpu [--models 0.5b,1.5b] [--batches 1,32,256]
//        [--new-tokens 128] [--prompt-len 128] [--train-seq 1024] [--train-batch 8]
//        [--steps 3] [--zero 1|3] [--peak-tflops F] [--threads N] [--sections decode,train]
//        [--engines contiguous,paged,graphs,flashinfer] [--out FILE.json]
// On cpu torch runs 1 thread unless --threads says otherwise: the tiny model gains nothing from
// more, and on a shared 2-core machine a second OpenMP thread waiting for its core made every
// decode step over 100x slower.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "bench/flags.h"
#include "bench/proc_memory.h"
#include "core/timing.h"
#include "engine/trainer.h"
#include "kernels/kernels.h"
#include "models/causal_lm.h"
#include "models/config.h"
#include "rollout/generator.h"
#include "transport/collective_group.h"

using namespace rlhf;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

namespace {

constexpr const char* kUsage =
    "usage: bench_gpu --device cuda|cpu [--models 0.5b,1.5b] [--batches 1,32,256] "
    "[--new-tokens 128] [--prompt-len 128] [--train-seq 1024] [--train-batch 8] [--steps 3] "
    "[--zero 1|3] [--peak-tflops F] [--threads N] [--sections decode,train] "
    "[--engines contiguous,paged,graphs,flashinfer] [--out FILE.json]";

struct Options {
  torch::Device device = torch::Device(torch::kCUDA, 0);
  std::vector<std::string> models;  // default: 0.5b,1.5b on cuda, tiny on cpu
  std::vector<int64_t> batches;     // default: 1,32,256 on cuda, 1,8 on cpu
  int64_t new_tokens = 128;
  int64_t prompt_len = 128;
  int64_t train_seq = 0;    // 0: 1024 on cuda, 128 on cpu
  int64_t train_batch = 0;  // 0: 8 on cuda, 2 on cpu
  int64_t steps = 0;        // timed optimizer steps after one warm-up; 0: 3 on cuda, 2 on cpu
  int zero_stage = 1;
  double peak_flops = 0;  // BF16 dense FLOP/s; 0: from the device name
  int threads = 0;        // torch CPU threads; 0: 1 on cpu, torch's default on cuda
  // --engines: the decode engines measured: contiguous (one KV cache per batch), paged
  // (rollout.kv_block_size 16, eager steps: rollout.enforce_eager), graphs (paged, padded
  // steps replayed as CUDA graphs), all three with torch's operators; flashinfer (graphs with
  // FlashInfer's kernels, rollout.gpu_kernels: the GPU default). Default: all four on cuda
  // (flashinfer when compiled in), the first two on cpu.
  std::vector<std::string> engines;
  bool decode = true;  // --sections: which of a. and b. to run
  bool train = true;
  std::string out;  // JSON figures, when set
};

Options parse_options(int argc, char** argv) {
  bench::Flags flags(argc, argv, kUsage);
  Options o;
  const std::string device = flags.text("--device", "cuda");
  o.models = flags.list("--models", {});
  o.batches = flags.integers("--batches", {});
  o.new_tokens = flags.integer("--new-tokens", o.new_tokens);
  o.prompt_len = flags.integer("--prompt-len", o.prompt_len);
  o.train_seq = flags.integer("--train-seq", o.train_seq);
  o.train_batch = flags.integer("--train-batch", o.train_batch);
  o.steps = flags.integer("--steps", o.steps);
  o.zero_stage = static_cast<int>(flags.integer("--zero", o.zero_stage));
  o.peak_flops = flags.number("--peak-tflops", 0.0) * 1e12;
  o.threads = static_cast<int>(flags.integer("--threads", o.threads));
  const auto sections = flags.list("--sections", {"decode", "train"});
  auto has = [&](const char* s) {
    return std::find(sections.begin(), sections.end(), s) != sections.end();
  };
  o.decode = has("decode");
  o.train = has("train");
  if (!o.decode && !o.train)
    throw std::invalid_argument("--sections: decode, train or both, got " +
                                flags.text("--sections"));
  o.engines = flags.list("--engines", {});
  for (const auto& e : o.engines)
    if (e != "contiguous" && e != "paged" && e != "graphs" && e != "flashinfer")
      throw std::invalid_argument("--engines: contiguous, paged, graphs or flashinfer, got " + e);
  o.out = flags.text("--out");
  flags.check_all_known();
  if (device != "cuda" && device != "cpu")
    throw std::invalid_argument("--device must be cuda or cpu, got " + device);
  const bool cuda = device == "cuda";
  o.device = cuda ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
  if (o.models.empty())
    o.models = cuda ? bench::split_list("0.5b,1.5b") : bench::split_list("tiny");
  if (o.batches.empty())
    o.batches = cuda ? std::vector<int64_t>{1, 32, 256} : std::vector<int64_t>{1, 8};
  if (o.train_seq == 0) o.train_seq = cuda ? 1024 : 128;
  if (o.train_batch == 0) o.train_batch = cuda ? 8 : 2;
  if (o.steps == 0) o.steps = cuda ? 3 : 2;
  if (o.engines.empty()) {
    o.engines =
        cuda ? bench::split_list("contiguous,paged,graphs") : bench::split_list("contiguous,paged");
    if (cuda && kernels::available()) o.engines.push_back("flashinfer");
  }
  if (o.threads == 0 && !cuda) o.threads = 1;
  if (o.zero_stage != 1 && o.zero_stage != 3)
    throw std::invalid_argument("--zero must be 1 or 3, got " + std::to_string(o.zero_stage));
  if (o.new_tokens < 2 || o.prompt_len < 1 || o.train_seq < 2 || o.train_batch < 1 || o.steps < 1)
    throw std::invalid_argument(
        "--new-tokens >= 2, --prompt-len >= 1, --train-seq >= 2, --train-batch >= 1 and "
        "--steps >= 1 are required");
  return o;
}

// --- Device: timing, memory, limits ------------------------------------------------------

void synchronize(torch::Device d) {
  if (d.is_cuda()) torch::cuda::synchronize(d.index());
}

// Wall seconds of fn() with the device's queue drained before and after.
double timed(torch::Device d, const std::function<void()>& fn) {
  synchronize(d);
  const auto t0 = Clock::now();
  fn();
  synchronize(d);
  return seconds_since(t0);
}

// Peak bytes over one measurement. CUDA: the caching allocator's statistics (allocated =
// tensors, reserved = what it holds from the driver); CPU: the process's resident peak.
struct PeakMemory {
  double allocated = -1;  // -1: not known on this device
  double reserved = -1;
  double host_rss = -1;
};

void reset_peak(torch::Device d) {
  if (d.is_cuda()) {
    c10::cuda::CUDACachingAllocator::emptyCache();  // reserved then starts from what is live
    c10::cuda::CUDACachingAllocator::resetPeakStats(d.index());
  } else {
    bench::reset_hwm();
  }
}

PeakMemory read_peak(torch::Device d) {
  PeakMemory m;
  if (d.is_cuda()) {
    synchronize(d);
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(d.index());
    const auto all = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    m.allocated = static_cast<double>(stats.allocated_bytes[all].peak);
    m.reserved = static_cast<double>(stats.reserved_bytes[all].peak);
  } else {
    m.host_rss = bench::hwm_bytes();
  }
  return m;
}

json to_json(const PeakMemory& m) {
  return {{"peak_allocated_bytes", m.allocated},
          {"peak_reserved_bytes", m.reserved},
          {"peak_host_rss_bytes", m.host_rss}};
}

std::string gib(double bytes) {
  if (bytes < 0) return "n/a";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / double(1 << 30));
  return buf;
}

// Bytes read + written per second by tensor copy_ (1 GiB on cuda, far past any cache; 256 MiB
// on cpu): best of 5 rounds of 10 copies.
double copy_bandwidth(torch::Device d) {
  const int64_t bytes = d.is_cuda() ? (int64_t{1} << 30) : (int64_t{256} << 20);
  const auto options = torch::TensorOptions(torch::kUInt8).device(d);
  auto src = torch::ones({bytes}, options), dst = torch::zeros({bytes}, options);
  dst.copy_(src);  // warm-up: first touch of the pages
  const int copies = 10;
  double best = 1e30;
  for (int r = 0; r < 5; ++r)
    best = std::min(best, timed(d, [&] {
                      for (int i = 0; i < copies; ++i) dst.copy_(src);
                    }));
  TORCH_CHECK(dst[bytes - 1].item<uint8_t>() == 1, "copy_bandwidth: the copy did not happen");
  return 2.0 * static_cast<double>(bytes) * copies / best;
}

// BF16 FLOP/s of an n^3 GEMM (8192 on cuda, 1024 on cpu): best of 3 rounds.
double matmul_flops(torch::Device d) {
  const int64_t n = d.is_cuda() ? 8192 : 1024;
  const auto options = torch::TensorOptions(torch::kBFloat16).device(d);
  auto a = torch::randn({n, n}, options), b = torch::randn({n, n}, options);
  auto c = torch::matmul(a, b);  // warm-up: cuBLAS handle, heuristics, oneDNN primitives
  const int reps = d.is_cuda() ? 20 : 2;
  double best = 1e30;
  for (int r = 0; r < 3; ++r)
    best = std::min(best, timed(d, [&] {
                      for (int i = 0; i < reps; ++i) at::mm_out(c, a, b);
                    }));
  return 2.0 * double(n) * double(n) * double(n) * reps / best;
}

struct DeviceInfo {
  std::string name;
  double memory_bytes = 0;
  double spec_flops = 0;      // BF16 dense peak of the spec sheet; 0: unknown
  double spec_bandwidth = 0;  // HBM bytes/s of the spec sheet; 0: unknown (shown only)
  double copy_bandwidth = 0;  // measured here
  double matmul_flops = 0;    // measured here
};

// Spec-sheet figures by device name (NVIDIA datasheets, dense BF16 without sparsity).
void fill_spec(DeviceInfo& info) {
  struct Spec {
    const char* name;
    double flops, bandwidth;
  };
  static const Spec kSpecs[] = {{"H200", 989e12, 4.8e12},
                                {"H100 NVL", 835e12, 3.9e12},
                                {"H100 PCIe", 756e12, 2.0e12},
                                {"H100", 989e12, 3.35e12},  // SXM (HBM3)
                                {"A100", 312e12, 2.0e12}};
  for (const auto& s : kSpecs) {
    if (info.name.find(s.name) != std::string::npos) {
      info.spec_flops = s.flops;
      info.spec_bandwidth = s.bandwidth;
      return;
    }
  }
}

DeviceInfo device_info(const Options& o) {
  DeviceInfo info;
  if (o.device.is_cuda()) {
    const cudaDeviceProp* prop = at::cuda::getDeviceProperties(o.device.index());
    info.name = prop->name;
    info.memory_bytes = static_cast<double>(prop->totalGlobalMem);
    fill_spec(info);
  } else {
    info.memory_bytes = double(::sysconf(_SC_PHYS_PAGES)) * double(::sysconf(_SC_PAGESIZE));
    std::ifstream cpuinfo("/proc/cpuinfo");
    for (std::string line; std::getline(cpuinfo, line);)
      if (line.rfind("model name", 0) == 0) {
        info.name = line.substr(line.find(':') + 2);
        break;
      }
  }
  if (o.peak_flops > 0) info.spec_flops = o.peak_flops;
  info.copy_bandwidth = copy_bandwidth(o.device);
  info.matmul_flops = matmul_flops(o.device);
  return info;
}

// --- Models ----------------------------------------------------------------------------

// "tiny": the built-in preset; "0.5b" / "1.5b": the shapes of Qwen2.5-0.5B / -1.5B (their HF
// config.json values), random init.
models::ModelConfig bench_config(const std::string& name) {
  if (name == "tiny") return models::preset_config("tiny");
  models::ModelConfig c;
  c.model_type = "qwen2";
  c.architectures = {"Qwen2ForCausalLM"};
  c.vocab_size = 151936;
  c.tie_word_embeddings = true;
  c.qkv_bias = true;  // Qwen2: q/k/v biased, o_proj and MLP not
  c.rope_theta = 1e6;
  c.rms_norm_eps = 1e-6;
  c.max_position_embeddings = 32768;
  c.bos_token_id = c.eos_token_id = c.pad_token_id = 151643;
  if (name == "0.5b") {
    c.hidden_size = 896;
    c.num_hidden_layers = 24;
    c.num_attention_heads = 14;
    c.intermediate_size = 4864;
  } else if (name == "1.5b") {
    c.hidden_size = 1536;
    c.num_hidden_layers = 28;
    c.num_attention_heads = 12;
    c.intermediate_size = 8960;
  } else {
    throw std::invalid_argument("--models: unknown model " + name + " (0.5b, 1.5b, tiny)");
  }
  c.num_key_value_heads = 2;
  c.head_dim = c.hidden_size / c.num_attention_heads;
  c.validate("bench_gpu model " + name);
  return c;
}

// Parameters a matmul reads: all of them but an untied input embedding (a row lookup). With
// tied embeddings the matrix is read once per token, by the LM head.
double matmul_params(const models::ModelConfig& c) {
  const double embedding = static_cast<double>(c.vocab_size * c.hidden_size);
  return static_cast<double>(c.num_parameters()) - (c.tie_word_embeddings ? 0.0 : embedding);
}

// --- a. Decode ---------------------------------------------------------------------------

// A generator for `batch` prompts and `new_tokens` tokens on `engine`. On a GPU a generator
// keeps its decode graphs between calls (captured once per shape), as the rollout worker's.
rollout::Generator make_generator(const std::shared_ptr<models::CausalLM>& model, int64_t batch,
                                  int64_t new_tokens, const std::string& engine) {
  rollout::GenerationConfig config;
  if (engine != "contiguous") {
    config.kv_block_size = 16;  // the job spec's default
    config.decode_steps = engine == "graphs" || engine == "flashinfer"
                              ? rollout::DecodeSteps::kAuto
                              : rollout::DecodeSteps::kEager;
  }
  // FlashInfer's kernels (kernels/) only in the engine named after them: the others are
  // torch's operators, the reference the ratio is taken against.
  config.gpu_kernels = engine == "flashinfer";
  config.max_new_tokens = new_tokens;
  config.micro_batch_size = batch;  // one KV cache for the whole batch
  config.stop_token_ids = {};       // no stop token: every row makes new_tokens tokens
  config.pad_token_id = 0;
  return rollout::Generator(model, config);
}

struct DecodeRow {
  std::string model, sampling, engine;
  int64_t cuda_graphs = 0;    // shapes captured by the warm-up (the timed runs replay them)
  double capture_s = 0;       // capturing them (outside decode_s)
  int64_t graph_kernels = 0;  // kernels in the largest decode step's graph
  int64_t batch = 0;
  double prefill_s = 0;      // synchronised 1-token generate: prefill + first sample
  double decode_s = 0;       // synchronised full generate minus the 1-token one
  double tokens_s = 0;       // batch x (new_tokens - 1) / decode_s
  double gen_tokens_s = 0;   // the Generator's timings.decode_tokens / decode_seconds
  double gen_prefill_s = 0;  // the Generator's timings.prefill_seconds
  double bound_w = 0;        // tokens/s: bandwidth / weight bytes x batch
  double bound_wkv = 0;      // tokens/s: bandwidth / (weights + KV cache at mean length) x batch
  PeakMemory memory;
};

DecodeRow measure_decode(const std::shared_ptr<models::CausalLM>& model, const Options& o,
                         const DeviceInfo& info, int64_t batch, bool greedy,
                         const std::string& engine) {
  const auto& c = model->config();
  const int64_t P = o.prompt_len, R = o.new_tokens;
  auto gen = at::detail::createCPUGenerator(static_cast<uint64_t>(batch));
  auto ids = torch::randint(c.vocab_size, {batch, P}, gen, torch::kInt64);
  rollout::SamplingParams params;
  params.temperature = greedy ? 0.0 : 1.0;  // temperature 1: no top-k / top-p
  params.seed = 1;
  const auto mask = torch::ones_like(ids);
  auto one = make_generator(model, batch, 1, engine);
  auto full = make_generator(model, batch, R, engine);
  // Warm-up at these shapes (kernels, cuBLAS heuristics, the graphs of every step shape), per
  // batch, sampling and engine.
  const auto warm = full.generate(ids, mask, params);
  one.generate(ids, mask, params);

  DecodeRow row;
  row.engine = engine;
  row.sampling = greedy ? "greedy" : "temperature 1";
  row.batch = batch;
  row.cuda_graphs = warm.timings.cuda_graphs;
  row.capture_s = warm.timings.graph_capture_seconds;
  row.graph_kernels = warm.timings.graph_kernels;
  reset_peak(o.device);
  row.prefill_s = timed(o.device, [&] { one.generate(ids, mask, params); });
  rollout::GenerationOutput out;
  const double total = timed(o.device, [&] { out = full.generate(ids, mask, params); });
  row.memory = read_peak(o.device);
  TORCH_CHECK(out.response_lengths.min().item<int64_t>() == R, "decode: a row stopped before ", R,
              " tokens");
  row.decode_s = total - row.prefill_s;
  row.tokens_s = static_cast<double>(batch * (R - 1)) / row.decode_s;
  row.gen_tokens_s = static_cast<double>(out.timings.decode_tokens) / out.timings.decode_seconds;
  row.gen_prefill_s = out.timings.prefill_seconds;

  const double weight_bytes = 2.0 * matmul_params(c);  // BF16, each read once per step
  // K and V of one position in every layer, BF16; a step attends to P + R/2 positions on average.
  const double kv_position = 2.0 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * 2.0;
  const double kv_bytes = static_cast<double>(batch) * (double(P) + double(R) / 2) * kv_position;
  row.bound_w = static_cast<double>(batch) * info.copy_bandwidth / weight_bytes;
  row.bound_wkv = static_cast<double>(batch) * info.copy_bandwidth / (weight_bytes + kv_bytes);
  return row;
}

void print_decode_header(const std::string& name, const models::ModelConfig& c, const Options& o) {
  std::printf(
      "\n== a. decode: %s (%.2f M params, %.3f GB BF16 weights read per step), prompt %ld, %ld "
      "new tokens, no stop token\n",
      name.c_str(), c.num_parameters() / 1e6, 2.0 * matmul_params(c) / 1e9,
      static_cast<long>(o.prompt_len), static_cast<long>(o.new_tokens));
  std::printf(
      "   tok/s = batch x (new - 1) / (generate(new) - generate(1)), both synchronised; gen "
      "tok/s = the Generator's own timings (unsynchronised: on cuda its decode clock also "
      "holds the tail of the prefill)\n"
      "   bound_w = bandwidth / weight bytes x batch (weights only, printed ratio); bound_kv "
      "adds the KV cache at mean length\n");
  std::printf("%-10s %6s %-13s %9s %9s %8s %10s %10s %10s %6s %10s %6s %10s %10s %9s %7s\n",
              "engine", "batch", "sampling", "prefill_s", "decode_s", "ms/step", "tok/s",
              "gen_tok/s", "bound_w", "ratio", "bound_kv", "ratio", "peak_alloc",
              o.device.is_cuda() ? "peak_resv" : "peak_rss", "graphs/s", "kernels");
}

void print_decode_row(const DecodeRow& r, const Options& o) {
  std::printf(
      "%-10s %6ld %-13s %9.3f %9.3f %8.2f %10.1f %10.1f %10.1f %6.3f %10.1f %6.3f %10s %10s "
      "%3ld/%.2fs %7ld\n",
      r.engine.c_str(), static_cast<long>(r.batch), r.sampling.c_str(), r.prefill_s, r.decode_s,
      1e3 * r.decode_s / double(o.new_tokens - 1), r.tokens_s, r.gen_tokens_s, r.bound_w,
      r.tokens_s / r.bound_w, r.bound_wkv, r.tokens_s / r.bound_wkv,
      gib(r.memory.allocated).c_str(),
      gib(r.memory.reserved >= 0 ? r.memory.reserved : r.memory.host_rss).c_str(),
      static_cast<long>(r.cuda_graphs), r.capture_s, static_cast<long>(r.graph_kernels));
  std::fflush(stdout);
}

json decode_json(const DecodeRow& r, const Options& o) {
  json j = {{"model", r.model},
            {"engine", r.engine},
            {"cuda_graphs", r.cuda_graphs},
            {"graph_capture_s", r.capture_s},
            {"graph_kernels", r.graph_kernels},
            {"batch", r.batch},
            {"sampling", r.sampling == "greedy" ? "greedy" : "sample"},
            {"prompt_len", o.prompt_len},
            {"new_tokens", o.new_tokens},
            {"prefill_s", r.prefill_s},
            {"decode_s", r.decode_s},
            {"decode_tokens_per_s", r.tokens_s},
            {"generator_decode_tokens_per_s", r.gen_tokens_s},
            {"generator_prefill_s", r.gen_prefill_s},
            {"bound_weights_tokens_per_s", r.bound_w},
            {"bound_weights_kv_tokens_per_s", r.bound_wkv}};
  j.update(to_json(r.memory));
  return j;
}

// --- b. Training step --------------------------------------------------------------------

// FLOPs per trained token at sequence length T. Model FLOPs: 6 x matmul parameters + 12 x L x
// (heads x head_dim) x T for QK^T and PV (forward + backward, the full T x T square, PaLM's
// convention; a causal kernel does about half). Hardware FLOPs add per-layer checkpointing's
// recompute, one more forward of every decoder layer: 2 x layer parameters + 4 x L x d x T.
struct TrainFlops {
  double model = 0, hardware = 0;
};

TrainFlops train_flops(const models::ModelConfig& c, int64_t T) {
  const double head = static_cast<double>(c.vocab_size * c.hidden_size);
  const double layers = matmul_params(c) - head;  // decoder layers and the final norm
  const double attention =
      12.0 * double(c.num_hidden_layers) * double(c.num_attention_heads * c.head_dim) * double(T);
  TrainFlops f;
  f.model = 6.0 * matmul_params(c) + attention;
  f.hardware = f.model + 2.0 * layers + attention / 3.0;
  return f;
}

struct TrainRow {
  std::string model;
  double step_s = 0;  // mean over the timed steps, synchronised
  double tokens_s = 0;
  double loss = 0;
  TrainFlops flops;
  PeakMemory memory;
  double engine_peak = 0;  // bytes the trainer accounts (model states, buffers)
};

// A fresh path for a FileStore, removed again when this goes out of scope.
struct TempStorePath {
  std::filesystem::path path;
  TempStorePath() {
    static int count = 0;
    path = std::filesystem::temp_directory_path() /
           ("bench_gpu_store_" + std::to_string(::getpid()) + "_" + std::to_string(count++));
    std::filesystem::remove(path);
  }
  ~TempStorePath() {
    std::error_code ignored;
    std::filesystem::remove(path, ignored);
  }
};

// A group of one rank: NCCL on cuda, Gloo on cpu.
std::unique_ptr<transport::CollectiveGroup> one_rank_group(torch::Device d,
                                                           const TempStorePath& store) {
  transport::CollectiveConfig config;
  config.backend =
      d.is_cuda() ? transport::CollectiveBackend::kNccl : transport::CollectiveBackend::kGloo;
  config.cuda_device = d.is_cuda() ? d.index() : 0;
  config.store_path = store.path.string();
  return transport::make_collective_group(config);
}

TrainRow measure_train(models::CausalLM& model, const Options& o) {
  const auto& c = model.config();
  model.train();
  model.set_checkpointing(models::Checkpointing::kPerLayer);
  const TempStorePath store;  // outlives the group
  auto group = one_rank_group(o.device, store);
  engine::TrainerConfig tc;
  tc.zero_stage = static_cast<engine::ZeroStage>(o.zero_stage);
  tc.compute_dtype = torch::kBFloat16;
  tc.device = o.device;
  tc.lr = 1e-5;
  tc.lr_scheduler = engine::LrScheduler::kConstant;
  tc.tied_embeddings = c.tie_word_embeddings;
  tc.total_steps = o.steps + 1;
  engine::Trainer trainer(tc, model, *group);

  auto gen = at::detail::createCPUGenerator(7);
  const auto tokens =
      torch::randint(c.vocab_size, {o.train_batch, o.train_seq}, gen, torch::kInt64).to(o.device);
  const auto mask = torch::ones_like(tokens);
  const engine::Trainer::LossFn nll = [&](int64_t) {
    auto hidden = model.forward(tokens, mask);
    return -model.next_token_log_probs(hidden, tokens).mean();
  };
  trainer.train_step(nll);  // warm-up: gradient buffers, kernels, NCCL communicator
  reset_peak(o.device);
  TrainRow row;
  double total = 0;
  engine::StepMetrics last;
  for (int64_t s = 0; s < o.steps; ++s)
    total += timed(o.device, [&] { last = trainer.train_step(nll); });
  row.memory = read_peak(o.device);
  row.step_s = total / double(o.steps);
  row.tokens_s = double(o.train_batch * o.train_seq) / row.step_s;
  row.loss = last.loss;
  row.flops = train_flops(c, o.train_seq);
  row.engine_peak = static_cast<double>(last.memory.peak);
  return row;
}

void print_train(const std::string& name, const models::ModelConfig& c, const TrainRow& r,
                 const Options& o, const DeviceInfo& info) {
  const double model_fps = r.tokens_s * r.flops.model, hw_fps = r.tokens_s * r.flops.hardware;
  std::printf(
      "\n== b. training step: %s (%.2f M params), batch %ld x seq %ld, BF16 compute + FP32 "
      "master/AdamW, ZeRO stage %d on 1 rank (%s), per-layer checkpointing, mean next-token "
      "NLL\n",
      name.c_str(), c.num_parameters() / 1e6, static_cast<long>(o.train_batch),
      static_cast<long>(o.train_seq), o.zero_stage, o.device.is_cuda() ? "NCCL" : "Gloo");
  std::printf("   step %.4f s (mean of %ld after 1 warm-up), %.0f tokens/s, loss %.3f\n", r.step_s,
              static_cast<long>(o.steps), r.tokens_s, r.loss);
  std::printf(
      "   model FLOPs/token = 6 x %.1f M matmul params + 12 x L x d x T (attention, full "
      "square) = %.3g; achieved %.1f TFLOP/s\n",
      matmul_params(c) / 1e6, r.flops.model, model_fps / 1e12);
  if (info.spec_flops > 0)
    std::printf("   MFU vs BF16 dense peak %.0f TFLOP/s (spec): %.3f\n", info.spec_flops / 1e12,
                model_fps / info.spec_flops);
  std::printf("   MFU vs measured BF16 GEMM %.0f TFLOP/s: %.3f\n", info.matmul_flops / 1e12,
              model_fps / info.matmul_flops);
  std::printf(
      "   hardware FLOPs/token (+ recompute: 8 x layer params + 6 x head + 16 x L x d x T) = "
      "%.3g; %.1f TFLOP/s = %.3f of %s\n",
      r.flops.hardware, hw_fps / 1e12,
      hw_fps / (info.spec_flops > 0 ? info.spec_flops : info.matmul_flops),
      info.spec_flops > 0 ? "spec peak" : "measured GEMM");
  std::printf(
      "   peak memory over the timed steps: allocated %s, reserved %s, host RSS %s; "
      "engine-accounted %s\n",
      gib(r.memory.allocated).c_str(), gib(r.memory.reserved).c_str(),
      gib(r.memory.host_rss).c_str(), gib(r.engine_peak).c_str());
  std::fflush(stdout);
}

json train_json(const TrainRow& r, const Options& o, const DeviceInfo& info) {
  const double model_fps = r.tokens_s * r.flops.model;
  json j = {
      {"model", r.model},
      {"batch", o.train_batch},
      {"seq", o.train_seq},
      {"zero_stage", o.zero_stage},
      {"checkpointing", "per_layer"},
      {"step_s", r.step_s},
      {"tokens_per_s", r.tokens_s},
      {"loss", r.loss},
      {"model_flops_per_token", r.flops.model},
      {"hardware_flops_per_token", r.flops.hardware},
      {"mfu_spec", info.spec_flops > 0 ? model_fps / info.spec_flops : -1.0},
      {"mfu_measured_gemm", model_fps / info.matmul_flops},
      {"hfu_spec", info.spec_flops > 0 ? r.tokens_s * r.flops.hardware / info.spec_flops : -1.0},
      {"engine_peak_bytes", r.engine_peak}};
  j.update(to_json(r.memory));
  return j;
}

// --- main --------------------------------------------------------------------------------

// Decode at every batch (greedy, then temperature 1), then one training measurement, on the
// same model object (built once: the FP32 host init of 1.5B parameters takes seconds).
void bench_model(const std::string& name, const Options& o, const DeviceInfo& info, json& out) {
  const auto config = bench_config(name);
  auto model = std::make_shared<models::CausalLM>(config);  // FP32 host, init_weights(0)
  model->to(o.device, torch::kBFloat16);
  if (o.decode) print_decode_header(name, config, o);
  for (int64_t batch : o.decode ? o.batches : std::vector<int64_t>{}) {
    for (bool greedy : {true, false}) {
      for (const auto& engine : o.engines) {
        auto row = measure_decode(model, o, info, batch, greedy, engine);
        row.model = name;
        print_decode_row(row, o);
        out["decode"].push_back(decode_json(row, o));
      }
    }
  }
  if (!o.train) return;
  auto row = measure_train(*model, o);
  row.model = name;
  print_train(name, config, row, o, info);
  out["train"].push_back(train_json(row, o, info));
}

int run(const Options& o) {
  if (o.device.is_cuda() && !torch::cuda::is_available()) {
    std::cerr << "bench_gpu: --device cuda asked, but torch sees no CUDA device (this machine "
                 "has no GPU or driver); use --device cpu for the smoke test\n";
    return 2;
  }
  for (const auto& name : o.models) bench_config(name);  // a bad name fails before measuring
  if (o.threads > 0) torch::set_num_threads(o.threads);
  const DeviceInfo info = device_info(o);
  std::printf("bench_gpu: device %s: %s (%s), torch %s, %d CPU threads\n", o.device.str().c_str(),
              info.name.c_str(), gib(info.memory_bytes).c_str(), TORCH_VERSION,
              torch::get_num_threads());
  std::printf("limits: copy_ bandwidth %.1f GB/s measured (read + write)",
              info.copy_bandwidth / 1e9);
  if (info.spec_bandwidth > 0) std::printf(", spec %.0f GB/s", info.spec_bandwidth / 1e9);
  std::printf("; BF16 GEMM %.1f TFLOP/s measured", info.matmul_flops / 1e12);
  if (info.spec_flops > 0)
    std::printf(", BF16 dense peak %.0f TFLOP/s (spec)", info.spec_flops / 1e12);
  std::printf("\n");
  json out = {{"framework", "rlhf"},
              {"device", o.device.str()},
              {"device_name", info.name},
              {"copy_bandwidth_bytes_per_s", info.copy_bandwidth},
              {"matmul_flops", info.matmul_flops},
              {"spec_flops", info.spec_flops},
              {"decode", json::array()},
              {"train", json::array()}};
  for (const auto& name : o.models) bench_model(name, o, info, out);
  if (!o.out.empty()) {
    std::ofstream file(o.out);
    file << out.dump(2) << "\n";
    if (!file) throw std::runtime_error("cannot write " + o.out);
    std::printf("\nwrote %s\n", o.out.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  try {
    options = parse_options(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "bench_gpu: " << e.what() << "\n";
    return 2;
  }
  try {
    return run(options);
  } catch (const std::exception& e) {
    std::cerr << "bench_gpu: error: " << e.what() << "\n";
    return 1;
  }
}
