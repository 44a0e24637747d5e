// CUDA IPC buffers and mappings. See cuda_ipc.h.
#include "transport/cuda_ipc.h"

#include <ATen/ATen.h>
#include <cuda_runtime_api.h>

#include <cstring>
#include <iostream>
#include <string>

#include "core/errors.h"

namespace rlhf::transport {
namespace {

void check(cudaError_t status, const std::string& what) {
  if (status != cudaSuccess)
    throw RuntimeError(what + ": " + cudaGetErrorName(status) + " (" + cudaGetErrorString(status) +
                       ")");
}

int current_device() {
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  return device;
}

torch::Tensor view_of(void* ptr, int64_t bytes, torch::Dtype dtype) {
  const int64_t size = static_cast<int64_t>(c10::elementSize(dtype));
  return torch::from_blob(ptr, {bytes / size},
                          torch::TensorOptions(dtype).device(torch::kCUDA, current_device()));
}

}  // namespace

int64_t cuda_ipc_handle_bytes() {
  return static_cast<int64_t>(sizeof(cudaIpcMemHandle_t));
}

CudaIpcBuffer::CudaIpcBuffer(int64_t bytes) : bytes_(bytes) {
  check(cudaMalloc(&ptr_, static_cast<size_t>(bytes)),
        "cudaMalloc of a " + std::to_string(bytes) + "-byte weight-sync bucket");
  cudaIpcMemHandle_t handle;
  const cudaError_t status = cudaIpcGetMemHandle(&handle, ptr_);
  if (status != cudaSuccess) {
    cudaFree(ptr_);
    check(status, "cudaIpcGetMemHandle");
  }
  handle_.resize(sizeof(handle));
  std::memcpy(handle_.data(), &handle, sizeof(handle));
}

CudaIpcBuffer::~CudaIpcBuffer() {
  if (ptr_ && cudaFree(ptr_) != cudaSuccess)
    std::cerr << "warning: cudaFree of the weight-sync bucket failed\n";
}

torch::Tensor CudaIpcBuffer::as(torch::Dtype dtype) const {
  return view_of(ptr_, bytes_, dtype);
}

CudaIpcMapping::CudaIpcMapping(const std::vector<uint8_t>& handle, int64_t bytes) : bytes_(bytes) {
  cudaIpcMemHandle_t h;
  if (handle.size() != sizeof(h))
    throw RuntimeError("CUDA IPC handle of " + std::to_string(handle.size()) + " bytes, expected " +
                       std::to_string(sizeof(h)));
  std::memcpy(&h, handle.data(), sizeof(h));
  check(cudaIpcOpenMemHandle(&ptr_, h, cudaIpcMemLazyEnablePeerAccess),
        "cudaIpcOpenMemHandle (is the sender on this process's GPU?)");
}

CudaIpcMapping::~CudaIpcMapping() {
  if (ptr_ && cudaIpcCloseMemHandle(ptr_) != cudaSuccess)
    std::cerr << "warning: cudaIpcCloseMemHandle of the weight-sync bucket failed\n";
}

torch::Tensor CudaIpcMapping::as(torch::Dtype dtype) const {
  return view_of(ptr_, bytes_, dtype);
}

void cuda_synchronize() {
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

}  // namespace rlhf::transport
