#include "engine/sharded_unit_memory.h"

#include <algorithm>
#include <utility>

namespace rlhf::engine {

namespace {

int64_t div_up(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

}  // namespace

int64_t EngineLayout::gathered_bytes(size_t u, bool with_frozen) const {
  if (stage != 3) return 0;
  return e * (div_up(trained[u], world) + (with_frozen ? div_up(frozen_at(u), world) : 0)) * world +
         e * expert_shard(u) * edp;
}

int64_t EngineLayout::expert_shard(size_t u) const {
  return div_up(experts_at(u), edp);
}

int64_t EngineLayout::reduce_buffer_bytes(size_t u) const {
  const int64_t shard = div_up(trained[u], world);
  return std::max(4 * (shard * world + shard), 4 * (expert_shard(u) * edp + expert_shard(u)));
}

int64_t EngineLayout::frozen_total() const {
  int64_t n = 0;
  for (int64_t f : frozen) n += f;
  return n;
}

bool EngineLayout::kept_through_backward(size_t u) const {
  return trained[u] > 0 || u > 0 || tied;
}

EnginePeak engine_peak(const EngineLayout& l, bool state_off_device) {
  EnginePeak p;
  const std::vector<int64_t>& units = l.trained;
  const int world = l.world, stage = l.stage;
  const int64_t e = l.e;
  std::vector<int64_t> shard, padded, gathered;
  for (size_t u = 0; u < units.size(); ++u) {
    const int64_t s = div_up(units[u], world);
    shard.push_back(s);
    padded.push_back(s * world);
    gathered.push_back(l.gathered_bytes(u));
  }
  for (size_t u = 0; u < units.size(); ++u) {
    const int64_t es = l.expert_shard(u);  // an expert unit's states, over the EDP group
    p.master += 4 * (shard[u] + es);
    p.optimizer += 8 * (shard[u] + es);
    p.grads += 4 * (stage == 1 ? padded[u] + es * l.edp : shard[u] + es);
    if (stage < 3) {
      // The model's own parameters, unpadded.
      p.weights += e * (units[u] + l.frozen_at(u) + l.experts_at(u));
    } else {
      p.weights += e * div_up(l.frozen_at(u), world);          // the frozen shard
      if (state_off_device) p.weights += e * (shard[u] + es);  // cached compute shards
    }
  }
  // Transient sets: {gathered, buffers}; the peak is the largest sum.
  std::vector<std::pair<int64_t, int64_t>> sets;
  const size_t head = units.size() - 1;
  auto reduce_buffer = [&](size_t u) { return l.reduce_buffer_bytes(u); };  // flat FP32 + shard
  auto kept = [&](size_t u) { return l.kept_through_backward(u) ? gathered[u] : 0; };
  if (stage < 3) {
    for (size_t u = 0; u < units.size(); ++u) {
      // refresh_params all-gathers (the experts' unit after the rest)
      sets.push_back({0, e * std::max(padded[u], l.expert_shard(u) * l.edp)});
      if (stage == 2) sets.push_back({0, reduce_buffer(u)});  // reduce-scatter in backward
    }
  } else if (l.checkpointing) {
    // Embeddings (unless frozen and untied: freed after their forward) and head stay gathered
    // from forward to the end of backward (autograd holds them); each layer is gathered for
    // its recompute, released when the recompute's graph is gone (CheckpointedLayer calls
    // after_forward first), then reduce-scattered.
    const int64_t ends = kept(0) + gathered[head];
    sets.push_back({gathered[0], 0});
    int64_t largest_layer = 0;
    for (size_t u = 1; u < head; ++u) {
      sets.push_back({ends + gathered[u], 0});
      sets.push_back({ends, reduce_buffer(u)});
      largest_layer = std::max(largest_layer, gathered[u]);
    }
    sets.push_back({ends, reduce_buffer(0)});
    sets.push_back({gathered[head], reduce_buffer(head)});
    p.forward_gathered = ends + largest_layer;
  } else {
    // Every unit the graph reads stays gathered through backward; the trainer then reduces
    // them in order, releasing each after its reduce-scatter.
    int64_t alive = 0;
    for (size_t u = 0; u < units.size(); ++u) alive += kept(u);
    p.forward_gathered = alive;
    sets.push_back({gathered[0], 0});
    for (size_t u = 0; u < units.size(); ++u) {
      sets.push_back({alive, reduce_buffer(u)});
      alive -= kept(u);
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

int64_t engine_score_gathered(const EngineLayout& l) {
  int64_t most = 0;
  const size_t head = l.trained.size() - 1;
  for (size_t u = 0; u <= head; ++u)
    most = std::max(most, l.gathered_bytes(u) + (u == head && l.tied ? l.gathered_bytes(0) : 0));
  return most;
}

transport::CollectiveTraffic engine_collectives(const EngineLayout& l, int64_t backward_calls) {
  transport::CollectiveTraffic t;
  const size_t head = l.trained.size() - 1;
  const int world = l.world, stage = l.stage;
  auto padded = [&](int64_t n) { return div_up(n, world) * world; };
  for (size_t u = 0; u <= head; ++u) {
    // Stage 1/2: refresh_params after the step; stage 3: gather() per forward, twice for a
    // checkpointed decoder layer (its recompute in backward).
    const bool layer = u > 0 && u < head;
    const int64_t gathers = stage < 3 ? 1 : backward_calls * (l.checkpointing && layer ? 2 : 1);
    if (stage == 3 && l.frozen_at(u) > 0) {  // the frozen buffer, gathered with the unit
      const int64_t again = u == 0 && l.tied && l.trained[0] == 0 ? backward_calls : 0;
      t.all_gather += (gathers + again) * l.e * padded(l.frozen_at(u));
      t.calls += gathers + again;
    }
    // The unit's trained states over the world, its experts' over their EDP group (the
    // same calls there); a ShardedUnit with no slots runs no collective.
    for (const auto& [n, ranks] : {std::pair<int64_t, int>{l.trained[u], world},
                                   std::pair<int64_t, int>{l.experts_at(u), l.edp}}) {
      if (n == 0) continue;
      const int64_t full = div_up(n, ranks) * ranks;
      if (stage == 1) {
        if (ranks > 1) {
          t.all_reduce += 4 * full;  // finish_grads
          t.calls += 1;
        }
      } else {
        t.reduce_scatter += backward_calls * 4 * full;  // reduce_grads, FP32
        t.calls += backward_calls;
      }
      t.all_gather += gathers * l.e * full;
      t.calls += gathers;
    }
  }
  t.all_reduce += 2 * 8;  // Trainer::step: [sum of g^2, loss] in FP64
  t.calls += 1;
  return t;
}

}  // namespace rlhf::engine
