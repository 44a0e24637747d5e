// Actor -> rollout weight sync over one collective group spanning actor rank 0 (group rank
// 0, the root) and the rollout ranks: a header (version, layout hash, bucket size, path),
// then the weights packed in wire dtype into fixed-size flat buckets (filled across units,
// a tensor larger than a bucket split over several), one bucket at a time: broadcast over
// the group (Gloo or NCCL), or through a CUDA IPC buffer when every receiver is on the
// sender's GPU. For a tensor-parallel rollout the root fills one bucket per TP rank with
// that rank's slices and scatters them, so each rollout rank receives only what it holds.
// No rank holds more than one gathered unit and one bucket beyond its model. A LoRA actor
// sends either the merged weights or only its adapters (LoraAdapterWeights), which the
// rollout merges into the base it holds (LoraMerge).
// Receivers unpack into their model's parameters in place. Does not create the group
// (transport/) or decide when to sync or by which path (the driver does).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "models/causal_lm.h"
#include "transport/collective_group.h"

namespace rlhf::engine {
class Trainer;
}

namespace rlhf::rollout {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// One tensor of the layout both sides must share.
struct TensorSpec {
  std::string name;            // HF name
  std::vector<int64_t> shape;  // full (unsharded) shape
};

// What a sync carries: the rollout's weights themselves, or a LoRA actor's adapters, which
// the rollout merges into the base weights it loaded (LoraMerge).
enum class SyncContent : int64_t { kWeights = 0, kLoraAdapters = 1 };

// Where the sender's weights come from, one unit at a time.
class WeightSource {
 public:
  virtual ~WeightSource() = default;
  virtual SyncContent content() const { return SyncContent::kWeights; }
  virtual double lora_scale() const { return 0.0; }  // kLoraAdapters: s in W + s B A
  // Per unit, its tensors (any order: both sides sort by name).
  virtual std::vector<std::vector<TensorSpec>> layout() = 0;
  // Unit `unit`'s full tensors by name, valid until release(unit). For a sharded trainer
  // this is collective over the trainer's group: every actor rank calls it, in order.
  virtual NamedTensors acquire(int64_t unit) = 0;
  virtual void release(int64_t unit) = 0;
};

// A plain model's parameters (param_units()): nothing to gather.
class ModelWeights final : public WeightSource {
 public:
  explicit ModelWeights(models::ShardableModel& model) : model_(model) {}
  std::vector<std::vector<TensorSpec>> layout() override;
  NamedTensors acquire(int64_t unit) override;
  void release(int64_t) override {}

 private:
  models::ShardableModel& model_;
};

// A ZeRO trainer's parameters in its compute dtype: at stage 3 each unit is all-gathered
// over the trainer's group on acquire and freed on release (one unit at a time).
class TrainerWeights final : public WeightSource {
 public:
  // with_frozen false: a frozen base is not gathered (ZeRO-3) nor returned by acquire (a
  // sync of the adapters alone).
  explicit TrainerWeights(engine::Trainer& trainer, bool with_frozen = true)
      : trainer_(trainer), with_frozen_(with_frozen) {}
  std::vector<std::vector<TensorSpec>> layout() override;
  NamedTensors acquire(int64_t unit) override;
  void release(int64_t unit) override;

 private:
  engine::Trainer& trainer_;
  bool with_frozen_ = true;
};

// A LoRA trainer's weights as the plain model the rollout holds (issue 30.3, its first
// path): each adapted linear goes as W + scale B A, computed in FP32 from the gathered unit
// and sent in W's dtype; the adapters themselves are not sent. One unit's merged weights
// exist at a time (acquire to release), never a whole merged copy.
class MergedLoraWeights final : public WeightSource {
 public:
  MergedLoraWeights(engine::Trainer& trainer, double scale) : inner_(trainer), scale_(scale) {}
  std::vector<std::vector<TensorSpec>> layout() override;
  NamedTensors acquire(int64_t unit) override;
  void release(int64_t unit) override;

 private:
  TrainerWeights inner_;
  double scale_;       // alpha / r (or alpha / sqrt r)
  NamedTensors held_;  // the merged tensors of the acquired unit
};

// A LoRA trainer's adapters only (issue 30.3, its second path: rollout.lora_sync adapters):
// every lora_A / lora_B tensor in the trainer's compute dtype, a few MB where the merged path
// sends the whole model. The rollout must hold the same base (it loaded the same file) and
// merges them on receipt (LoraMerge). Units without adapters stay in the layout, empty.
class LoraAdapterWeights final : public WeightSource {
 public:
  LoraAdapterWeights(engine::Trainer& trainer, double scale)
      : inner_(trainer, /*with_frozen=*/false), scale_(scale) {}
  std::vector<std::vector<TensorSpec>> layout() override;
  NamedTensors acquire(int64_t unit) override;
  void release(int64_t unit) override { inner_.release(unit); }
  SyncContent content() const override { return SyncContent::kLoraAdapters; }
  double lora_scale() const override { return scale_; }

