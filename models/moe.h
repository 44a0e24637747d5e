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
#include "models/tensor_parallel.h"

namespace rlhf::transport {
class CollectiveGroup;
}

namespace rlhf::models {

class MlpImpl;

// Expert parallelism in training (expert_parallel.h): the group whose ranks split each sparse
// layer's experts into equal contiguous ranges in rank order (this rank's: [rank E / size,
// (rank + 1) E / size)); its tokens travel to their experts by all-to-all over `group`.
struct ExpertParallel {
  int rank = 0;
  int size = 1;
  std::shared_ptr<transport::CollectiveGroup> group;  // size > 1: the EP group, in lockstep
  bool enabled() const { return size > 1; }
};

// What the router chose for the N tokens of one forward.
struct Routes {
  torch::Tensor logits;   // [N, experts], the parameters' dtype
  torch::Tensor probs;    // [N, experts] FP32: the softmax of the logits
  torch::Tensor weights;  // [N, top_k] FP32 (renormalised when the family does)
  torch::Tensor experts;  // [N, top_k] int64, in descending order of probability
  // [N, top_k] int64: the router's own top-k. `experts` itself unless a replay chose them.
  torch::Tensor own;
};

// The weights [N k] that scale each (token, slot) pair's expert output: FP32 when
// `fp32_weights` (Mixtral scales in FP32 and rounds the product), else rounded to the compute
// dtype `dtype` first (Qwen).
torch::Tensor routing_scales(const Routes& routes, bool fp32_weights, torch::Dtype dtype);

// The load-balancing loss of one forward's sparse layers (Switch Transformer eqs. 4-6, as
// transformers' load_balancing_loss_func computes it): aux = E * sum_e (C_e / R) * (S_e / R)
// over every sparse layer's tokens, padding left out: C_e the router's top-k selections of
// expert e, S_e its summed router probabilities, R the tokens times the sparse layers. C
// carries no gradient, so d aux / d S_e = E C_e / R^2, known once the last layer ran: blocks
// count during the forward, seal() closes the counts before backward, and each block's output
// carries its S into the graph (attach), so backward adds grad_scale x that gradient, in a
// checkpointed layer's recompute too (the recompute counts nothing: sealed).
class AuxLoss {
 public:
  explicit AuxLoss(int64_t experts) : experts_(experts) {}
  // A new forward: token_mask [N] (1 a token, 0 padding) for its N tokens, undefined for all
  // tokens; grad_scale: d(the loss backward runs on) / d aux, 0 for no gradient.
  void begin(torch::Tensor token_mask, double grad_scale);
  void seal() { sealed_ = true; }
  double value() const;  // aux of the forward since begin()
  // A block's routes of the forward: counted until sealed; returns `out` (the block's output)
  // carrying the gradient of its probability sums when grad mode is on and grad_scale != 0.
  torch::Tensor attach(const torch::Tensor& out, const Routes& routes);
  // d (grad_scale x aux) / d S_e, [E] FP32 (after seal()).
  torch::Tensor sums_grad() const;

 private:
  int64_t experts_;
  torch::Tensor mask_;  // [N] FP32 or undefined
  double grad_scale_ = 0;
  bool sealed_ = false;
  torch::Tensor counts_, sums_, rows_;  // [E], [E], [] FP32
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
  // `tp`, when enabled: this rank's slice of every expert (tensor_parallel.h), the routed sum
  // all-reduced over its group. `ep`, when enabled: only this rank's range of experts is built
  // (experts[i] is expert first_expert() + i, registered under its global index) and
  // the routed sum is computed by the EP group (expert_parallel_forward).
  SparseMoeImpl(const ModelConfig& config, const LayerSpec& spec, Materialize how,
                const TensorParallel* tp = nullptr, const ExpertParallel* ep = nullptr);
  // [B, T, H] -> [B, T, H].
  torch::Tensor forward(const torch::Tensor& x);
  // The router's choice for tokens [N, H].
  Routes route(const torch::Tensor& tokens);
  // The routed experts' weighted sum for tokens [N, H] routed by `routes` (no shared expert),
  // over this rank's experts (all of them unless expert-parallel).
  torch::Tensor experts_forward(const torch::Tensor& tokens, const Routes& routes);
  // Inference (the rollout engine, the scorers): every expert's gate and up weights stacked
  // as one [E, 2 I, H] tensor and their down weights as [E, H, I], each expert's linears
  // viewing their slices (a weight sync or LoRA merge writes through them), so that
  // experts_forward runs all experts in two grouped GEMMs (torch's _grouped_mm: CUTLASS on
  // sm90+ GPUs, a loop inside torch elsewhere) with no host read of the token counts. On the
  // CPU, where the block's own loop is as fast, only with `on_cpu` (tests). Not with grad (a
  // training forward runs the loop), LoRA adapters left unmerged or expert parallelism: then
  // a no-op. The stacks are rebuilt when a parameter no longer views them (sleep mode moved
  // the weights). If torch refuses the grouped GEMM (dtype, alignment), the loop runs.
  void use_grouped_gemm(bool on_cpu = false);
  bool grouped_gemm() const { return w13_.defined(); }
  bool grouped_gemm_refused() const { return grouped_refused_; }  // torch threw: the loop runs
  int64_t first_expert() const { return first_expert_; }          // experts[0]'s global index
  int64_t local_experts() const { return static_cast<int64_t>(experts.size()); }
  // Every linear map but the router's and the shared expert's gate, named relative to the
  // block ("experts.3.gate_proj", "shared_expert.up_proj"): the maps LoRA may target.
  std::vector<std::pair<std::string, Linear>> linears();
  const MoeSpec& spec() const { return spec_; }
  // When set, each forward appends its Routes here (the router logits a parity test compares;
  // what a rollout would record for routing replay). The caller owns the vector.
  std::vector<Routes>* record = nullptr;
  // Routing replay (R3): when defined, [N, top_k] integers, the experts each of the N tokens
  // of the next forwards uses instead of the router's top-k (what a rollout recorded for
  // them); a row of -1 (a token the rollout never fed, padding) takes the router's own. The
  // weights are the current router's probabilities at those experts (renormalised as the
  // family does), so the router still learns; a checkpointed layer's recompute sees the same
  // tensor. The caller sets and clears it (models/routes.h does, for a whole model).
  torch::Tensor replay;
  // When set, each forward adds its routes to this load-balancing loss (models/routes.h's
  // AuxLossScope sets it on every sparse block of a model).
  AuxLoss* aux = nullptr;

  Linear gate{nullptr};  // the router: [experts, H], no bias
  // This rank's experts (all of them unless expert-parallel): experts[i] is expert
  // first_expert() + i, registered under that global index ("experts.5.up_proj.weight").
  std::vector<Expert> experts;
  std::shared_ptr<MlpImpl> shared_expert;  // Qwen2-MoE; null otherwise
  Linear shared_expert_gate{nullptr};      // [1, H]

 private:
  MoeSpec spec_;
  const TensorParallel* tp_ = nullptr;
  const ExpertParallel* ep_ = nullptr;
  int64_t first_expert_ = 0;
  Activation activation_;   // the experts'
  torch::Tensor w13_, w2_;  // use_grouped_gemm: the stacked weights
  bool grouped_refused_ = false;
  void stack_experts();  // (re)builds w13_ / w2_ and points the linears at them
  bool stacks_viewed();  // every expert weight still a view of its stack slice
  torch::Tensor grouped_forward(const torch::Tensor& tokens, const Routes& routes);
};

}  // namespace rlhf::models
