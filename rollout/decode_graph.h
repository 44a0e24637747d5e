// Decode steps of paged generation at fixed shapes, replayed as CUDA graphs. A decode step
// of a model with L layers launches ~25 L kernels; for a batch of a few hundred rows the
// GPU finishes each long before the host has launched the next, so launching, not the
// GPU, bounds decode speed (measured: 12-16 ms per step for 24-28 layers, where reading the
// weights takes 0.3-1 ms). A CUDA graph launches the whole step at once.
//
// A graph replays fixed shapes and fixed addresses, so the running sequences are padded to
// a batch bucket (1, 2, 4, 8, 12, 16, 24, 32, 48, ...: the next power of two or 1.5x one)
// and their block tables to a power of two of blocks; one graph per bucket pair is
// captured on first use and replayed for every later step of that shape (vLLM captures
// per batch size the same way). Padding rows write and read the cache's scratch block.
// Each step's inputs (slots, positions, block tables) go to the device in one non-blocking
// copy from pinned memory, so the host still never waits for a decode step.
//
// On the CPU, or with capture off, the same padded steps run eagerly: that is how the CPU
// tests check the padding against unpadded steps. Does not schedule sequences or sample
// (paged_generation.cpp does).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "models/causal_lm.h"
#include "models/paged_kv_cache.h"

namespace rlhf::rollout {

// While alive, the calling thread's current CUDA stream is the process's decode stream for
// `device` (one per device), which first waits for the work already queued on the stream it
// replaces; on destruction that stream waits for the decode stream. Paged generation with
// CUDA graphs runs under it: a graph must be captured on a stream other than the default
// one, and cuBLAS keeps a workspace (32 MiB) for every stream that runs a matmul, so
// capturing on fresh pool streams grew the rollout by 32 MiB per stream (measured: 1 GiB
// after 32 generate calls). No-op on the CPU.
class DecodeStream {
 public:
  explicit DecodeStream(torch::Device device);
  ~DecodeStream();
  DecodeStream(const DecodeStream&) = delete;
  DecodeStream& operator=(const DecodeStream&) = delete;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class PagedDecoder {
 public:
  // Steps of up to max_batch sequences of up to max_blocks blocks each. capture: CUDA graphs
  // (the model must be on a CUDA device); else padded steps run eagerly.
  PagedDecoder(models::CausalLM& model, models::PagedKvCache& cache, int64_t max_batch,
               int64_t max_blocks, bool capture);
  ~PagedDecoder();
  PagedDecoder(const PagedDecoder&) = delete;
  PagedDecoder& operator=(const PagedDecoder&) = delete;

  // Captures on the current stream (under DecodeStream), which must not be the default one.
  // One decode step of `seqs` (each with one position reserved), fed next [C] int64 on the
  // model's device. `extra` (host int64 values) travels to the device in the same copy and
  // comes back in *extra_out. Returns logits [C, V]. The cache marks the step filled.
  torch::Tensor step(const std::vector<int64_t>& seqs, const torch::Tensor& next,
                     const std::vector<int64_t>& extra, torch::Tensor* extra_out);

  // The padded shape a step of `rows` sequences needing `blocks` blocks runs at.
  int64_t batch_bucket(int64_t rows) const;
  int64_t block_bucket(int64_t blocks) const;

  int64_t graphs() const { return static_cast<int64_t>(shapes_.size()); }  // shapes used
  // Kernels in the largest captured step's graph (the forward and the LM head): the step's
  // launch count. 0 before any capture.
  int64_t kernels_per_step() const;
  double capture_seconds() const { return capture_seconds_; }

 private:
  struct Shape;
  Shape& shape(int64_t batch, int64_t blocks);
  void capture(Shape& s);

  models::CausalLM& model_;
  models::PagedKvCache& cache_;
  int64_t max_batch_;
  int64_t max_blocks_;
  bool capture_;
  torch::Device device_;
  std::map<std::pair<int64_t, int64_t>, std::unique_ptr<Shape>> shapes_;
  // [max_batch, 1, V] in the model's compute dtype: every captured shape's logits are its
  // first rows (allocated at the first capture, outside the graphs' pool).
  torch::Tensor logits_;
  std::pair<unsigned long long, unsigned long long> pool_{
      0, 0};  // the graphs' shared memory pool (CUDA)
  double capture_seconds_ = 0.0;
};

}  // namespace rlhf::rollout