 private:
  TrainerWeights inner_;
  double scale_;  // alpha / r (or alpha / sqrt r)
};

// rollout.lora_sync: how a LoRA actor's weights reach the rollout.
enum class LoraSync {
  kMerged,    // MergedLoraWeights: W + s B A, the whole model's bytes
  kAdapters,  // LoraAdapterWeights + LoraMerge on the rollout: the adapters' bytes
};
const char* lora_sync_name(LoraSync mode);          // "merged", "adapters"
LoraSync parse_lora_sync(const std::string& name);  // InputError naming the choices

// The rollout's side of the adapters path. How the rollout applies the adapters: it merges
// them into its weights on receipt, W = base + s B A computed in FP32 from a pristine copy of
// each adapted base weight and then cast to W's dtype, the very formula and rounding of the
// actor's MergedLoraWeights, so the rollout's weights are bit for bit those of the merged
// path (rollout_logprob_diff as today) and never drift: every sync starts again from the
// copy, never from the last merged (rounded) W. The alternatives, and why not:
//  - an unmerged forward (the adapters as generation state, y = W x + s B (A x)): its
//    weights are not the merged path's, so rollout_logprob_diff would change; every paged,
//    fused or CUDA-graph decode path would have to carry the adapter term, and on a GPU it
//    adds four kernels per linear to each decode step (on the CPU it measured no slower:
//    bench_sync --lora, bench/RESULTS.md issue 30.3);
//  - merging in place and subtracting s B A again before the next merge: in BF16,
//    bf16(bf16(W + d) - d) != W, so the weights would drift a little every step.
// The copy costs host memory, not device memory: it lives on the CPU (pinned when the model
// is on a GPU) and each sync reads it once, per adapted weight, to the device. Before the
// first adapters sync the model's adapted weights must still be the base's; a full-weights
// sync makes them unknown (forget), after which adapters are refused.
class LoraMerge {
 public:
  // Checks an adapter layout (lora_A [r, in] / lora_B [out, r] per adapted linear, full
  // shapes, by unit) against `model` (a TP shard takes its slices), makes the receive
  // buffers (FP32, the model's device) and copies the base of any adapted weight not copied
  // yet. Returns "" or why this rank cannot take the adapters.
  std::string prepare(models::CausalLM& model, const std::vector<std::vector<TensorSpec>>& layout,
                      double scale);
  // The receive buffers, by unit, as prepare's layout (full shapes).
  std::vector<models::ParamUnit>& units() { return units_; }
  // W = base + scale B A for every adapter of the last prepare, in place.
  void merge(models::CausalLM& model);
  // A full-weights sync replaced the model's weights: the base copies are dropped and no
  // adapters are taken any more.
  void forget();
  int64_t base_bytes() const;  // host bytes of the base copies

 private:
  std::vector<models::ParamUnit> units_;
  std::map<std::string, torch::Tensor> base_;  // module -> pristine W (this rank's slice), host
  std::map<std::string, std::pair<torch::Tensor, torch::Tensor>> adapters_;  // module -> A, B
  double scale_ = 0.0;
  bool model_is_base_ = true;  // no full-weights sync has replaced the loaded base
};

// How the buckets travel from the actor to the rollout ranks.
enum class SyncPath {
  kGloo,     // Gloo broadcast (CPU tensors; CUDA ones staged through the host)
  kNccl,     // NCCL broadcast: the actor and every rollout rank on a GPU of their own
  kCudaIpc,  // every rollout rank on the actor's GPU: device-to-device through an IPC
             // handle; the group (Gloo) carries only the handle and the ready/done signals
};
const char* sync_path_name(SyncPath path);          // "gloo", "nccl", "cuda_ipc"
SyncPath parse_sync_path(const std::string& name);  // InputError naming the choices

struct SyncOptions {
  torch::Dtype wire_dtype = torch::kBFloat16;  // the rollout converts to its own dtype
  int64_t bucket_bytes = int64_t{256} << 20;   // rollout.sync_bucket_mb
  SyncPath path = SyncPath::kGloo;
  torch::Device device = torch::kCPU;  // where the actor's bucket lives (its device)
  // The rollout's tensor_parallel_size: > 1 scatters to each rollout rank (sync rank g, TP
  // rank (g - 1) % tp) only its slices, from tp buckets of bucket_bytes / tp (gloo or nccl;
  // the root also keeps one more as the landing place of its own scatter slot).
  int tensor_parallel_size = 1;
};

struct WeightSyncStats {
  int64_t version = 0;
  int64_t tensors = 0;
  int64_t bytes = 0;     // bytes sent or received (wire dtype)
  int64_t buckets = 0;   // buckets moved
  double seconds = 0.0;  // wall time of the whole sync on this rank
  SyncPath path = SyncPath::kGloo;
};

// Actor side. Every actor rank calls it (the gathers are collective over the trainer's
// group); `group` is the sync group on actor rank 0 (which must be its rank 0) and nullptr
// on the other actor ranks. Each unit is acquired once, in order, copied into the bucket
// (flushed whenever full) and released. kCudaIpc needs a Gloo group and a CUDA device.
// Throws RuntimeError when a receiver's layout differs or it cannot map the IPC buffer
// (after telling every rank).
WeightSyncStats send_weights(WeightSource& source, transport::CollectiveGroup* group,
                             int64_t version, const SyncOptions& options);

// Rollout side (sync group rank > 0): receives one sync into `model`'s parameters in place
// (the path, bucket size and content come from the sender's header) and returns its
// version. LoRA adapters go through `lora` (merged on receipt); without one they are
// refused. Throws RuntimeError when the sender's layout differs from the model's (names,
// shapes, unit count), naming both hashes, or when this rank cannot take the sender's path
// or adapters.
WeightSyncStats receive_weights(models::CausalLM& model, transport::CollectiveGroup& group,
                                LoraMerge* lora = nullptr);

// Buckets of `bucket_bytes` that `numels` elements of `wire_dtype` fill, packed end to end
// (what a sync of tensors of those sizes moves): ceil(total bytes / bucket bytes).
int64_t bucket_count(const std::vector<int64_t>& numels, torch::Dtype wire_dtype,
                     int64_t bucket_bytes);

// Order-independent digest of a layout (sorted names and shapes), 63 bits.
int64_t layout_hash(const std::vector<std::vector<TensorSpec>>& layout);

}  // namespace rlhf::rollout
