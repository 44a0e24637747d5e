// One parameter unit (embeddings, a decoder layer, the head) flattened and sharded over
// the group: the unit's trainable parameters are laid end to end in one flat buffer padded
// to a multiple of N, and rank r owns elements [r S, (r+1) S) of it (S = padded / N), as
// FSDP's flat parameters. It does not decide when to gather or reduce (the Trainer does).
#pragma once

#include <torch/types.h>

#include <string>
#include <vector>

#include "engine/adamw.h"
#include "engine/memory_tracker.h"
#include "engine/trainer_config.h"
#include "models/layer_hooks.h"
#include "transport/collective_group.h"

namespace rlhf::engine {

// What every unit of a trainer shares.
struct ShardContext {
  transport::CollectiveGroup* group = nullptr;  // not owned
  MemoryTracker* tracker = nullptr;             // not owned
  ZeroStage stage = ZeroStage::kParameters;
  torch::Dtype compute_dtype = torch::kBFloat16;
  torch::Device device = torch::kCPU;        // parameters, gradients, collectives
  torch::Device state_device = torch::kCPU;  // FP32 master and moments (host with offload)
  // finish_grads divides the summed gradient by this: the ranks whose losses reached it (the
  // whole data-parallel world; for an expert unit sharded over its expert-data-parallel group,
  // still the world, as every rank's tokens reach the experts). 0: the group's size.
  int grad_divisor = 0;
};

// A parameter's place in its unit's flat buffer.
struct ParamSlot {
  std::string name;            // HF name
  torch::Tensor param;         // the model's parameter; its data is swapped at stage 3
  std::vector<int64_t> shape;  // full shape
  int64_t offset = 0;          // into the flat buffer
  int64_t numel = 0;
};

class ShardedUnit {
 public:
  // Without a source: takes the unit's current parameter values (rank 0's win: they are
  // broadcast), keeps this rank's FP32 shard, and converts or frees the model's copies by
  // stage. With a source (the parameters may be empty placeholders): each rank reads only
  // its shard's elements from it (and, at stage 1/2, each parameter whole in the compute
  // dtype), so no rank holds the unit in FP32; no collective. Parameters with
  // requires_grad == false are frozen (a LoRA base): kept in the compute dtype, never
  // updated; whole at stage 1/2, and at stage 3 laid end to end in a second flat buffer of
  // which each rank keeps its 1/N (read as a slice from the source, else cut from the
  // parameter's values), gathered and freed with the unit.
  ShardedUnit(const models::ParamUnit& unit, const ShardContext& context,
              const models::WeightSource* source = nullptr);
  ~ShardedUnit();
  ShardedUnit(const ShardedUnit&) = delete;
  ShardedUnit& operator=(const ShardedUnit&) = delete;

  const std::string& name() const { return name_; }
  const std::vector<ParamSlot>& slots() const { return slots_; }    // trainable
  const std::vector<ParamSlot>& frozen() const { return frozen_; }  // never updated
  int64_t numel() const { return numel_; }                          // trainable elements
  int64_t padded_numel() const { return padded_; }
  int64_t shard_numel() const { return shard_; }
  // An expert unit (expert parallelism): this rank's experts [first, first + count) of a layer.
  int64_t expert_first() const { return expert_first_; }
  int64_t expert_count() const { return expert_count_; }
  transport::CollectiveGroup& group() const { return *ctx_.group; }

  // Stage 3: all-gather the parameters into full compute-dtype tensors (no-op if gathered
  // or at stage 1/2), the frozen ones too unless `with_frozen` is false (a sync of the
  // adapters alone). Collective: every rank must call it with the same argument.
  void gather(bool with_frozen = true);
  void gather_frozen();  // the frozen parameters alone (stage 3; else a no-op). Collective.
  // Stage 3: free the gathered parameters, unless a live autograd graph still uses them
  // (then they are freed by release() after backward): a trainable parameter with a gradient
  // accumulator, or a frozen one (or a view of it) that the graph saved for the input
  // gradient (the head under a LoRA layer; not the embeddings, whose input needs none).
  // Local, no collective.
  void release_if_unused();
  void release();
  bool gathered() const { return gathered_bytes_ + frozen_gathered_bytes_ > 0; }
  int64_t frozen_numel() const { return frozen_numel_; }  // frozen elements (unpadded)

