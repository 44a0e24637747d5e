// The worker's device: a worker on a cuda node sees exactly its GPU (CUDA_VISIBLE_DEVICES),
// binds to it as cuda:0, caps the CUDA caching allocator at the node's memory_gb, and keeps
// the allocator's peak allocated and reserved bytes per operation (phase) for the metrics.
// A CUDA out-of-memory error becomes a report naming role, rank, device, phase, the
// allocator's bytes and what to change. CPU workers: cpu, and no device statistics.
#pragma once

#include <torch/types.h>

#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

#include "actors/operation_registry.h"

namespace rlhf {

// cuda:0 for a worker whose RLHF_DEVICE is "cuda:N", cpu otherwise.
torch::Device worker_device(const WorkerIdentity& self);
bool on_cuda(const WorkerIdentity& self);

// Once, at worker start: binds the GPU, checks it is there (RuntimeError naming the device
// and CUDA_VISIBLE_DEVICES when not) and caps the allocator at RLHF_DEVICE_MEMORY_GB when
// that is below the GPU's memory. No-op on cpu.
void bind_worker_device(const WorkerIdentity& self);

// Why `dtype` (a role's "<role>.dtype" value) cannot run on this worker's GPU, named
// `gpu_name` with compute capability major.minor: BF16 needs 8.0 (Ampere) or newer; "" when it
// can (every other dtype, every CPU worker).
std::string dtype_refusal(const WorkerIdentity& self, const std::string& dtype,
                          const std::string& gpu_name, int major, int minor);
// Throws InputError with dtype_refusal's message on a cuda worker whose GPU cannot run `dtype`
// (before a model is built, instead of cuBLAS refusing a BF16 GEMM mid-step).
void check_dtype_on_device(const WorkerIdentity& self, const std::string& dtype);

// The CUDA caching allocator's bytes on the current device now, the GPU's free and total
// memory, and the cap RLHF_DEVICE_MEMORY_GB sets (when below the total).
struct CudaMemory {
  int64_t allocated = 0;       // in tensors now
  int64_t reserved = 0;        // held by the allocator now (allocated + cached)
  int64_t peak_allocated = 0;  // since the last reset
  int64_t peak_reserved = 0;
  int64_t free = 0;   // cudaMemGetInfo: free on the GPU (all processes)
  int64_t total = 0;  // the GPU's memory
  int64_t limit = 0;  // the allocator's cap (0: none)
};
CudaMemory cuda_memory();

// Peak allocator bytes per operation name (phase), and over the worker's life. Operations
// run one at a time on the worker's operation thread, which calls begin/end around each.
class DeviceMemoryLog {
 public:
  void begin(const std::string& op);  // resets the allocator's peak counters
  void end(const std::string& op);    // folds the peaks into the op's and the overall
  // {"peak_allocated_bytes", "peak_reserved_bytes", "phases": {op: {...}}, "limit_bytes",
  // "total_bytes"}; null on cpu.
  nlohmann::json to_json() const;
  void enable() { enabled_ = true; }

 private:
  struct Peak {
    int64_t allocated = 0;
    int64_t reserved = 0;
  };
  mutable std::mutex mutex_;
  bool enabled_ = false;
  Peak overall_;
  std::map<std::string, Peak> phases_;
};
DeviceMemoryLog& device_memory_log();  // the process's

// Releases the allocator's cached blocks (between phases, when that lowers a colocated
// peer's peak). No-op on cpu.
void release_cached_device_memory(const WorkerIdentity& self);

// One line for a CUDA out-of-memory error in `op`: role, rank, device (and physical GPU),
// phase, allocated/reserved/free/total bytes, the plan's figure for the role when the run
// directory has one, and the keys that lower this phase's memory.
std::string out_of_memory_report(const WorkerIdentity& self, const std::string& op,
                                 const std::string& run_dir, const std::string& what);

}  // namespace rlhf
