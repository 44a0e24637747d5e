// Actor -> rollout weight sync over one collective group spanning actor rank 0 (group rank
// 0, the root) and the rollout ranks: a header (version, layout hash), then one broadcast per
// parameter unit (embeddings, each decoder layer, head), so no rank holds more than one unit
// beyond its model. Receivers copy into their model's parameters in place. Does not create
// the group (transport/) or decide when to sync (the driver does).
#pragma once

#include <torch/types.h>

#include <cstdint>
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

// Where the sender's weights come from, one unit at a time.
class WeightSource {
 public:
  virtual ~WeightSource() = default;
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
  explicit TrainerWeights(engine::Trainer& trainer) : trainer_(trainer) {}
  std::vector<std::vector<TensorSpec>> layout() override;
  NamedTensors acquire(int64_t unit) override;
  void release(int64_t unit) override;

 private:
  engine::Trainer& trainer_;
  bool gathered_here_ = false;  // acquire() gathered the unit, so release() frees it
};

struct WeightSyncStats {
  int64_t version = 0;
  int64_t tensors = 0;
  int64_t bytes = 0;     // bytes broadcast (wire dtype)
  double seconds = 0.0;  // wall time of the whole sync on this rank
};

// Actor side. Every actor rank calls it (the gathers are collective over the trainer's
// group); `group` is the sync group on actor rank 0 (which must be its rank 0) and nullptr
// on the other actor ranks. Tensors travel in `wire_dtype` (the rollout converts to its
// own). Throws RuntimeError when a receiver's layout differs (after telling every rank).
WeightSyncStats send_weights(WeightSource& source, transport::CollectiveGroup* group,
                             int64_t version, torch::Dtype wire_dtype);

// Rollout side (sync group rank > 0): receives one sync into `model`'s parameters in place
// and returns its version. Throws RuntimeError when the sender's layout differs from the
// model's (names, shapes, unit count), naming both hashes.
WeightSyncStats receive_weights(models::CausalLM& model, transport::CollectiveGroup& group);

// Order-independent digest of a layout (sorted names and shapes), 63 bits.
int64_t layout_hash(const std::vector<std::vector<TensorSpec>>& layout);

}  // namespace rlhf::rollout
