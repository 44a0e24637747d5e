// Test helper process for weight_sync_test: one rank of an actor -> rollout weight sync.
// Writes "version V", "buckets K", "bytes N" and one "name sum weighted_sum" line per tensor
// to OUT, for the test to compare between the actor and the rollout ranks.
// Usage: rlhf_weight_sync_worker [--bucket-bytes N] [--path gloo|cuda_ipc] [--device cpu|cuda]
//        MODE SYNC_STORE SYNC_RANK SYNC_SIZE OUT [TRAIN_STORE TRAIN_RANK TRAIN_SIZE]
//   --bucket-bytes: the sender's bucket size (default 256 MiB); --path: the sender's path;
//   --device: where the plain model (model-sender, receiver) lives (default cpu)
//   MODE model-sender:   a plain model (seed 1) is sync rank 0
//   MODE trainer-sender: a ZeRO-3 trainer over TRAIN_SIZE ranks takes one step, then syncs
//                        (its rank 0 is sync rank 0; SYNC_* are ignored on other ranks)
//   MODE receiver:       a rollout model (seed 2, FP32) receives
//   MODE receiver-mismatch: the same with a different MLP width (a layout mismatch)
//   --tp N: the rollout's tensor_parallel_size. The sender scatters slices and, as
//     trainer-sender, also writes each TP rank r's slice digests as "name@r"
//   MODE tp-receiver:    (--tp N) TP rank (SYNC_RANK - 1) % N of a tiny rollout (seed 2,
//                        FP32) whose TP group meets at SYNC_STORE.tp<engine>; receives
//   MODE lora-sender:    (--content merged|adapters) as trainer-sender with LoRA adapters
//                        (r 4, all-linear, B drawn nonzero) on the tiny model: two steps,
//                        each followed by a sync (v7, v8) of the merged weights or the adapters
//   MODE lora-receiver:  (--tp N optional) the actor's base (seed 1, BF16; TP rank
//                        (SYNC_RANK - 1) % N of it, group at SYNC_STORE.tp<engine>) receives
//                        both syncs through a LoraMerge; also writes "base:NAME" digests of
//                        its weights before them
//   MODE tp-logits:      (--model-dir DIR) TP rank SYNC_RANK of SYNC_SIZE (group at
//                        SYNC_STORE) loads its slices of DIR in FP32, writes their digests
//                        and "logit I V" lines: the logits of 3 x 7 tokens (seed 3)
#include <ATen/CPUGeneratorImpl.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <fstream>
#include <iomanip>
#include <iostream>
#include <memory>

#include "engine/trainer.h"
#include "models/causal_lm.h"
#include "models/config.h"
#include "models/lora.h"
#include "models/pretrained.h"
#include "models/tensor_parallel.h"
#include "rollout/weight_sync.h"
#include "tests/support/collective.h"

using namespace rlhf;

