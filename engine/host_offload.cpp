// Storage-level offload to host memory and back. See host_offload.h.
#include "engine/host_offload.h"

#include <ATen/ATen.h>
#include <c10/core/Allocator.h>
#include <cuda_runtime_api.h>

#include <unordered_set>

#include "core/errors.h"

namespace rlhf::engine {
namespace {

// The storage's bytes as a [nbytes] uint8 tensor (no copy).
torch::Tensor bytes_of(const c10::Storage& storage, int64_t nbytes) {
  return torch::empty({0}, torch::TensorOptions(torch::kUInt8).device(storage.device()))
      .set_(storage, 0, {nbytes}, {1});
}

constexpr int64_t kAlign = 256;  // each copy starts on a 256-byte boundary of the arena

int64_t aligned(int64_t bytes) {
  return (bytes + kAlign - 1) / kAlign * kAlign;
}

// [nbytes] uint8 host memory: pinned with cudaHostAlloc (exactly nbytes, freed with the
// tensor) when `pinned`, else pageable.
torch::Tensor host_bytes(int64_t nbytes, bool pinned) {
  if (!pinned) return torch::empty({nbytes}, torch::kUInt8);
  void* ptr = nullptr;
  const cudaError_t error = cudaHostAlloc(&ptr, static_cast<size_t>(nbytes), cudaHostAllocDefault);
  if (error != cudaSuccess) {
    (void)cudaGetLastError();
    throw RuntimeError("HostOffload: pinning " + std::to_string(nbytes) +
                       " bytes of host memory failed: " + cudaGetErrorString(error));
  }
  return torch::from_blob(
      ptr, {nbytes}, [](void* p) { (void)cudaFreeHost(p); }, torch::TensorOptions(torch::kUInt8));
}

}  // namespace

int64_t HostOffload::offload(const std::vector<torch::Tensor>& tensors) {
  if (offloaded()) throw RuntimeError("HostOffload: already offloaded; restore() first");
  std::unordered_set<const c10::StorageImpl*> seen;
  std::vector<std::pair<c10::StorageImpl*, int64_t>> storages;  // distinct, with their bytes
  int64_t arena = 0;
  bool cuda = false;
  for (const auto& t : tensors) {
    if (!t.defined() || !t.has_storage()) continue;
    c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
    const auto nbytes = static_cast<int64_t>(impl->nbytes());
    if (nbytes == 0 || !seen.insert(impl).second) continue;
    storages.emplace_back(impl, nbytes);
    arena += aligned(nbytes);
    cuda = cuda || impl->device().is_cuda();
  }
  if (arena_bytes() < arena || arena_pinned_ != cuda) {
    arena_ = torch::Tensor();  // the old arena first
    arena_ = host_bytes(arena, cuda);
    arena_pinned_ = cuda;
  }
  int64_t moved = 0, offset = 0;
  for (const auto& [impl, nbytes] : storages) {
    Saved s;
    s.storage = c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(impl);
    s.device = impl->device();
    s.host = arena_.narrow(0, offset, nbytes);
    offset += aligned(nbytes);
    // Blocking: the bytes are here before the free.
    s.host.copy_(bytes_of(c10::Storage(s.storage), nbytes));
    moved += nbytes;
    saved_.push_back(std::move(s));
  }
  // Only now, with every copy done: free each storage's device memory.
  for (auto& s : saved_) {
    s.storage->set_data_ptr_noswap(c10::DataPtr(nullptr, s.device));
    s.storage->set_nbytes(0);
  }
  return moved;
}

int64_t HostOffload::restore() {
  int64_t moved = 0;
  for (auto& s : saved_) {
    const int64_t nbytes = s.host.numel();
    c10::Allocator* allocator = s.storage->allocator();
    if (!allocator) allocator = c10::GetAllocator(s.device.type());
    s.storage->set_data_ptr_noswap(allocator->allocate(static_cast<size_t>(nbytes)));
    s.storage->set_nbytes(static_cast<size_t>(nbytes));
    bytes_of(c10::Storage(s.storage), nbytes).copy_(s.host);
    moved += nbytes;
  }
  saved_.clear();  // the arena stays for the next offload
  return moved;
}

int64_t HostOffload::bytes() const {
  int64_t total = 0;
  for (const auto& s : saved_) total += s.host.numel();
  return total;
}

}  // namespace rlhf::engine
