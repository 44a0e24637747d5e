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
// Usage: bench_sync [--device cpu|cuda] [--model 0.5b|100m|tiny] [--bucket-mb 32,256]
//                   [--rounds N] [--paths cuda_ipc,gloo,nccl]
#include <c10/cuda/CUDAFunctions.h>
#include <torch/cuda.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "bench/flags.h"
#include "bench/rank_processes.h"
#include "core/timing.h"
#include "models/causal_lm.h"
#include "models/config.h"
#include "rollout/weight_sync.h"
#include "tests/support/collective.h"
#include "transport/collective_group.h"

using namespace rlhf;
using Clock = std::chrono::steady_clock;

namespace {

constexpr const char* kUsage =
    "usage: bench_sync [--device cpu|cuda] [--model 0.5b|100m|tiny] [--bucket-mb 32,256] "
    "[--rounds N] [--paths cuda_ipc,gloo,nccl]";

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
                                             torch::Device device) {
  auto model = std::make_shared<models::CausalLM>(bench_config(name));
  model->init_weights(seed);
  model->to(torch::kBFloat16);
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

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc == 8 && std::string(argv[1]) == "--receiver") {
      torch::set_num_threads(1);
      return receiver(argv);
    }
    bench::Flags flags(argc, argv, kUsage);
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