namespace {

constexpr int64_t kVersion = 7;

struct Flags {
  rollout::SyncOptions sync;
  torch::Device device = torch::kCPU;
  std::string model_dir;                                   // tp-logits
  rollout::LoraSync content = rollout::LoraSync::kMerged;  // lora-sender
};

std::unique_ptr<transport::CollectiveGroup> join(const std::string& store, int rank, int size) {
  return test::join_group(store, rank, size, std::chrono::seconds(60));
}

// Exact per-tensor digests: sums in FP64 of the values and of the values times (i mod 97 + 1).
void write_checksums(std::ofstream& out, rollout::NamedTensors tensors) {
  for (const auto& [name, t] : tensors) {
    auto v = t.detach().to(torch::kFloat64).reshape({-1});
    auto w = torch::arange(v.numel(), torch::TensorOptions(torch::kInt64).device(v.device()))
                 .remainder(97)
                 .add(1)
                 .to(torch::kFloat64);
    out << name << ' ' << std::setprecision(17) << v.sum().item<double>() << ' '
        << (v * w).sum().item<double>() << '\n';
  }
}

std::shared_ptr<models::CausalLM> tiny(uint64_t seed, int64_t intermediate_size = 0) {
  auto config = models::preset_config("tiny");
  if (intermediate_size > 0) config.intermediate_size = intermediate_size;
  auto model = std::make_shared<models::CausalLM>(config);
  model->init_weights(seed);
  return model;
}

void write_stats(std::ofstream& out, const rollout::WeightSyncStats& stats) {
  out << "version " << stats.version << "\nbuckets " << stats.buckets << "\nbytes " << stats.bytes
      << '\n';
}

// The TP shard (or the whole model at tp 1) of `whole`, in `whole`'s dtype, on the CPU;
// its TP group meets at STORE.tp<engine> as tp-receiver's.
std::shared_ptr<models::CausalLM> shard_of(const std::shared_ptr<models::CausalLM>& whole,
                                           const std::string& store, int sync_rank, int tp_size) {
  if (tp_size == 1) return whole;
  models::TensorParallel tp;
  tp.size = tp_size;
  tp.rank = (sync_rank - 1) % tp_size;
  tp.group = join(store + ".tp" + std::to_string((sync_rank - 1) / tp_size), tp.rank, tp_size);
  auto shard =
      std::make_shared<models::CausalLM>(whole->config(), models::Materialize::kDeferred, tp);
  models::load_whole(*shard, models::TensorsSource(whole->state_tensors()), whole->dtype(),
                     torch::kCPU);
  return shard;
}

int lora_receiver(const std::string& store, int sync_rank, int sync_size, std::ofstream& out,
                  const Flags& flags) {
  auto whole = tiny(1);
  whole->to(torch::kBFloat16);
  auto model = shard_of(whole, store, sync_rank, flags.sync.tensor_parallel_size);
  rollout::NamedTensors base;
  for (const auto& [name, t] : model->state_tensors()) base.emplace_back("base:" + name, t);
  write_checksums(out, base);
  auto group = join(store, sync_rank, sync_size);
  rollout::LoraMerge lora;
  rollout::WeightSyncStats stats;
  for (int i = 0; i < 2; ++i) stats = rollout::receive_weights(*model, *group, &lora);
  write_stats(out, stats);
  write_checksums(out, model->state_tensors());
  return 0;
}

int lora_sender(char** argv, const std::string& store, int sync_rank, int sync_size,
                std::ofstream& out, Flags flags) {
  const int train_rank = std::stoi(argv[7]), train_size = std::stoi(argv[8]);
  auto model = tiny(1);
  models::LoraConfig lora;
  lora.rank = 4;
  lora.alpha = 8;
  models::apply_lora(*model, lora, 5);
  {
    torch::NoGradGuard no_grad;  // B nonzero: the first sync already changes the weights
    auto gen = at::detail::createCPUGenerator(6);
    for (auto& [name, linear] : model->decoder_linears()) linear->lora->B.normal_(0.0, 0.05, gen);
  }
  auto train_group = join(argv[6], train_rank, train_size);
  engine::TrainerConfig config;
  config.zero_stage = engine::ZeroStage::kParameters;
  config.compute_dtype = torch::kBFloat16;
  config.lr = 1e-2;
  config.lr_scheduler = engine::LrScheduler::kConstant;
  engine::Trainer trainer(config, *model, *train_group);
  std::unique_ptr<transport::CollectiveGroup> sync;
  if (train_rank == 0) sync = join(store, sync_rank, sync_size);
  rollout::MergedLoraWeights merged(trainer, lora.scale());
  rollout::LoraAdapterWeights adapters(trainer, lora.scale());
  rollout::WeightSource& source = flags.content == rollout::LoraSync::kAdapters
                                      ? static_cast<rollout::WeightSource&>(adapters)
                                      : merged;
  flags.sync.wire_dtype = torch::kBFloat16;
  rollout::WeightSyncStats stats;
  for (int i = 0; i < 2; ++i) {
    auto ids = torch::arange(1, 13, torch::kInt64).view({2, 6}) * (train_rank + 3 + i);
    trainer.train_step([&](int64_t) {
      auto hidden = model->forward(ids, torch::ones_like(ids));
      return -model->next_token_log_probs(hidden, ids).mean();
    });
    stats = rollout::send_weights(source, sync.get(), kVersion + i, flags.sync);
  }
  write_stats(out, stats);
  return 0;
}

int run(int argc, char** argv, Flags flags) {
  const std::string mode = argv[1], sync_store = argv[2];
  const int sync_rank = std::stoi(argv[3]), sync_size = std::stoi(argv[4]);
  std::ofstream out(argv[5]);
  if (mode == "receiver" || mode == "receiver-mismatch") {
    auto model = tiny(2, mode == "receiver-mismatch" ? 128 : 0);
    model->to(flags.device);
    auto group = join(sync_store, sync_rank, sync_size);
    auto stats = rollout::receive_weights(*model, *group);
    write_stats(out, stats);
    write_checksums(out, model->state_tensors());
    return 0;
  }
  if (mode == "lora-receiver") return lora_receiver(sync_store, sync_rank, sync_size, out, flags);
  if (mode == "lora-sender" && argc == 9)
    return lora_sender(argv, sync_store, sync_rank, sync_size, out, flags);
  if (mode == "tp-receiver") {
    const int tp_size = flags.sync.tensor_parallel_size;
    models::TensorParallel tp;
    tp.size = tp_size;
    tp.rank = (sync_rank - 1) % tp_size;
    tp.group =
        join(sync_store + ".tp" + std::to_string((sync_rank - 1) / tp_size), tp.rank, tp_size);
    auto whole = tiny(2);
    models::CausalLM shard(whole->config(), models::Materialize::kDeferred, tp);
    models::load_whole(shard, models::TensorsSource(whole->state_tensors()), torch::kFloat32,
                       torch::kCPU);
    auto group = join(sync_store, sync_rank, sync_size);
    auto stats = rollout::receive_weights(shard, *group);
    write_stats(out, stats);
    write_checksums(out, shard.state_tensors());
    return 0;
  }
  if (mode == "tp-logits") {
    models::TensorParallel tp;
    tp.size = sync_size;
    tp.rank = sync_rank;
    tp.group = join(sync_store, sync_rank, sync_size);
    models::LoadOptions load;
    load.dtype = torch::kFloat32;
    auto shard = models::load_pretrained(flags.model_dir, load, tp);
    write_checksums(out, shard->state_tensors());
    auto gen = at::detail::createCPUGenerator(3);
    const auto ids = torch::randint(shard->config().vocab_size, {3, 7}, gen, torch::kInt64);
    torch::NoGradGuard no_grad;
    const auto logits = shard->logits(shard->forward(ids, {})).reshape({-1});
    out << std::setprecision(9);
    for (int64_t i = 0; i < logits.numel(); ++i)
      out << "logit " << i << ' ' << logits[i].item<float>() << '\n';
    return 0;
  }
  if (mode == "model-sender") {
    auto model = tiny(1);
    model->to(flags.device);
    auto group = join(sync_store, sync_rank, sync_size);
    rollout::ModelWeights source(*model);
    flags.sync.wire_dtype = torch::kFloat32;
    flags.sync.device = flags.device;
    auto stats = rollout::send_weights(source, group.get(), kVersion, flags.sync);
    write_stats(out, stats);
    write_checksums(out, model->state_tensors());
    return 0;
  }
  if (mode == "trainer-sender" && argc == 9) {
    const int train_rank = std::stoi(argv[7]), train_size = std::stoi(argv[8]);
    auto model = tiny(1);
    auto train_group = join(argv[6], train_rank, train_size);
    engine::TrainerConfig config;
    config.zero_stage = engine::ZeroStage::kParameters;
    config.compute_dtype = torch::kBFloat16;
    config.lr = 1e-2;  // large enough that one step moves BF16 weights
    config.lr_scheduler = engine::LrScheduler::kConstant;
    engine::Trainer trainer(config, *model, *train_group);
    auto ids = torch::arange(1, 13, torch::kInt64).view({2, 6}) * (train_rank + 3);
    trainer.train_step([&](int64_t) {
      auto hidden = model->forward(ids, torch::ones_like(ids));
      return -model->next_token_log_probs(hidden, ids).mean();
    });
    std::unique_ptr<transport::CollectiveGroup> sync;
    if (train_rank == 0) sync = join(sync_store, sync_rank, sync_size);
    rollout::TrainerWeights source(trainer);
    flags.sync.wire_dtype = torch::kBFloat16;
    auto stats = rollout::send_weights(source, sync.get(), kVersion, flags.sync);
    write_stats(out, stats);
    // What the actor holds now, one gathered unit at a time (collective on both ranks).
    const auto units = static_cast<int64_t>(source.layout().size());
    const int tp = flags.sync.tensor_parallel_size;
    for (int64_t u = 0; u < units; ++u) {
      auto tensors = source.acquire(u);
      write_checksums(out, tensors);
      for (int r = 0; tp > 1 && r < tp; ++r) {  // what TP rank r must hold
        rollout::NamedTensors slices;
        for (const auto& [name, t] : tensors)
          slices.emplace_back(name + "@" + std::to_string(r),
                              models::tensor_parallel_slice(name, t, r, tp));
        write_checksums(out, slices);
      }
      source.release(u);
    }
    return 0;
  }
  throw std::invalid_argument("unknown mode " + mode);
}

}  // namespace

