// Running totals and peak of the engine's own allocations.
#include "engine/memory_tracker.h"

#include <algorithm>

namespace rlhf::engine {

void MemoryTracker::add(MemoryKind kind, int64_t bytes) {
  bytes_[static_cast<int>(kind)] += bytes;
  total_ += bytes;
  peak_ = std::max(peak_, total_);
  window_peak_ = std::max(window_peak_, total_);
}

MemoryReport MemoryTracker::report() const {
  MemoryReport r;
  r.params = bytes_[static_cast<int>(MemoryKind::kParams)];
  r.master = bytes_[static_cast<int>(MemoryKind::kMaster)];
  r.optimizer = bytes_[static_cast<int>(MemoryKind::kOptimizer)];
  r.grads = bytes_[static_cast<int>(MemoryKind::kGrads)];
  r.gathered = bytes_[static_cast<int>(MemoryKind::kGathered)];
  r.buffers = bytes_[static_cast<int>(MemoryKind::kBuffers)];
  r.peak = peak_;
  r.window_peak = window_peak_;
  return r;
}

}  // namespace rlhf::engine
