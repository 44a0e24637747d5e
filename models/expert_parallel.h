// Expert parallelism (issue 43.2), the sparse block's half: each rank of a group holds a
// contiguous range of a layer's experts, and each (token, slot) pair travels to the rank that
// holds its expert and back by all-to-all (its row counts exchanged first), in forward and,
// transposed, in backward. A model built with ExpertParallel (moe.h) builds only its range
// and calls expert_parallel_forward in every sparse layer; the trainer (engine/trainer.h)
// keeps those experts as their own ZeRO unit over the expert-data-parallel group.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>
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
// The routed expert a parameter name belongs to ("model.layers.1.mlp.experts.5.up_proj.weight"
// -> 5), or -1 (the router, a shared expert, anything else).
int64_t expert_index(const std::string& name);
// `name` with its expert index replaced by `expert` (expert_index(name) must be >= 0).
std::string with_expert_index(const std::string& name, int64_t expert);

// Throws InputError naming `what` when `ep_size` does not divide every sparse layer's experts
// or the model has no sparse layer (nothing to split).
void check_expert_parallel(const ModelConfig& config, int ep_size, const std::string& what);

torch::Tensor expert_parallel_forward(const torch::Tensor& tokens, const Routes& routes,
                                      const std::vector<ExpertImpl*>& local, int64_t first,
                                      int64_t experts, bool fp32_weights,
                                      transport::CollectiveGroup& group);

}  // namespace rlhf::models
