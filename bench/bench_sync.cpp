// Weight-sync benchmark: an actor -> rollout sync of a ~0.5B model (Qwen2.5-0.5B's shapes,
// random init, BF16 on the wire; --model 100m: the 100m preset bench_rollout generates with,
// --model tiny for a smoke run) between two processes (this program re-executed as the
// receiver), in seconds per GB and GB/s, beside the limit a copy of the same bytes on this
// machine reaches (memcpy on the host; a device-to-device copy on a GPU). The one weight-sync
// benchmark (bench_rollout's own sync figure, 100m over Gloo, folded in here).
//   --device cpu (default): Gloo over loopback TCP, at each --bucket-mb.
//   --device cuda: both processes on GPU 0 through CUDA IPC (the colocated path) and through
//   Gloo with CUDA tensors (staged through the host: the comparison); with two GPUs also
//   NCCL from GPU 0 to GPU 1 (NCCL refuses two ranks on one GPU).
// --lora R (issue 30.3): a LoRA actor (r R on every linear map, B drawn nonzero, a
// one-rank trainer in --dtype) instead, on the cpu: both rollout.lora_sync paths (merged
// weights; adapters merged on receipt by the receiver) with the sender's clock running until
// the receiver has applied the sync, and the generation time of one PPO step at the
// example's sizes (--gen-prompts x --gen-samples rows, --prompt-len, --gen-tokens; paged,
// rollout.kv_block_size 16) from the merged weights (either path) and, for comparison, from
// unmerged adapters (y = W x + s B A x: the alternative LoraMerge's comment weighs).
// Usage: bench_sync [--device cpu|cuda] [--model 0.5b|100m|tiny] [--bucket-mb 32,256]
//                   [--rounds N] [--paths cuda_ipc,gloo,nccl]
//        bench_sync --lora R [--model 100m] [--dtype fp32|bf16] [--rounds N] [--gen-prompts 16]
//                   [--gen-samples 8] [--prompt-len 64] [--gen-tokens 48]
#include <ATen/CPUGeneratorImpl.h>
#include <c10/cuda/CUDAFunctions.h>
#include <torch/cuda.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench/flags.h"
#include "bench/rank_processes.h"
#include "core/timing.h"
#include "engine/trainer.h"
#include "models/causal_lm.h"
#include "models/config.h"
#include "models/lora.h"
#include "rollout/generator.h"
#include "rollout/weight_sync.h"
#include "tests/support/collective.h"
#include "transport/collective_group.h"

using namespace rlhf;
using Clock = std::chrono::steady_clock;

