// Routing replay (R3, issue 43.4) for a whole model: every sparse layer's choice of experts
// as one token-major tensor [N, S, k] (N tokens in the order the forwards saw them, S the
// model's sparse layers in order, k its top-k), int16, -1 where a token has none (a padding
// column, a token the rollout never fed). A RouteRecorder collects what the forwards in its
// scope chose; a RouteReplay makes the forwards in its scope (and their checkpointed
// recomputes in backward) use given routes (SparseMoeImpl::replay). A forward's tokens are its
// input's rows end to end ([B, T] -> B * T, row-major), padding included. An AuxLossScope
// puts the load-balancing loss (moe.h's AuxLoss) on the same blocks.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "models/moe.h"

namespace rlhf::models {

class CausalLM;

constexpr torch::Dtype kRouteDtype = torch::kInt16;

// The model's sparse blocks, in layer order (empty for a dense model).
std::vector<SparseMoeImpl*> sparse_blocks(CausalLM& model);

// Records every sparse layer's routes from construction to destruction.
class RouteRecorder {
 public:
  explicit RouteRecorder(CausalLM& model);
  ~RouteRecorder();
  RouteRecorder(const RouteRecorder&) = delete;
  RouteRecorder& operator=(const RouteRecorder&) = delete;

  struct Taken {
    torch::Tensor used;  // [N, S, k] the experts the forwards ran
    torch::Tensor own;   // [N, S, k] the routers' own top-k (`used` unless replayed)
  };
  // The routes of the forwards since the last take (CPU, kRouteDtype); empty tensors [0, S, k]
  // when none ran. Each row's experts in descending order of router probability.
  Taken take();

 private:
  std::vector<SparseMoeImpl*> blocks_;
  std::vector<std::vector<Routes>> seen_;  // per block
};

// Replays routes from set() on to destruction (or the next set()).
class RouteReplay {
 public:
  explicit RouteReplay(CausalLM& model);
  ~RouteReplay();
  RouteReplay(const RouteReplay&) = delete;
  RouteReplay& operator=(const RouteReplay&) = delete;

  // routes [N, S, k] for the next forwards' N tokens, or undefined to route freely. Throws
  // c10::Error when S or k is not the model's.
  void set(const torch::Tensor& routes);

 private:
  std::vector<SparseMoeImpl*> blocks_;
};

// The load-balancing loss (moe.h's AuxLoss) on every sparse block of a model, from
// construction to destruction (which must come after the backward of its last forward).
class AuxLossScope {
 public:
  explicit AuxLossScope(CausalLM& model);
  ~AuxLossScope();
  AuxLossScope(const AuxLossScope&) = delete;
  AuxLossScope& operator=(const AuxLossScope&) = delete;
  bool sparse() const { return !blocks_.empty(); }  // false: a dense model, nothing to do
  AuxLoss& loss() { return *loss_; }

 private:
  std::vector<SparseMoeImpl*> blocks_;
  std::unique_ptr<AuxLoss> loss_;
};

// A batch's routes [B, T, S, k] in a forward's token order: padded rows as they are
// ([B * T, S, k]), or with `packed` the tokens where attention_mask [B, T] != 0, row by row
// (engine::pack_rows' order).
torch::Tensor forward_routes(const torch::Tensor& routes, const torch::Tensor& attention_mask,
                             bool packed);

// Per row of routes `a` and `b` [B, T, S, k] (-1 where absent): the tokens both recorded, and
// those whose experts differ as a set in at least one layer. Returns {[B], [B]} int64.
std::pair<torch::Tensor, torch::Tensor> count_route_differences(const torch::Tensor& a,
                                                                const torch::Tensor& b);

}  // namespace rlhf::models
