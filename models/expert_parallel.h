// Expert parallelism (issue 43.2), the sparse block's half: each rank of a group holds a
// contiguous range of a layer's experts, and each (token, slot) pair travels to the rank that
// holds its expert and back by all-to-all (its row counts exchanged first), in forward and,
// transposed, in backward. Built and tested against the single-rank block
// (tests/models/expert_parallel_test.cpp); the trainer does not use it yet: building only a
// rank's experts, their ZeRO unit over the expert-data-parallel group, checkpoints per expert
// shard and the export are what remains (docs/ppo.md).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <vector>

#include "models/moe.h"

namespace rlhf::transport {
class CollectiveGroup;
}

namespace rlhf::models {

// y = all-to-all of x's rows (CollectiveGroup::all_to_all: `send` rows to each rank, `receive`
// from each); its gradient goes back the same way, transposed. Every rank of `group` calls it.
torch::Tensor all_to_all_rows(const torch::Tensor& x, const std::vector<int64_t>& receive,
                              const std::vector<int64_t>& send, transport::CollectiveGroup& group);

// The routed experts' weighted sum for this rank's tokens [N, H] routed by `routes` (experts
// [N, k] of `experts` in all, weights [N, k]), computed by the group: this rank runs `local`,
// experts [first, first + local.size()) of every rank's pairs routed to them. The group's
// ranks hold equal ranges in rank order and call it together (each with its own tokens, any
// N, 0 included). `fp32_weights`: Mixtral scales in FP32 (SparseMoeImpl::experts_forward).
// Differentiable in the tokens, the weights and the local experts' parameters.
torch::Tensor expert_parallel_forward(const torch::Tensor& tokens, const Routes& routes,
                                      const std::vector<ExpertImpl*>& local, int64_t first,
                                      int64_t experts, bool fp32_weights,
                                      transport::CollectiveGroup& group);

}  // namespace rlhf::models
