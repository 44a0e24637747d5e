// Bytes the trainer holds on one rank, by kind, with the peak since the last reset. It
// counts the tensors the engine allocates (model state, gathered parameters, collective
// buffers); activations belong to the model and are not counted here.
#pragma once

#include <array>
#include <cstdint>

namespace rlhf::engine {

enum class MemoryKind : int {
  kParams = 0,  // persistent compute-dtype parameters (full at stage 1/2; frozen ones)
  kMaster,      // FP32 master weights (this rank's shard)
  kOptimizer,   // AdamW exp_avg and exp_avg_sq (this rank's shard)
  kGrads,       // accumulated FP32 gradients (shard at stage 2/3, full at stage 1)
  kGathered,    // parameters all-gathered for a unit (stage 3) or for an export
  kBuffers,     // transient collective buffers (flattened grads, receive buffers)
};
inline constexpr int kMemoryKinds = 6;

// Per-rank figures, in bytes.
struct MemoryReport {
  int64_t params = 0;
  int64_t master = 0;
  int64_t optimizer = 0;
  int64_t grads = 0;
  int64_t gathered = 0;
  int64_t buffers = 0;
  int64_t peak = 0;  // the largest total since the last reset (a step, an export)
  // The largest total since the last begin_window() (a worker operation; the worker's
  // per-phase tracked peaks, tensor_phases in metrics.jsonl). Independent of `peak`.
  int64_t window_peak = 0;
  // Model states in ZeRO's sense: params + master + optimizer + grads.
  int64_t model_states() const { return params + master + optimizer + grads; }
};

class MemoryTracker {
 public:
  void add(MemoryKind kind, int64_t bytes);
  void sub(MemoryKind kind, int64_t bytes) { add(kind, -bytes); }
  void reset_peak() { peak_ = total_; }
  // Starts a second peak window (one worker operation) without touching reset_peak's.
  void begin_window() { window_peak_ = total_; }
  int64_t total() const { return total_; }
  MemoryReport report() const;

 private:
  std::array<int64_t, kMemoryKinds> bytes_{};
  int64_t total_ = 0;
  int64_t peak_ = 0;
  int64_t window_peak_ = 0;
};

}  // namespace rlhf::engine
