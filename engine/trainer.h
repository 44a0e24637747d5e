// The sharded trainer: ZeRO stage 1-3 data parallelism over a collective group, compute in
// the model's compute dtype (BF16) with FP32 master weights and AdamW moments on the
// shards, gradient accumulation, global-norm clipping, LR schedule, optimizer offload,
// sharded checkpoints and a streamed HF export. It does not build models, batches or
// losses: the caller's loss function does.
#pragma once

#include <torch/types.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/checkpoint.h"
#include "engine/host_offload.h"
#include "engine/loss_scaler.h"
#include "engine/lr_schedule.h"
#include "engine/memory_tracker.h"
#include "engine/sharded_unit.h"
#include "engine/trainer_config.h"
#include "models/layer_hooks.h"
#include "models/param_layout.h"
#include "transport/collective_group.h"

namespace rlhf::models {
class SafetensorsWriter;
}

namespace rlhf::engine {

struct StepMetrics {
  int64_t step = 0;           // optimizer steps done, this one included
  double loss = 0.0;          // mean over micro batches and ranks
  double grad_norm = 0.0;     // global L2 norm of the averaged gradient, before clipping
  double lr = 0.0;            // the learning rate this step used
  bool skipped = false;       // the gradient norm was not finite: no update was applied
  double loss_scale = 1.0;    // the loss scale this step's backward used (FP16; else 1)
  int64_t skipped_steps = 0;  // FP16: steps skipped for overflow so far
  MemoryReport memory;        // this rank; peak over the step
};

// Expert parallelism (models/expert_parallel.h): the groups a model built with ExpertParallel
// needs beside the trainer's. World rank w = g x EP + p is rank p of EP group g (the ranks that
// split the experts) and rank g of expert-data-parallel group p (the ranks that hold the same
// experts, over which the experts' ZeRO unit is sharded). Not owned.
struct ExpertGroups {
  transport::CollectiveGroup* ep = nullptr;
  transport::CollectiveGroup* edp = nullptr;
};

class Trainer {
 public:
  // Shards `model`'s parameters over `group` (every rank of the group constructs its
  // Trainer with the same model architecture) and installs the layer hooks. Initial values:
  // with a `source`, each rank reads only its own shard from it (the model may be built
  // with Materialize::kDeferred: no rank ever holds the whole model); without one, rank 0's
  // values are broadcast. None is owned; model and group must outlive the Trainer, the
  // source only the constructor. At stage 3 the model's parameter tensors stay empty
  // outside the hooks (also after the Trainer is gone: a checkpoint or export_hf carries
  // the weights). Throws InputError for a bad config.
  //
  // A model unit that holds a rank's range of experts (ParamUnit::expert_count, an
  // expert-parallel model) becomes two sharded units: its dense parameters over `group`, its
  // experts over `experts.edp` (both needed then). Gradients of both are averaged over the
  // whole group: every rank's tokens reached the experts through the all-to-all.
  Trainer(const TrainerConfig& config, models::ShardableModel& model,
          transport::CollectiveGroup& group, const models::WeightSource* source = nullptr,
          ExpertGroups experts = {});
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // One micro batch: (loss / grad_accum_steps).backward(), then the gradient reduction of
  // every unit the model did not signal. `loss` is this rank's mean loss over its micro
  // batch (a scalar with a graph). A micro batch run in parts (a token budget) calls it
  // once per part with that part's share of the loss, ends_micro_batch = false for all but
  // the last: gradients and the reported loss add up, the micro batch counts once. At
  // ZeRO-3 every rank must make the same calls (each reduces every unit).
  void backward(const torch::Tensor& loss, bool ends_micro_batch = true);
  // What backward() multiplies a loss by before its backward: 1 / grad_accum_steps, times the
  // FP16 loss scale. A gradient a model adds by hand (models::AuxLoss) is scaled by it too.
  double backward_multiplier() const;
  // The optimizer step after grad_accum_steps calls to backward(). Collective.
  StepMetrics step();
  // backward(loss_fn(i)) for i in [0, grad_accum_steps), then step().
  using LossFn = std::function<torch::Tensor(int64_t micro_batch)>;
  StepMetrics train_step(const LossFn& loss_fn);

  // Sharded checkpoint into `dir` (see checkpoint.h); collective.
  void save_checkpoint(const std::string& dir, const CheckpointOptions& options = {});
  // Restores the state saved by save_checkpoint into this trainer (same world size and
  // model layout, else InputError naming the file). Collective.
  void load_checkpoint(const std::string& dir);
  // HF directory: config.json (`config_json`, written as given) and model.safetensors in
  // `dtype`, streamed unit by unit: each unit is gathered, written by rank 0 and freed
  // before the next. Collective; rank 0 writes.
  void export_hf(const std::string& dir, const std::string& config_json, torch::Dtype dtype);

