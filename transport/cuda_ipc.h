// CUDA IPC for a colocated weight sync: the sender owns a device buffer (cudaMalloc, outside
// the caching allocator: cudaIpcGetMemHandle refuses the allocator's expandable segments)
// and exports its handle; a process on the same GPU maps it and copies out of it device to
// device. Handles only: how the handle's bytes and the "bucket ready" signals travel is the
// weight sync's business (the sync group). Compiled in every build; fails at run time
// (RuntimeError) where CUDA has no device.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <vector>

namespace rlhf::transport {

// A device buffer of `bytes` on the current CUDA device, exported for other processes.
class CudaIpcBuffer {
 public:
  explicit CudaIpcBuffer(int64_t bytes);  // throws RuntimeError naming the CUDA error
  ~CudaIpcBuffer();
  CudaIpcBuffer(const CudaIpcBuffer&) = delete;
  CudaIpcBuffer& operator=(const CudaIpcBuffer&) = delete;

  // The buffer as a [bytes / element size] tensor of `dtype` (a view: the buffer owns it).
  torch::Tensor as(torch::Dtype dtype) const;
  // cudaIpcMemHandle_t's bytes (64), to send to the receivers.
  std::vector<uint8_t> handle() const { return handle_; }
  int64_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  int64_t bytes_ = 0;
  std::vector<uint8_t> handle_;
};

// Another process's CudaIpcBuffer mapped into this one (on the current CUDA device, which
// must be the sender's GPU). Unmapped on destruction.
class CudaIpcMapping {
 public:
  // `handle`: CudaIpcBuffer::handle() of the sender. Throws RuntimeError naming the CUDA
  // error (another GPU, no device, a bad handle).
  CudaIpcMapping(const std::vector<uint8_t>& handle, int64_t bytes);
  ~CudaIpcMapping();
  CudaIpcMapping(const CudaIpcMapping&) = delete;
  CudaIpcMapping& operator=(const CudaIpcMapping&) = delete;

  torch::Tensor as(torch::Dtype dtype) const;  // as CudaIpcBuffer::as

 private:
  void* ptr_ = nullptr;
  int64_t bytes_ = 0;
};

// Bytes of cudaIpcMemHandle_t.
int64_t cuda_ipc_handle_bytes();

// Waits for the current device's work to finish (the bytes are in the buffer before the
// peer is told so, and copied out before the sender may reuse it). Throws on a CUDA error.
void cuda_synchronize();

}  // namespace rlhf::transport