namespace {

constexpr const char* kUsage =
    "usage: bench_sync [--device cpu|cuda] [--model 0.5b|100m|tiny] [--bucket-mb 32,256] "
    "[--rounds N] [--paths cuda_ipc,gloo,nccl] | --lora R [--model 100m] [--dtype fp32|bf16] "
    "[--rounds N] [--gen-prompts N] [--gen-samples N] [--prompt-len N] [--gen-tokens N]";

// Qwen2.5-0.5B's config.json shapes (as bench_gpu's "0.5b"), or the 100m or tiny preset.
models::ModelConfig bench_config(const std::string& name) {
  if (name == "tiny" || name == "100m") return models::preset_config(name);
  if (name != "0.5b") throw std::invalid_argument("--model: 0.5b, 100m or tiny, got " + name);
  models::ModelConfig c;
  c.model_type = "qwen2";
  c.architectures = {"Qwen2ForCausalLM"};
  c.vocab_size = 151936;
  c.tie_word_embeddings = true;
  c.qkv_bias = true;
  c.rope_theta = 1e6;
  c.rms_norm_eps = 1e-6;
  c.max_position_embeddings = 32768;
  c.bos_token_id = c.eos_token_id = c.pad_token_id = 151643;
  c.hidden_size = 896;
  c.num_hidden_layers = 24;
  c.num_attention_heads = 14;
  c.num_key_value_heads = 2;
  c.head_dim = 64;
  c.intermediate_size = 4864;
  c.validate("bench_sync model 0.5b");
  return c;
}

std::shared_ptr<models::CausalLM> bf16_model(const std::string& name, uint64_t seed,
                                             torch::Device device,
                                             torch::Dtype dtype = torch::kBFloat16) {
  auto model = std::make_shared<models::CausalLM>(bench_config(name));
  model->init_weights(seed);
  model->to(dtype);
  model->to(device);
  return model;
}

// Best of 5 copies of 256 MiB: payload bytes per second (a copy reads and writes each).
double copy_gbs(torch::Device device) {
  const int64_t bytes = int64_t{256} << 20;
  auto a = torch::ones({bytes}, torch::TensorOptions(torch::kUInt8).device(device));
  auto b = torch::zeros_like(a);
  double best = 1e30;
  for (int i = 0; i < 6; ++i) {
    if (device.is_cuda()) torch::cuda::synchronize();
    const auto t = Clock::now();
    if (device.is_cuda()) {
      b.copy_(a);
      torch::cuda::synchronize();
    } else {
      std::memcpy(b.data_ptr(), a.data_ptr(), static_cast<size_t>(bytes));
    }
    if (i > 0) best = std::min(best, seconds_since(t));  // the first warms up
  }
  return static_cast<double>(bytes) / best / 1e9;
}

struct Route {
  std::string path;     // rollout::SyncPath name
  std::string backend;  // the group's
  int sender_gpu = 0, receiver_gpu = 0;
};

std::unique_ptr<transport::CollectiveGroup> join(const std::string& store, int rank,
                                                 const std::string& backend, int gpu) {
  return test::join_group(store, rank, 2, std::chrono::seconds(600),
                          transport::collective_backend(backend), gpu);
}

// The receiver process: argv = --receiver STORE ROUNDS MODEL DEVICE BACKEND GPU.
int receiver(char** argv) {
  const std::string store = argv[2], model_name = argv[4], device = argv[5], backend = argv[6];
  const int rounds = std::stoi(argv[3]), gpu = std::stoi(argv[7]);
  torch::Device d(torch::kCPU);
  if (device == "cuda") {
    c10::cuda::set_device(static_cast<c10::DeviceIndex>(gpu));
    d = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(gpu));
  }
  auto model = bf16_model(model_name, 2, d);
  auto group = join(store, 1, backend, gpu);
  for (int i = 0; i < rounds; ++i) rollout::receive_weights(*model, *group);
  return 0;
}

struct Result {
  double seconds = 0;
  int64_t bytes = 0;
  int64_t buckets = 0;
};

// One route at one bucket size: the best of `rounds` syncs on the sender's clock.
Result run(const std::string& self, const std::string& model_name, const std::string& device,
           const Route& route, int64_t bucket_bytes, int rounds,
           const std::shared_ptr<models::CausalLM>& model) {
  const auto store =
      (std::filesystem::temp_directory_path() / ("bench_sync_" + std::to_string(getpid())))
          .string();
  std::filesystem::remove(store);
  const pid_t receiver =
      bench::start_process({self, "--receiver", store, std::to_string(rounds), model_name, device,
                            route.backend, std::to_string(route.receiver_gpu)});
  auto group = join(store, 0, route.backend, route.sender_gpu);
  rollout::ModelWeights source(*model);
  rollout::SyncOptions options;
  options.wire_dtype = torch::kBFloat16;
  options.bucket_bytes = bucket_bytes;
  options.path = rollout::parse_sync_path(route.path);
  options.device = model->device();
  Result best;
  best.seconds = 1e30;
  for (int i = 0; i < rounds; ++i) {
    auto stats = rollout::send_weights(source, group.get(), i + 1, options);
    if (stats.seconds < best.seconds) best = {stats.seconds, stats.bytes, stats.buckets};
  }
  bench::wait_process(receiver, "the receiver process (" + route.path + ")");
  std::filesystem::remove(store);
  return best;
}

// ---- --lora: the two rollout.lora_sync paths ----

torch::Dtype dtype_named(const std::string& name) {
  if (name == "fp32") return torch::kFloat32;
  if (name == "bf16") return torch::kBFloat16;
  throw std::invalid_argument("--dtype: fp32 or bf16, got " + name);
}

// The LoRA receiver: argv = --lora-receiver STORE ROUNDS MODEL DTYPE. The actor's base
// (seed 1) merges each sync through a LoraMerge, then meets the sender at a barrier (so the
// sender's clock covers the merge).
int lora_receiver(char** argv) {
  const std::string store = argv[2], model_name = argv[4];
  const int rounds = std::stoi(argv[3]);
  auto model = bf16_model(model_name, 1, torch::kCPU, dtype_named(argv[5]));
  auto group = join(store, 1, "gloo", 0);
  rollout::LoraMerge lora;
  for (int i = 0; i < rounds; ++i) {
    rollout::receive_weights(*model, *group, &lora);
    group->barrier();
  }
  return 0;
}

