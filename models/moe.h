// The sparse mixture-of-experts block that replaces a layer's dense MLP (LayerSpec::moe):
// a router, the experts, and Qwen2-MoE's shared expert, as modules whose parameter names are
// the published checkpoints' (one tensor per expert). Numerics follow transformers'
// Qwen3MoeSparseMoeBlock / Qwen2MoeSparseMoeBlock / MixtralSparseMoeBlock: router logits in
// the parameters' dtype, softmax in FP32, torch.topk over the FP32 probabilities (so ties
// break as transformers breaks them: the same kernel on the same values), each expert run on
// the tokens routed to it and its output, scaled by the token's weight, added into the
// token's row.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/types.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "models/config.h"
#include "models/layer_spec.h"
#include "models/linear.h"

namespace rlhf::models {

class MlpImpl;

// What the router chose for the N tokens of one forward.
struct Routes {
  torch::Tensor logits;   // [N, experts], the parameters' dtype
  torch::Tensor weights;  // [N, top_k] FP32 (renormalised when the family does)
  torch::Tensor experts;  // [N, top_k] int64, in descending order of probability
};

// One expert: down(act(gate(x)) * up(x)), under the family's names (gate_proj / up_proj /
// down_proj, or Mixtral's w1 / w3 / w2).
class ExpertImpl : public torch::nn::Module {
 public:
  ExpertImpl(int64_t hidden, int64_t intermediate, bool mixtral_names, Activation activation,
             Materialize how);
  torch::Tensor forward(const torch::Tensor& x);  // [n, H] -> [n, H]
  // The three maps by their names in the checkpoint, in HF order.
  std::vector<std::pair<std::string, Linear>> linears() const;
  Linear gate{nullptr}, up{nullptr}, down{nullptr};

 private:
  bool mixtral_names_;
  Activation activation_;
};
TORCH_MODULE(Expert);

class SparseMoeImpl : public torch::nn::Module {
 public:
  SparseMoeImpl(const ModelConfig& config, const LayerSpec& spec, Materialize how);
  // [B, T, H] -> [B, T, H].
  torch::Tensor forward(const torch::Tensor& x);
  // The router's choice for tokens [N, H].
  Routes route(const torch::Tensor& tokens);
  // The routed experts' weighted sum for tokens [N, H] routed by `routes` (no shared expert).
  torch::Tensor experts_forward(const torch::Tensor& tokens, const Routes& routes);
  // Every linear map but the router's and the shared expert's gate, named relative to the
  // block ("experts.3.gate_proj", "shared_expert.up_proj"): the maps LoRA may target.
  std::vector<std::pair<std::string, Linear>> linears();
  const MoeSpec& spec() const { return spec_; }
  // When set, each forward appends its Routes here (the router logits a parity test compares;
  // what a rollout would record for routing replay). The caller owns the vector.
  std::vector<Routes>* record = nullptr;
  // Routing replay (R3): when defined, [N, top_k] int64, the experts each of the N tokens of
  // the next forwards uses instead of the router's top-k (what a rollout recorded for them).
  // The weights are the current router's probabilities at those experts (renormalised as the
  // family does), so the router still learns; a checkpointed layer's recompute sees the same
  // tensor. The caller sets and clears it around each forward.
  torch::Tensor replay;

  Linear gate{nullptr};  // the router: [experts, H], no bias
  torch::nn::ModuleList experts{nullptr};
  std::shared_ptr<MlpImpl> shared_expert;  // Qwen2-MoE; null otherwise
  Linear shared_expert_gate{nullptr};      // [1, H]

 private:
  MoeSpec spec_;
};

}  // namespace rlhf::models