  // Every trainable parameter whole, by name, FP32 on the CPU, on every rank (one unit
  // gathered at a time): the few tensors of a LoRA run (adapters, a value head), for their
  // export. Not for a full model (each rank would hold all of it), nor expert-parallel.
  // Collective.
  std::vector<std::pair<std::string, torch::Tensor>> gather_trainable();

  // The model's units whole, one at a time (the weight sync's source): per model unit its
  // parameters' HF names and full shapes (trainable, then frozen; with expert parallelism
  // every rank's experts, in expert order), the same on every rank.
  std::vector<models::ShapeList> unit_layout() const;
  // Model unit `unit`'s tensors as unit_layout() lists them, in the compute dtype, valid
  // until release_unit(unit): ZeRO-3 gathers the unit (the frozen ones too unless
  // `with_frozen` is false: then none are returned), and an expert unit's experts are
  // all-gathered over the EP group. Collective: every rank, in the same order.
  std::vector<std::pair<std::string, torch::Tensor>> acquire_unit(int64_t unit, bool with_frozen);
  void release_unit(int64_t unit);  // frees what acquire_unit gathered. Local.

  // The optimizer state (FP32 master shards except at stage 3, where gathers read them;
  // AdamW moments; gradient buffers) to host memory while another role needs the device,
  // bit-exactly back by restore (backward, step, checkpoints and export restore it
  // themselves). Return the bytes moved; offload is a no-op returning 0 when the state lives
  // on the host already (OptimizerPlacement::kHost) or is offloaded. Local, no collective.
  int64_t offload_optimizer_state();
  int64_t restore_optimizer_state();
  bool optimizer_state_offloaded() const { return optimizer_offload_.offloaded(); }

  MemoryReport memory_report() const { return tracker_.report(); }
  void begin_memory_window() { tracker_.begin_window(); }  // MemoryReport::window_peak
  // Peak engine bytes and peak measured heap growth during the last export_hf.
  struct ExportMemory {
    int64_t peak_engine_bytes = 0;   // accounted (gathered unit + conversion buffer)
    int64_t peak_heap_growth = 0;    // measured (malloc'd bytes above the start)
    int64_t largest_unit_bytes = 0;  // FP32 bytes of the largest unit (the bound)
  };
  ExportMemory last_export_memory() const { return export_memory_; }

  // The collectives this rank ran for the last optimizer step, from its first training forward
  // (a unit's forward with grad mode on) or backward() to the end of step() (what the memory
  // planner's engine_collectives predicts; the caller's own collectives in between, such as
  // a token count, are in it too).
  const transport::CollectiveTraffic& last_step_traffic() const { return last_step_traffic_; }

  int64_t steps_done() const { return step_; }
  int rank() const { return group_.rank(); }
  int world_size() const { return group_.size(); }
  const TrainerConfig& config() const { return config_; }
  // The sharded units: each model unit's (its experts' unit after it, when expert-parallel).
  const std::vector<std::unique_ptr<ShardedUnit>>& units() const { return units_; }

 private:
  class Hooks;
  friend class Hooks;
  void before_unit(int unit);
  void after_unit(int unit);
  void after_unit_backward(int unit);
  void open_traffic_window();                    // the step's collectives count from here
  transport::CollectiveTraffic traffic() const;  // this rank's, over the trainer's groups
  // export_hf's part for one sharded unit: gathered, written by rank 0, freed. Collective.
  void export_unit(ShardedUnit& unit, models::SafetensorsWriter* writer, torch::Dtype dtype,
                   int64_t heap_start);

  TrainerConfig config_;
  models::ShardableModel& model_;
  transport::CollectiveGroup& group_;
  LrSchedule schedule_;
  MemoryTracker tracker_;
  ExpertGroups experts_;
  std::vector<std::unique_ptr<ShardedUnit>> units_;
  std::vector<std::vector<size_t>> members_;  // per model unit, its indices into units_
  std::vector<bool> acquired_;                // [units_] gathered by acquire_unit
  std::unique_ptr<Hooks> hooks_;
  std::vector<bool> reduced_;  // [units] grads already reduced in this micro batch
  int64_t step_ = 0;           // optimizer steps done
  int64_t micro_ = 0;          // micro batches since the last step
  bool part_open_ = false;     // a micro batch's first parts went through backward
  double loss_sum_ = 0.0;      // this rank's losses since the last step
  ExportMemory export_memory_;
  transport::CollectiveTraffic step_start_traffic_;  // the group's, at the step's first backward
  transport::CollectiveTraffic last_step_traffic_;
  bool traffic_window_open_ = false;
  HostOffload optimizer_offload_;  // the optimizer state while offloaded
  LossScaler scaler_;              // FP16 compute: the dynamic loss scale (else S = 1)
};

}  // namespace rlhf::engine