// r-rank adapters on every linear map of `model` (A seeded, B drawn nonzero, as after
// training): the same tensors every time.
models::LoraConfig add_adapters(models::CausalLM& model, int64_t rank) {
  models::LoraConfig lora;
  lora.rank = rank;
  lora.alpha = 2.0 * static_cast<double>(rank);
  models::apply_lora(model, lora, 5);
  torch::NoGradGuard no_grad;
  auto gen = at::detail::createCPUGenerator(6);
  for (auto& [name, linear] : model.decoder_linears()) linear->lora->B.normal_(0, 0.05, gen);
  return lora;
}

struct LoraActor {
  std::shared_ptr<models::CausalLM> model;  // the base (seed 1) with adapters
  std::unique_ptr<transport::CollectiveGroup> group;
  std::unique_ptr<engine::Trainer> trainer;
  double scale = 0;
};

// A one-rank trainer over the base with r-rank adapters on every linear map, B drawn
// nonzero (as after training), in `dtype`.
LoraActor lora_actor(const std::string& model_name, int64_t rank, torch::Dtype dtype) {
  LoraActor a;
  a.model = bf16_model(model_name, 1, torch::kCPU, torch::kFloat32);
  const models::LoraConfig lora = add_adapters(*a.model, rank);
  const auto store =
      (std::filesystem::temp_directory_path() / ("bench_sync_train_" + std::to_string(getpid())))
          .string();
  std::filesystem::remove(store);
  a.group = test::join_group(store, 0, 1, std::chrono::seconds(60));
  engine::TrainerConfig config;
  config.compute_dtype = dtype;
  a.trainer = std::make_unique<engine::Trainer>(config, *a.model, *a.group);
  a.scale = lora.scale();
  return a;
}

// One path: the best of `rounds` syncs, each until the receiver has applied it.
Result lora_sync(const std::string& self, const std::string& model_name, const std::string& dtype,
                 rollout::WeightSource& source, int rounds) {
  const auto store =
      (std::filesystem::temp_directory_path() / ("bench_sync_" + std::to_string(getpid())))
          .string();
  std::filesystem::remove(store);
  const pid_t receiver = bench::start_process(
      {self, "--lora-receiver", store, std::to_string(rounds), model_name, dtype});
  auto group = join(store, 0, "gloo", 0);
  rollout::SyncOptions options;
  options.wire_dtype = dtype_named(dtype);
  Result best;
  best.seconds = 1e30;
  for (int i = 0; i < rounds; ++i) {
    const auto t = Clock::now();
    auto stats = rollout::send_weights(source, group.get(), i + 1, options);
    group->barrier();
    const double seconds = seconds_since(t);
    if (seconds < best.seconds) best = {seconds, stats.bytes, stats.buckets};
  }
  bench::wait_process(receiver, "the LoRA receiver process");
  std::filesystem::remove(store);
  return best;
}

struct GenSizes {
  int64_t prompts = 16, samples = 8, prompt_len = 64, tokens = 48;
};

// One generate call over `sizes` (every row runs all tokens: no stop token), for `model`.
struct Generation {
  std::unique_ptr<rollout::Generator> generator;
  double best = 1e30;       // seconds, best call after the warm-up
  torch::Tensor log_probs;  // [N, R] of the last call
};

Generation make_generation(const std::shared_ptr<models::CausalLM>& model, const GenSizes& sizes) {
  rollout::GenerationConfig config;
  config.max_new_tokens = sizes.tokens;
  config.n_samples_per_prompt = sizes.samples;
  config.micro_batch_size = sizes.prompts;
  config.kv_block_size = 16;  // rollout.kv_block_size's default: paged
  Generation g;
  g.generator = std::make_unique<rollout::Generator>(model, config);
  return g;
}

// Runs each generation `calls` times, interleaved (so a busy machine's load falls on all
// alike), the first call of each a warm-up; same prompts and sampling streams for all.
void time_generations(std::vector<Generation*> gens, const GenSizes& sizes, int calls) {
  auto gen = at::detail::createCPUGenerator(7);
  const auto ids = torch::randint(256, {sizes.prompts, sizes.prompt_len}, gen, torch::kInt64);
  const auto mask = torch::ones_like(ids);
  rollout::SamplingParams params;
  params.temperature = 0.7;
  params.seed = 1;
  for (int i = 0; i < calls; ++i)
    for (Generation* g : gens) {
      const auto t = Clock::now();
      auto out = g->generator->generate(ids, mask, params);
      if (i > 0 || calls == 1) g->best = std::min(g->best, seconds_since(t));
      g->log_probs = out.log_probs;
    }
}

