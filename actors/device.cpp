// Worker device binding, allocator statistics per phase, out-of-memory reports. See device.h.
#include "actors/device.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>
#include <torch/cuda.h>

#include <cstdlib>
#include <iomanip>
#include <sstream>

#include "core/errors.h"
#include "core/placement.h"
#include "engine/memory_check.h"

namespace rlhf {
namespace {

namespace alloc = c10::cuda::CUDACachingAllocator;

std::string gib(int64_t bytes) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(2) << static_cast<double>(bytes) / (1ull << 30) << " GiB";
  return out.str();
}

// What lowers the memory of each phase, by operation name (OpenRLHF users' keys).
std::string advice(const std::string& role, const std::string& op) {
  if (op == "generate" || op == "load_model")
    return "lower rollout.micro_batch_size, rollout.n_samples_per_prompt or "
           "rollout.max_new_tokens, or give rollout more devices";
  if (op.rfind("train", 0) == 0)
    return "lower train.micro_batch_size, or set " + role + ".zero_stage 3, " + role +
           ".adam_offload true, " + role + ".gradient_checkpointing true, or give " + role +
           " more devices";
  if (op == "init")
    return "the model does not fit this device: set " + role + ".zero_stage 3 or " + role +
           ".adam_offload true, or give " + role + " more devices";
  if (op == "push_weights" || op == "sync_weights")
    return "weight sync holds one layer and one bucket beyond the model: lower "
           "rollout.sync_bucket_mb, free memory on the actor and rollout devices (lower "
           "rollout.micro_batch_size) or give them more devices";
  if (op == "wake_up" || op == "restore_optimizer")
    return "the colocated roles do not fit the GPU together between phases: set " + role +
           ".zero_stage 3 or actor.adam_offload true, or give the rollout its own devices";
  return "lower rollout.micro_batch_size (scoring runs one rollout micro batch at a time) or "
         "train.micro_batch_size";
}

// The allocator's counters only (no driver call: this runs around every operation).
CudaMemory allocator_bytes() {
  CudaMemory m;
  const auto stats = alloc::getDeviceStats(0);
  const auto all = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  m.allocated = stats.allocated_bytes[all].current;
  m.reserved = stats.reserved_bytes[all].current;
  m.peak_allocated = stats.allocated_bytes[all].peak;
  m.peak_reserved = stats.reserved_bytes[all].peak;
  return m;
}

}  // namespace

bool on_cuda(const WorkerIdentity& self) {
  return self.device.rfind("cuda", 0) == 0;
}

torch::Device worker_device(const WorkerIdentity& self) {
  // CUDA_VISIBLE_DEVICES holds exactly this worker's GPU, so inside it the GPU is cuda:0.
  return on_cuda(self) ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
}

void bind_worker_device(const WorkerIdentity& self) {
  if (!on_cuda(self)) return;
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  if (!torch::cuda::is_available())
    throw RuntimeError("[" + self.role + " " + std::to_string(self.rank) + "] placed on " +
                       self.device + " (CUDA_VISIBLE_DEVICES=" + (visible ? visible : "unset") +
                       "), but this process sees no CUDA device (driver missing, or no such GPU)");
  c10::cuda::set_device(0);
  // The caching allocator sets itself up at its first allocation; its statistics and its
  // cap are refused before that ("Invalid device argument").
  (void)torch::empty({1}, torch::TensorOptions().device(torch::kCUDA, 0));
  device_memory_log().enable();
  const CudaMemory m = cuda_memory();
  if (m.total == 0)
    throw RuntimeError("[" + self.role + " " + std::to_string(self.rank) + "] cudaMemGetInfo on " +
                       self.device + " failed");
  if (m.limit > 0)
    alloc::setMemoryFraction(static_cast<double>(m.limit) / static_cast<double>(m.total), 0);
}

std::string dtype_refusal(const WorkerIdentity& self, const std::string& dtype,
                          const std::string& gpu_name, int major, int minor) {
  if (dtype != "bf16" || major >= 8) return "";
  const std::string cc = std::to_string(major) + "." + std::to_string(minor);
  return "[" + self.role + " " + std::to_string(self.rank) + "] " + self.role + ".dtype bf16 on " +
         self.device + " (" + gpu_name + ", compute capability " + cc +
         "): this GPU has no BF16 units (8.0 or newer needed); set " + self.role +
         ".dtype fp16, or add \"compute_capability\": " + cc +
         " to its node in cluster.nodes so that dtype auto picks fp16";
}

