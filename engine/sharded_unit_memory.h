// The bytes the sharded engine holds, replayed from ShardedUnit and Trainer (sharded_unit.cpp,
// trainer.cpp) for the memory planner: beside the units whose allocations it counts.
#pragma once

#include <cstdint>
#include <vector>

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

}  // namespace rlhf::engine
