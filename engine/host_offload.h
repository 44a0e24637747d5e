// Moves the memory under a set of tensors to host memory and back (vLLM's sleep mode, level
// 1, for a rollout's weights; an actor's optimizer state while the rollout generates). What
// moves is each distinct storage's bytes, so every tensor object stays as it is: shapes,
// strides, views and aliases (tied embeddings) survive, and the round trip is bit-exact.
// While offloaded the tensors must not be read: their storages are empty. It does not decide
// when to offload (the worker's operations and the driver do).
#pragma once

#include <c10/core/StorageImpl.h>
#include <torch/types.h>

#include <cstdint>
#include <vector>

namespace rlhf::engine {

class HostOffload {
 public:
  // Copies each distinct storage under `tensors` (undefined and empty ones skipped) into host
  // memory (pinned when a storage is on a CUDA device) and frees it on its device. Returns
  // the bytes moved. Throws RuntimeError when already offloaded, or when pinning fails.
  // The host copies are slices of one arena of exactly their bytes (each rounded up to 256),
  // pinned with cudaHostAlloc outside torch's caching host allocator, which rounds every
  // block up to a power of two (up to twice the bytes moved) and keeps freed blocks pinned;
  // the arena is kept for the next offload, so a step's sleep does not pin memory again.
  int64_t offload(const std::vector<torch::Tensor>& tensors);
  // Allocates each storage again on its device (its own allocator) and copies the bytes back;
  // the arena stays for the next offload. Returns the bytes moved; 0 when nothing is offloaded.
  int64_t restore();
  bool offloaded() const { return !saved_.empty(); }
  int64_t bytes() const;  // bytes held on the host now
  int64_t arena_bytes() const { return arena_.defined() ? arena_.numel() : 0; }

 private:
  struct Saved {
    c10::intrusive_ptr<c10::StorageImpl> storage;  // keeps the storage object alive
    torch::Tensor host;                            // [nbytes] uint8
    c10::Device device = c10::kCPU;
  };
  std::vector<Saved> saved_;
  torch::Tensor arena_;  // [bytes] uint8 host memory the copies are slices of (pinned on CUDA)
  bool arena_pinned_ = false;
};

}  // namespace rlhf::engine
