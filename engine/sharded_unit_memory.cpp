#include "engine/sharded_unit_memory.h"

#include <utility>

namespace rlhf::engine {

namespace {

int64_t div_up(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

}  // namespace

// Tied embeddings need nothing extra: the head gathers unit 0, which training keeps
// gathered anyway.
EnginePeak engine_peak(const std::vector<int64_t>& units, int world, int stage, int64_t e,
                       bool state_off_device, bool checkpointing) {
  EnginePeak p;
  std::vector<int64_t> shard, padded, gathered;
  for (int64_t n : units) {
    const int64_t s = div_up(n, world);
    shard.push_back(s);
    padded.push_back(s * world);
    gathered.push_back(s * world * e);
  }
  for (size_t u = 0; u < units.size(); ++u) {
    p.master += 4 * shard[u];
    p.optimizer += 8 * shard[u];
    p.grads += 4 * (stage == 1 ? padded[u] : shard[u]);
    if (stage < 3)
      p.weights += e * units[u];  // the model's own parameters, unpadded
    else if (state_off_device)
      p.weights += e * shard[u];  // cached compute shard
  }
  // Transient sets: {gathered, buffers}; the peak is the largest sum.
  std::vector<std::pair<int64_t, int64_t>> sets;
  const size_t head = units.size() - 1;
  auto reduce_buffer = [&](size_t u) { return 4 * (padded[u] + shard[u]); };  // flat FP32 + shard
  if (stage < 3) {
    for (size_t u = 0; u < units.size(); ++u) {
      sets.push_back({0, e * padded[u]});                     // refresh_params all-gather
      if (stage == 2) sets.push_back({0, reduce_buffer(u)});  // reduce-scatter in backward
    }
  } else if (checkpointing) {
    // Embeddings and head stay gathered from forward to the end of backward (autograd holds
    // them); each layer is gathered for its recompute, released when the recompute's graph
    // is gone (CheckpointedLayer calls after_forward first), then reduce-scattered.
    const int64_t ends = gathered[0] + gathered[head];
    for (size_t u = 1; u < head; ++u) {
      sets.push_back({ends + gathered[u], 0});
      sets.push_back({ends, reduce_buffer(u)});
    }
    sets.push_back({ends, reduce_buffer(0)});
    sets.push_back({gathered[head], reduce_buffer(head)});
  } else {
    // Every unit stays gathered through backward; the trainer then reduces them in order,
    // releasing each after its reduce-scatter.
    int64_t alive = 0;
    for (int64_t g : gathered) alive += g;
    for (size_t u = 0; u < units.size(); ++u) {
      sets.push_back({alive, reduce_buffer(u)});
      alive -= gathered[u];
    }
  }
  for (const auto& [g, b] : sets) {
    if (g + b > p.gathered + p.buffers) {
      p.gathered = g;
      p.buffers = b;
    }
  }
  return p;
}

transport::CollectiveTraffic engine_collectives(const std::vector<int64_t>& units, int world,
                                                int stage, int64_t e, bool checkpointing,
                                                int64_t backward_calls) {
  transport::CollectiveTraffic t;
  const size_t head = units.size() - 1;
  for (size_t u = 0; u < units.size(); ++u) {
    if (units[u] == 0) continue;  // ShardedUnit with no slots: no collective
    const int64_t padded = div_up(units[u], world) * world;
    if (stage == 1) {
      if (world > 1) {
        t.all_reduce += 4 * padded;  // finish_grads
        t.calls += 1;
      }
    } else {
      t.reduce_scatter += backward_calls * 4 * padded;  // reduce_grads, FP32
      t.calls += backward_calls;
    }
    // Stage 1/2: refresh_params after the step; stage 3: gather() per forward, twice for a
    // checkpointed decoder layer (its recompute in backward).
    const bool layer = u > 0 && u < head;
    const int64_t gathers = stage < 3 ? 1 : backward_calls * (checkpointing && layer ? 2 : 1);
    t.all_gather += gathers * e * padded;
    t.calls += gathers;
  }
  t.all_reduce += 2 * 8;  // Trainer::step: [sum of g^2, loss] in FP64
  t.calls += 1;
  return t;
}

}  // namespace rlhf::engine