int main(int argc, char** argv) {
  // `probe-cuda`: exit 0 when torch sees a GPU (the test asks a child, so that the test
  // process never loads the CUDA driver).
  if (argc == 2 && std::string(argv[1]) == "probe-cuda") return torch::cuda::is_available() ? 0 : 1;
  Flags flags;
  try {
    // Leading flags, then the positional arguments (argv[0] is kept in front of them).
    while (argc > 2 && std::string(argv[1]).rfind("--", 0) == 0) {
      const std::string flag = argv[1], value = argv[2];
      if (flag == "--bucket-bytes")
        flags.sync.bucket_bytes = std::stoll(value);
      else if (flag == "--path")
        flags.sync.path = rollout::parse_sync_path(value);
      else if (flag == "--device")
        flags.device = torch::Device(value);
      else if (flag == "--tp")
        flags.sync.tensor_parallel_size = std::stoi(value);
      else if (flag == "--content")
        flags.content = rollout::parse_lora_sync(value);
      else if (flag == "--model-dir")
        flags.model_dir = value;
      else
        throw std::invalid_argument("unknown flag " + flag);
      argv[2] = argv[0];
      argv += 2;
      argc -= 2;
    }
  } catch (const std::exception& e) {
    std::cerr << "weight sync worker: " << e.what() << '\n';
    return 2;
  }
  if (argc != 6 && argc != 9) {
    std::cerr << "usage: rlhf_weight_sync_worker [--bucket-bytes N] [--path P] [--device D] MODE "
                 "SYNC_STORE SYNC_RANK SYNC_SIZE OUT [TRAIN_STORE TRAIN_RANK TRAIN_SIZE]\n";
    return 2;
  }
  try {
    torch::set_num_threads(1);
    return run(argc, argv, flags);
  } catch (const std::exception& e) {
    std::cerr << "weight sync worker: " << e.what() << '\n';
    return 1;
  }
}
