// The bytes the sharded engine holds, replayed from ShardedUnit and Trainer (sharded_unit.cpp,
// trainer.cpp) for the memory planner: beside the units whose allocations it counts.
#pragma once

#include <cstdint>
#include <vector>

#include "transport/collective_group.h"

namespace rlhf::engine {

// A trainer's units as ShardedUnit lays them out, for the replays below.
struct EngineLayout {
  std::vector<int64_t> trained;  // trained elements per unit (embeddings, layers, head)
  std::vector<int64_t> frozen;   // frozen elements per unit (a LoRA base); empty: none
  int world = 1;
  int stage = 3;  // ZeRO stage 1-3
  int64_t e = 2;  // bytes per compute-dtype element
  bool checkpointing = true;
  bool tied = false;  // the head reads unit 0's matrix (gathered with the head)
  // Expert parallelism (Trainer: a sparse layer's routed experts as their own unit): per unit
  // the expert elements this rank holds (the layer's / ep), sharded over the `edp` ranks that
  // hold the same experts; `trained` then counts the rest. Empty: none.
  std::vector<int64_t> experts;
  int ep = 1, edp = 1;

  int64_t frozen_at(size_t u) const { return u < frozen.size() ? frozen[u] : 0; }
  int64_t experts_at(size_t u) const { return u < experts.size() ? experts[u] : 0; }
  int64_t expert_shard(size_t u) const;  // this rank's shard of unit u's experts
  // The FP32 reduce-scatter buffers of unit u's backward (flat gradient and shard; its
  // experts' after the rest, one set at a time: the larger).
  int64_t reduce_buffer_bytes(size_t u) const;
  int64_t frozen_total() const;  // frozen elements over all units
  // Stage 3: the bytes gathering unit u holds (trainable and, unless `with_frozen` is false,
  // frozen flat buffers, each padded to a multiple of the world); 0 at stage 1/2.
  int64_t gathered_bytes(size_t u, bool with_frozen = true) const;
  // Stage 3 training: unit u stays gathered from its forward to the end of backward because
  // the graph reads it (trained parameters, or a frozen one whose input needs a gradient);
  // a frozen embedding is freed after its forward (its input is token ids).
  bool kept_through_backward(size_t u) const;
};

// The engine's peak: model states always, plus the largest transient set of gathered units
// (stage 3) and collective buffers. Frozen weights count in `weights` (whole at stage 1/2,
// a 1/N shard at stage 3).
struct EnginePeak {
  int64_t weights = 0, master = 0, optimizer = 0, grads = 0, gathered = 0, buffers = 0;
  int64_t forward_gathered = 0;  // stage 3: gathered at the end of a training forward
};

// `state_off_device`: master and AdamW state on the host.
EnginePeak engine_peak(const EngineLayout& layout, bool state_off_device);

// Stage 3, a forward without grad (scoring): the most it holds gathered at once (one unit;
// the head with a tied embedding); 0 at stage 1/2.
int64_t engine_score_gathered(const EngineLayout& layout);

// The collectives one rank runs in one optimizer step of the trainer, replayed from
// ShardedUnit and Trainer as engine_peak is (payload bytes by kind, transport/collective_group.h),
// for `backward_calls` backward() calls (micro batches, or their parts under a token budget):
//   stage 1  each unit's FP32 gradient all-reduced once (world > 1), its new compute-dtype
//            weights all-gathered once (refresh_params);
//   stage 2  each unit's FP32 gradient reduce-scattered in every backward, the weights
//            all-gathered once;
//   stage 3  the reduce-scatters of stage 2, and each unit's weights (its trained and its
//            frozen buffer, one all-gather each) gathered for every forward (embeddings, head)
//            and again for a checkpointed layer's recompute; with tied embeddings and a frozen
//            embedding unit, the head gathers unit 0 once more;
// and one all-reduce of two doubles (the gradient norm and the loss). Units with no trained
// elements run no gradient collective. An expert unit runs its unit's calls over its EDP
// group; expert parallelism's all-to-alls (their bytes depend on the routing) are not here.
transport::CollectiveTraffic engine_collectives(const EngineLayout& layout, int64_t backward_calls);

}  // namespace rlhf::engine