  // After the unit's backward: moves .grad (any dtype) into FP32, reduce-scatters it into
  // this rank's gradient shard (stage 2/3) or adds it to the full FP32 gradient (stage 1),
  // and clears .grad. Missing grads count as zero. Collective at stage 2/3.
  void reduce_grads();
  // Before the step: stage 1 all-reduces its full gradient; all stages divide by N.
  // Returns this rank's gradient shard, [S] FP32 on the device. Collective.
  torch::Tensor finish_grads();
  // AdamW on the shard with `grad` [S] (already clipped) and the step's hyperparameters.
  void apply_adamw(const torch::Tensor& grad, const AdamWStep& hp);
  // After the step: stage 1/2 all-gather the new values into the model's parameters;
  // stage 3 refreshes its cached compute shard. Collective at stage 1/2.
  void refresh_params();
  void zero_grads();

  // The full FP32 flat master buffer [padded] on the device, gathered from all ranks, for
  // an export (the caller frees it). Collective.
  torch::Tensor gather_master();

  // This rank's state, [S] FP32, for checkpoints (load by copy_ into them, then
  // refresh_params()).
  torch::Tensor& master() { return master_; }
  torch::Tensor& exp_avg() { return exp_avg_; }
  torch::Tensor& exp_avg_sq() { return exp_avg_sq_; }
  // The gradient buffer, [S] or [padded] FP32 (zero between steps), for an offload.
  torch::Tensor& grad_buffer() { return grad_; }

 private:
  // The constructor's two ways to fill the unit's state (see the constructor).
  void load_shard(const models::WeightSource& source, int64_t begin, int64_t end);
  void broadcast_rank0(int64_t begin);
  void set_full_params(const torch::Tensor& flat);  // params view `flat` [padded]
  torch::Tensor compute_shard() const;              // [S] compute dtype on the device
  // Stage 3's frozen flat buffer: this rank's [F] slice of the frozen parameters, read from
  // `source` (or cut from the parameters' values), and the parameters emptied.
  void shard_frozen(const models::WeightSource* source);
  bool frozen_saved_by_graph() const;

  ShardContext ctx_;
  std::string name_;
  int64_t expert_first_ = 0, expert_count_ = 0;
  std::vector<ParamSlot> slots_;
  std::vector<ParamSlot> frozen_;
  int64_t numel_ = 0;
  int64_t frozen_numel_ = 0;
  int64_t frozen_shard_ = 0;    // stage 3: F, the frozen buffer padded to F N
  torch::Tensor frozen_local_;  // stage 3: [F] compute dtype on the device
  int64_t frozen_gathered_bytes_ = 0;
  std::vector<int64_t> frozen_uses_;  // at the gather: each frozen parameter's use count,
                                      // then the gathered storage's (a graph adds to them)
  int64_t padded_ = 0;
  int64_t shard_ = 0;
  DecayRanges decay_;           // shard-local ranges that take weight decay
  torch::Tensor master_;        // [S] FP32 on state_device
  torch::Tensor exp_avg_;       // [S] FP32 on state_device
  torch::Tensor exp_avg_sq_;    // [S] FP32 on state_device
  torch::Tensor grad_;          // [S] FP32 (stage 2/3) or [padded] (stage 1), on the device
  torch::Tensor cached_shard_;  // [S] compute dtype on the device: stage 3 with offload only
  int64_t gathered_bytes_ = 0;
  int64_t state_bytes_[4] = {0, 0, 0, 0};  // params, master, optimizer, grads (for the tracker)
};

}  // namespace rlhf::engine