void check_dtype_on_device(const WorkerIdentity& self, const std::string& dtype) {
  if (!on_cuda(self) || dtype != "bf16") return;
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return;  // bind_worker_device reports
  const std::string refusal = dtype_refusal(self, dtype, prop.name, prop.major, prop.minor);
  if (!refusal.empty()) throw InputError(refusal);
}

CudaMemory cuda_memory() {
  CudaMemory m = allocator_bytes();
  size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) == cudaSuccess) {
    m.free = static_cast<int64_t>(free);
    m.total = static_cast<int64_t>(total);
  }
  if (const char* gb = std::getenv(kEnvDeviceMemoryGb)) {
    const auto cap = static_cast<int64_t>(std::atof(gb) * static_cast<double>(1ull << 30));
    if (cap > 0 && cap < m.total) m.limit = cap;
  }
  return m;
}

void DeviceMemoryLog::begin(const std::string&) {
  if (!enabled_) return;
  alloc::resetPeakStats(0);
}

void DeviceMemoryLog::end(const std::string& op) {
  if (!enabled_) return;
  const CudaMemory m = allocator_bytes();
  std::lock_guard<std::mutex> lock(mutex_);
  Peak& p = phases_[op];
  p.allocated = std::max(p.allocated, m.peak_allocated);
  p.reserved = std::max(p.reserved, m.peak_reserved);
  overall_.allocated = std::max(overall_.allocated, m.peak_allocated);
  overall_.reserved = std::max(overall_.reserved, m.peak_reserved);
}

nlohmann::json DeviceMemoryLog::to_json() const {
  if (!enabled_) return nullptr;
  const CudaMemory now = cuda_memory();
  std::lock_guard<std::mutex> lock(mutex_);
  nlohmann::json phases = nlohmann::json::object();
  for (const auto& [op, p] : phases_)
    phases[op] = {{"peak_allocated_bytes", p.allocated}, {"peak_reserved_bytes", p.reserved}};
  return {{"peak_allocated_bytes", std::max(overall_.allocated, now.peak_allocated)},
          {"peak_reserved_bytes", std::max(overall_.reserved, now.peak_reserved)},
          {"allocated_bytes", now.allocated},
          {"reserved_bytes", now.reserved},
          {"total_bytes", now.total},
          {"limit_bytes", now.limit},
          {"phases", phases}};
}

DeviceMemoryLog& device_memory_log() {
  static DeviceMemoryLog log;
  return log;
}

void release_cached_device_memory(const WorkerIdentity& self) {
  if (on_cuda(self)) alloc::emptyCache();
}

std::string out_of_memory_report(const WorkerIdentity& self, const std::string& op,
                                 const std::string& run_dir, const std::string& what) {
  std::ostringstream out;
  out << "CUDA out of memory in " << self.role << " rank " << self.rank << " on " << self.device
      << " during \"" << op << "\"";
  if (on_cuda(self) && torch::cuda::is_available()) {
    const CudaMemory m = cuda_memory();
    out << ": allocated " << gib(m.allocated) << " (peak " << gib(m.peak_allocated)
        << "), reserved " << gib(m.reserved) << ", free " << gib(m.free) << " of " << gib(m.total);
    if (m.limit > 0) out << ", capped at " << gib(m.limit) << " by the node's memory_gb";
  }
  try {
    const auto planned = engine::planned_roles(run_dir);
    if (planned.is_object() && planned.contains(self.role))
      out << "; the plan gave " << self.role << " "
          << gib(planned[self.role].value("device_total", int64_t{0})) << " per device";
  } catch (const std::exception&) {
    // No readable plan: the report goes without it.
  }
  out << "; " << advice(self.role, op) << " (`rlhf plan` sizes a change before running it)";
  // The allocator's own first line says how much it tried to allocate.
  const std::string first = what.substr(0, what.find('\n'));
  const auto tried = first.find("Tried to allocate");
  if (tried != std::string::npos) {  // "Tried to allocate 2.00 MiB.": up to the unit's period
    const auto unit = first.find("iB", tried);
    out << "; " << first.substr(tried, unit == std::string::npos ? unit : unit + 2 - tried);
  }
  return out.str();
}

}  // namespace rlhf
