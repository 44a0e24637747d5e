// The contract between a model and the sharded trainer (engine/): a model's parameters come
// in ordered units (unit 0: embeddings, units 1..L: decoder layers, unit L+1: final norm and
// head), and the model calls the installed hooks around each unit so ZeRO-3 can gather a
// unit's parameters just before use, free them after, and reduce-scatter a unit's gradients
// as soon as its backward has produced them.
#pragma once

#include <torch/types.h>

#include <string>
#include <utility>
#include <vector>

namespace rlhf::models {

struct ParamUnit {
  std::string name;                                           // "embed", "layers.3", "head"
  std::vector<std::pair<std::string, torch::Tensor>> params;  // HF names -> parameter
  std::vector<std::vector<int64_t>> shapes;  // params[i]'s full shape (its tensor may be empty)
  // Expert parallelism (models/expert_parallel.h): this rank holds routed experts
  // [expert_first, expert_first + expert_count) of the unit's sparse layer (params named by
  // their global index; models::expert_index tells them apart). 0: every expert, or none.
  int64_t expert_first = 0;
  int64_t expert_count = 0;
};

// Where a model's initial values come from when no rank may hold the whole model: a
// checkpoint read slice by slice (models/pretrained.h). A sharded owner asks each rank for
// exactly the elements it keeps.
class WeightSource {
 public:
  virtual ~WeightSource() = default;
  // Elements [begin, begin + count) of parameter `name` flattened in row-major order: a
  // fresh 1-D tensor of `dtype` on `device`. Throws InputError naming the file on bad data.
  virtual torch::Tensor read(const std::string& name, int64_t begin, int64_t count,
                             torch::Dtype dtype, torch::Device device) const = 0;
};

// Installed by a trainer; default implementations do nothing (plain, unsharded model).
class LayerHooks {
 public:
  virtual ~LayerHooks() = default;
  // Before unit `unit` runs forward; also before its recompute in a checkpointed backward.
  virtual void before_forward(int unit) {}
  // After unit `unit` ran forward (or its recompute). ZeRO-3 frees gathered parameters here.
  virtual void after_forward(int unit) {}
  // After unit `unit`'s parameter gradients were accumulated into .grad during backward.
  // Called from the checkpointed layer's backward; units without checkpointing (and the
  // embedding/head units) are not signalled, and the trainer handles them after backward.
  virtual void after_backward(int unit) {}
};

// Implemented by every model the trainer can shard.
class ShardableModel {
 public:
  virtual ~ShardableModel() = default;
  virtual std::vector<ParamUnit> param_units() = 0;
  // Not owned; nullptr removes the hooks.
  virtual void set_layer_hooks(LayerHooks* hooks) = 0;
};

}  // namespace rlhf::models
