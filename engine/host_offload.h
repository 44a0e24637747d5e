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
  // memory (pinned when the storage is on a CUDA device) and frees it on its device. Returns
  // the bytes moved. Throws RuntimeError when already offloaded.
  int64_t offload(const std::vector<torch::Tensor>& tensors);
  // Allocates each storage again on its device (its own allocator) and copies the bytes back;
  // the host copies are freed. Returns the bytes moved; 0 when nothing is offloaded.
  int64_t restore();
  bool offloaded() const { return !saved_.empty(); }
  int64_t bytes() const;  // bytes held on the host now

 private:
  struct Saved {
    c10::intrusive_ptr<c10::StorageImpl> storage;  // keeps the storage object alive
    torch::Tensor host;                            // [nbytes] uint8
    c10::Device device = c10::kCPU;
  };
  std::vector<Saved> saved_;
};

}  // namespace rlhf::engine