int lora_bench(const std::string& self, bench::Flags& flags) {
  const std::string model_name = flags.text("--model", "100m");
  const std::string dtype = flags.text("--dtype", "fp32");
  const int64_t rank = flags.integer("--lora", 16);
  const int rounds = static_cast<int>(flags.integer("--rounds", 3));
  GenSizes sizes;
  sizes.prompts = flags.integer("--gen-prompts", sizes.prompts);
  sizes.samples = flags.integer("--gen-samples", sizes.samples);
  sizes.prompt_len = flags.integer("--prompt-len", sizes.prompt_len);
  sizes.tokens = flags.integer("--gen-tokens", sizes.tokens);
  flags.check_all_known();
  torch::set_num_threads(1);
  const double limit = copy_gbs(torch::kCPU);
  LoraActor actor = lora_actor(model_name, rank, dtype_named(dtype));
  std::cout << "model " << model_name << ": " << actor.model->config().num_parameters() / 1e6
            << "M parameters, LoRA r " << rank << " on every linear map, " << dtype
            << " on the wire; memcpy " << std::fixed << std::setprecision(1) << limit
            << " GB/s of payload (the limit)\n"
            << std::setw(10) << "sync" << std::setw(12) << "MB_sent" << std::setw(10) << "seconds"
            << std::setw(14) << "wire_limit_s" << std::setw(10) << "vs_limit" << '\n';
  rollout::MergedLoraWeights merged(*actor.trainer, actor.scale);
  rollout::LoraAdapterWeights adapters(*actor.trainer, actor.scale);
  std::map<std::string, double> sync_s;
  for (auto& [name, source] : std::vector<std::pair<std::string, rollout::WeightSource*>>{
           {"merged", &merged}, {"adapters", &adapters}}) {
    const Result r = lora_sync(self, model_name, dtype, *source, rounds);
    const double wire_limit = static_cast<double>(r.bytes) / 1e9 / limit;
    sync_s[name] = r.seconds;
    std::cout << std::setw(10) << name << std::setprecision(2) << std::setw(12)
              << static_cast<double>(r.bytes) / 1e6 << std::setprecision(3) << std::setw(10)
              << r.seconds << std::setprecision(4) << std::setw(14) << wire_limit
              << std::setprecision(3) << std::setw(10) << wire_limit / r.seconds << '\n';
  }
  // Generation: the rollout's model with the merged weights (what both paths leave it), and
  // the same with the adapters unmerged.
  auto plain = bf16_model(model_name, 1, torch::kCPU, dtype_named(dtype));
  auto lora_model = bf16_model(model_name, 1, torch::kCPU, dtype_named(dtype));
  {
    add_adapters(*lora_model, rank);      // the actor's adapters
    models::merge_adapters(*lora_model);  // plain <- the merged weights
    torch::NoGradGuard no_grad;
    const auto merged_state = lora_model->state_tensors();
    const std::map<std::string, torch::Tensor> by_name(merged_state.begin(), merged_state.end());
    for (auto& [name, t] : plain->state_tensors()) t.copy_(by_name.at(name));
    models::unmerge_adapters(*lora_model);
  }
  Generation merged_gen = make_generation(plain, sizes);
  Generation unmerged_gen = make_generation(lora_model, sizes);
  time_generations({&merged_gen, &unmerged_gen}, sizes, 3);
  // That the unmerged forward ran the adapters: its sampled tokens' log-probs are the merged
  // model's up to rounding, and the base model's differ (same sampling streams).
  Generation base_gen =
      make_generation(bf16_model(model_name, 1, torch::kCPU, dtype_named(dtype)), sizes);
  time_generations({&base_gen}, sizes, 1);
  const auto diff = [&](const Generation& g) {
    return (g.log_probs - merged_gen.log_probs).abs().mean().item<double>();
  };
  const double merged_s = merged_gen.best, unmerged_s = unmerged_gen.best;
  std::cout << "generation of one step (" << sizes.prompts << " prompts x " << sizes.samples
            << " samples, prompt " << sizes.prompt_len << ", " << sizes.tokens
            << " new tokens; best of 2 after a warm-up, interleaved): merged weights "
            << std::setprecision(2) << merged_s << " s, unmerged adapters " << unmerged_s << " s (x"
            << std::setprecision(3) << unmerged_s / merged_s
            << "); mean |log-prob - merged's|: unmerged " << std::scientific << std::setprecision(1)
            << diff(unmerged_gen) << ", base model " << diff(base_gen) << std::fixed << "\n"
            << "per PPO step, sync + generation: merged " << std::setprecision(2)
            << sync_s["merged"] + merged_s << " s, adapters (merged on receipt) "
            << sync_s["adapters"] + merged_s << " s, adapters unmerged (alternative) "
            << sync_s["adapters"] + unmerged_s << " s (its sync would skip the merge)\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc == 8 && std::string(argv[1]) == "--receiver") {
      torch::set_num_threads(1);
      return receiver(argv);
    }
    if (argc == 6 && std::string(argv[1]) == "--lora-receiver") {
      torch::set_num_threads(1);
      return lora_receiver(argv);
    }
    std::cout << std::unitbuf;  // each line as it is made: a run cut short still shows them
    bench::Flags flags(argc, argv, kUsage);
    if (flags.integer("--lora", 0) > 0) return lora_bench(argv[0], flags);
    const std::string device = flags.text("--device", "cpu");
    const std::string model_name = flags.text("--model", "0.5b");
    const std::vector<std::string> bucket_mb = flags.list("--bucket-mb", {"32", "256"});
    const int rounds = static_cast<int>(flags.integer("--rounds", 3));
    const auto paths = flags.list("--paths", {"cuda_ipc", "gloo", "nccl"});
    flags.check_all_known();
    if (device != "cpu" && device != "cuda")
      throw std::invalid_argument("--device: cpu or cuda, got " + device);
    torch::set_num_threads(1);
    std::vector<Route> routes;
    const bool cuda = device == "cuda";
    if (cuda) {
      if (!torch::cuda::is_available()) throw std::runtime_error("--device cuda: no CUDA device");
      for (const auto& p : paths) {
        if (p == "cuda_ipc") routes.push_back({"cuda_ipc", "gloo", 0, 0});
        if (p == "gloo") routes.push_back({"gloo", "gloo", 0, 0});
        if (p == "nccl" && torch::cuda::device_count() >= 2)
          routes.push_back({"nccl", "nccl", 0, 1});
        if (p == "nccl" && torch::cuda::device_count() < 2)
          std::cout << "nccl: skipped (one GPU; NCCL refuses two ranks on one device)\n";
      }
    } else {
      routes.push_back({"gloo", "gloo", 0, 0});
    }
    const torch::Device d = cuda ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
    if (cuda) c10::cuda::set_device(0);
    auto model = bf16_model(model_name, 1, d);
    const double limit = copy_gbs(d);
    std::cout << "model " << model_name << ": " << model->config().num_parameters() / 1e6
              << "M parameters, BF16 on the wire; " << (cuda ? "device-to-device copy" : "memcpy")
              << " " << std::fixed << std::setprecision(1) << limit
              << " GB/s of payload (the limit; cuda_ipc copies each byte twice, into the bucket "
                 "and out of it)\n"
              << std::setw(10) << "path" << std::setw(11) << "bucket_MB" << std::setw(9)
              << "buckets" << std::setw(8) << "GB" << std::setw(10) << "seconds" << std::setw(8)
              << "s/GB" << std::setw(8) << "GB/s" << std::setw(10) << "vs_copy" << '\n';
    for (const auto& route : routes) {
      for (const auto& mb : bucket_mb) {
        const auto bytes = static_cast<int64_t>(std::stod(mb) * static_cast<double>(1 << 20));
        const Result r = run(argv[0], model_name, device, route, bytes, rounds, model);
        const double gb = static_cast<double>(r.bytes) / 1e9;
        std::cout << std::setw(10) << route.path << std::setw(11) << mb << std::setw(9) << r.buckets
                  << std::setprecision(3) << std::setw(8) << gb << std::setw(10) << r.seconds
                  << std::setw(8) << r.seconds / gb << std::setprecision(2) << std::setw(8)
                  << gb / r.seconds << std::setprecision(3) << std::setw(10)
                  << gb / r.seconds / limit << '\n';
      }
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "bench_sync: " << e.what() << '\n';
    return 1;
  }
}
