// ZeRO-3 for a model that is never trained (the reference, a PPO job's reward model): each
// rank keeps 1/N of every unit's weights in the compute dtype, read straight from the
// checkpoint, and all-gathers one unit at a time around its forward, as DeepSpeed's stage-3
// inference engine runs OpenRLHF's reference model. No gradients, no master copy, no
// optimizer state. It does not decide what to compute: the caller runs the model's forward
// (under NoGradGuard), and every rank of the group must run the same sequence of forwards.
#pragma once

#include <torch/types.h>

#include <string>
#include <vector>

#include "engine/memory_tracker.h"
#include "models/layer_hooks.h"
#include "transport/collective_group.h"

namespace rlhf::engine {

class ShardedInference final : public models::LayerHooks {
 public:
  // Reads this rank's shard of every unit of `model` (built with Materialize::kDeferred)
  // from `source` in `dtype` on `device` and installs itself as the model's hooks. The
  // model and group are not owned and must outlive this object; the source only the
  // constructor. `tied_embeddings`: the head reads unit 0's matrix (gathered with it).
  ShardedInference(models::ShardableModel& model, transport::CollectiveGroup& group,
                   const models::WeightSource& source, torch::Dtype dtype, torch::Device device,
                   bool tied_embeddings);
  ~ShardedInference() override;
  ShardedInference(const ShardedInference&) = delete;
  ShardedInference& operator=(const ShardedInference&) = delete;

  void before_forward(int unit) override;  // all-gather the unit (collective)
  void after_forward(int unit) override;   // free it (local)

  // params: this rank's shards; gathered: the unit(s) live now; peak since reset_peak().
  MemoryReport memory_report() const { return tracker_.report(); }
  void reset_peak() { tracker_.reset_peak(); }
  void begin_memory_window() { tracker_.begin_window(); }  // MemoryReport::window_peak
  int64_t shard_bytes() const;                             // this rank's persistent bytes

 private:
  struct Slot {
    std::string name;
    torch::Tensor param;         // the model's parameter: empty outside a gather
    std::vector<int64_t> shape;  // full shape
    int64_t offset = 0;          // into the unit's flat buffer
    int64_t numel = 0;
  };
  struct Unit {
    std::vector<Slot> slots;
    int64_t padded = 0;    // flat elements, a multiple of the group size
    int64_t shard = 0;     // padded / N
    torch::Tensor local;   // [shard] this rank's elements, compute dtype on the device
    int64_t gathered = 0;  // bytes of the live gathered buffer (0: not gathered)
    int users = 0;         // nested gathers (a tied head gathers unit 0 inside unit L+1)
  };
  void gather(Unit& unit);
  void release(Unit& unit);

  models::ShardableModel& model_;
  transport::CollectiveGroup& group_;
  torch::Dtype dtype_;
  torch::Device device_;
  bool tied_;
  std::vector<Unit> units_;
  MemoryTracker tracker_;
};

}  // namespace rlhf::engine
