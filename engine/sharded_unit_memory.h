// The bytes the sharded engine holds, replayed from ShardedUnit and Trainer (sharded_unit.cpp,
// trainer.cpp) for the memory planner: beside the units whose allocations it counts.
#pragma once

#include <cstdint>
#include <vector>

#include "transport/collective_group.h"

namespace rlhf::engine {

// The engine's peak: model states always, plus the largest transient set of gathered units
// (stage 3) and collective buffers.
struct EnginePeak {
  int64_t weights = 0, master = 0, optimizer = 0, grads = 0, gathered = 0, buffers = 0;
};

// `units`: trained elements per sharded unit (embeddings, layers, head) over `world` ranks at
// ZeRO `stage`, e-byte compute weights; `state_off_device`: master and AdamW state on the host.
EnginePeak engine_peak(const std::vector<int64_t>& units, int world, int stage, int64_t e,
                       bool state_off_device, bool checkpointing);

// The collectives one rank runs in one optimizer step of the trainer, replayed from
// ShardedUnit and Trainer as engine_peak is (payload bytes by kind, transport/collective_group.h),
// for `backward_calls` backward() calls (micro batches, or their parts under a token budget):
//   stage 1  each unit's FP32 gradient all-reduced once (world > 1), its new compute-dtype
//            weights all-gathered once (refresh_params);
//   stage 2  each unit's FP32 gradient reduce-scattered in every backward, the weights
//            all-gathered once;
//   stage 3  the reduce-scatters of stage 2, and each unit's weights all-gathered for every
//            forward (embeddings, head) and again for a checkpointed layer's recompute;
// and one all-reduce of two doubles (the gradient norm and the loss). Units with no trained
// elements (a LoRA base) run none.
transport::CollectiveTraffic engine_collectives(const std::vector<int64_t>& units, int world,
                                                int stage, int64_t e, bool checkpointing,
                                                int64_t backward_calls);

}  // namespace rlhf::engine
