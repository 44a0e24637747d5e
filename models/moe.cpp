// The sparse mixture-of-experts block; see moe.h.
#include "models/moe.h"

#include <torch/autograd.h>

#include "models/decoder_layer.h"
#include "models/expert_parallel.h"

namespace rlhf::models {

namespace {

torch::Tensor activate(Activation activation, const torch::Tensor& gate) {
  return activation == Activation::kGeluTanh ? torch::gelu(gate, "tanh") : torch::silu(gate);
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The block's output unchanged; in backward, the AuxLoss's gradient for the block's
// probability sums [E] (the AuxLoss outlives the graph: its scope ends after backward).
class AuxGradient : public torch::autograd::Function<AuxGradient> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& out,
                               const torch::Tensor& /*sums*/, int64_t aux) {
    ctx->saved_data["aux"] = aux;
    return out.clone();
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto* aux =
        reinterpret_cast<const AuxLoss*>(static_cast<intptr_t>(ctx->saved_data["aux"].toInt()));
    return {grads[0], aux->sums_grad(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor routing_scales(const Routes& routes, bool fp32_weights, torch::Dtype dtype) {
  return (fp32_weights ? routes.weights : routes.weights.to(dtype)).reshape({-1});
}

void AuxLoss::begin(torch::Tensor token_mask, double grad_scale) {
  mask_ = token_mask.defined() ? token_mask.to(torch::kFloat32) : torch::Tensor();
  grad_scale_ = grad_scale;
  sealed_ = false;
  counts_ = sums_ = rows_ = torch::Tensor();
}

double AuxLoss::value() const {
  if (!rows_.defined()) return 0.0;
  const auto R = rows_.clamp_min(1);
  return (static_cast<double>(experts_) * ((counts_ / R) * (sums_ / R)).sum()).item<double>();
}

torch::Tensor AuxLoss::sums_grad() const {
  TORCH_CHECK(sealed_, "AuxLoss: backward before seal()");
  const auto R = rows_.clamp_min(1);
  return counts_ * (grad_scale_ * static_cast<double>(experts_)) / (R * R);
}

torch::Tensor AuxLoss::attach(const torch::Tensor& out, const Routes& routes) {
  const torch::Tensor& probs = routes.probs;  // [N, E] FP32
  const int64_t N = probs.size(0), k = routes.own.size(1);
  const torch::Tensor mask =
      mask_.defined() ? mask_.to(probs.device()) : torch::ones({N}, probs.options());
  TORCH_CHECK(mask.size(0) == N, "AuxLoss: a token mask of ", mask.size(0), " for ", N, " tokens");
  const torch::Tensor weighted = probs * mask.unsqueeze(-1);
  if (!sealed_) {
    const auto zeros = torch::zeros({experts_}, probs.options());
    const auto counts = zeros.scatter_add(0, routes.own.reshape({-1}), mask.repeat_interleave(k));
    const auto sums = weighted.detach().sum(0);
    counts_ = counts_.defined() ? counts_ + counts : counts;
    sums_ = sums_.defined() ? sums_ + sums : sums;
    rows_ = rows_.defined() ? rows_ + mask.sum() : mask.sum();
  }
  if (!torch::GradMode::is_enabled() || grad_scale_ == 0.0) return out;
  return AuxGradient::apply(out, weighted.sum(0),
                            static_cast<int64_t>(reinterpret_cast<intptr_t>(this)));
}

ExpertImpl::ExpertImpl(int64_t H, int64_t I, bool mixtral_names, Activation activation,
                       Materialize how)
    : mixtral_names_(mixtral_names), activation_(activation) {
  // HF's registration order: Qwen2MoeMLP gate, up, down; Mixtral's expert w1, w2, w3.
  if (mixtral_names) {
    gate = register_module("w1", Linear(H, I, false, how));
    down = register_module("w2", Linear(I, H, false, how));
    up = register_module("w3", Linear(H, I, false, how));
  } else {
    gate = register_module("gate_proj", Linear(H, I, false, how));
    up = register_module("up_proj", Linear(H, I, false, how));
    down = register_module("down_proj", Linear(I, H, false, how));
  }
}

torch::Tensor ExpertImpl::forward(const torch::Tensor& x) {
  return down->forward(activate(activation_, gate->forward(x)) * up->forward(x));
}

std::vector<std::pair<std::string, Linear>> ExpertImpl::linears() const {
  if (mixtral_names_) return {{"w1", gate}, {"w2", down}, {"w3", up}};
  return {{"gate_proj", gate}, {"up_proj", up}, {"down_proj", down}};
}

SparseMoeImpl::SparseMoeImpl(const ModelConfig& c, const LayerSpec& spec, Materialize how,
                             const TensorParallel* tp, const ExpertParallel* ep)
    : spec_(spec.moe),
      tp_(tp),
      ep_(ep && ep->enabled() ? ep : nullptr),
      activation_(spec.activation) {
  const int64_t H = c.hidden_size;
  const int64_t slices = tp ? tp->size : 1;  // each expert's intermediate rows split this way
  TORCH_CHECK(spec_.sparse() && spec_.top_k >= 1 && spec_.top_k <= spec_.experts,
              "SparseMoe: top_k ", spec_.top_k, " of ", spec_.experts, " experts");
  // HF's registration order: Qwen2-MoE gate, experts, shared_expert, shared_expert_gate;
  // Qwen3-MoE experts then gate; Mixtral gate then experts. One order here (the parameter
  // layout follows it, param_layout.cpp); checkpoints are read by name.
  gate = register_module("gate", Linear(H, spec_.experts, false, how));
  int64_t local = spec_.experts;
  if (ep_) {
    TORCH_CHECK(spec_.experts % ep_->size == 0, "SparseMoe: ", spec_.experts,
                " experts do not split over ", ep_->size, " expert-parallel ranks");
    local = spec_.experts / ep_->size;
    first_expert_ = local * ep_->rank;
  }
  auto holder = register_module("experts", std::make_shared<torch::nn::Module>());
  for (int64_t e = 0; e < local; ++e)
    experts.push_back(holder->register_module(
        std::to_string(first_expert_ + e),
        Expert(H, spec_.intermediate / slices, spec_.mixtral_names, spec.activation, how)));
  if (spec_.shared_intermediate > 0) {
    ModelConfig shared = c;
    shared.intermediate_size = spec_.shared_intermediate / slices;
    LayerSpec dense = spec;
    dense.mlp_bias = false;
    shared_expert =
        register_module("shared_expert", std::make_shared<MlpImpl>(shared, dense, how, tp));
    shared_expert_gate = register_module("shared_expert_gate", Linear(H, 1, false, how));
  }
}

Routes SparseMoeImpl::route(const torch::Tensor& tokens) {
  Routes r;
  r.logits = gate->forward(tokens);                            // [N, E]
  auto probs = torch::softmax(r.logits, -1, torch::kFloat32);  // FP32, as HF
  auto [top, index] = probs.topk(spec_.top_k, /*dim=*/-1);     // [N, k] each
  r.probs = probs;
  r.own = index;
  if (replay.defined()) {  // routing replay: these experts, the current router's weights
    TORCH_CHECK(
        replay.dim() == 2 && replay.size(0) == tokens.size(0) && replay.size(1) == spec_.top_k,
        "SparseMoe: replayed routes are ", replay.sizes(), ", expected [", tokens.size(0), ", ",
        spec_.top_k, "]");
    const torch::Tensor want = replay.to(probs.device(), torch::kInt64);
    index = torch::where(want < 0, index, want);  // -1: not recorded, the router's own
    top = probs.gather(-1, index);
  }
  r.weights = spec_.norm_topk ? top / top.sum(-1, /*keepdim=*/true) : top;
  r.experts = index;
  return r;
}

void SparseMoeImpl::use_grouped_gemm(bool on_cpu) {
  if (ep_ || (!on_cpu && !gate->weight.is_cuda()) || grouped_gemm()) return;
  for (const auto& [name, linear] : linears())
    if (linear->lora && !linear->lora->merged) return;  // the loop adds the adapter's term
  stack_experts();
}

void SparseMoeImpl::stack_experts() {
  torch::NoGradGuard no_grad;
  const auto first = experts[0]->as<ExpertImpl>();
  const int64_t E = local_experts(), I = first->gate->weight.size(0);
  const int64_t H = first->gate->weight.size(1);
  w13_ = torch::empty({E, 2 * I, H}, first->gate->weight.options());
  w2_ = torch::empty({E, H, I}, first->down->weight.options());
  for (int64_t e = 0; e < E; ++e) {
    auto* x = experts[e]->as<ExpertImpl>();
    w13_[e].narrow(0, 0, I).copy_(x->gate->weight);
    w13_[e].narrow(0, I, I).copy_(x->up->weight);
    w2_[e].copy_(x->down->weight);
    x->gate->weight.set_data(w13_[e].narrow(0, 0, I));
    x->up->weight.set_data(w13_[e].narrow(0, I, I));
    x->down->weight.set_data(w2_[e]);
  }
}

bool SparseMoeImpl::stacks_viewed() {
  const int64_t I = w13_.size(1) / 2;
  for (int64_t e = 0; e < local_experts(); ++e) {
    const auto* x = experts[e]->as<ExpertImpl>();
    if (x->gate->weight.data_ptr() != w13_[e].data_ptr() ||
        x->up->weight.data_ptr() != w13_[e].narrow(0, I, I).data_ptr() ||
        x->down->weight.data_ptr() != w2_[e].data_ptr())
      return false;
  }
  return true;
}

// Every expert's pairs in two grouped GEMMs over the stacks: the pairs sorted by expert, the
// groups' ends on the device (no host read).
torch::Tensor SparseMoeImpl::grouped_forward(const torch::Tensor& tokens, const Routes& routes) {
  if (!stacks_viewed()) stack_experts();
  const int64_t k = spec_.top_k, I = w13_.size(1) / 2;
  const torch::Tensor flat = routes.experts.reshape({-1});  // [N k]
  const torch::Tensor order = flat.argsort(/*stable=*/true);
  const torch::Tensor rows = order.div(k, "floor");
  const torch::Tensor ends =
      torch::bincount(flat, /*weights=*/{}, spec_.experts).cumsum(0).to(torch::kInt32);
  const torch::Tensor x = tokens.index_select(0, rows);
  const torch::Tensor h = at::_grouped_mm(x, w13_.transpose(1, 2), ends);  // [N k, 2 I]
  const torch::Tensor a =
      (activate(activation_, h.narrow(1, 0, I)) * h.narrow(1, I, I)).contiguous();
  torch::Tensor out = at::_grouped_mm(a, w2_.transpose(1, 2), ends);  // [N k, H]
  const torch::Tensor weights = routing_scales(routes, spec_.fp32_weights, tokens.scalar_type());
  out = (out * weights.index_select(0, order).unsqueeze(-1)).to(tokens.scalar_type());
  return torch::zeros_like(tokens).index_add_(0, rows, out);
}

torch::Tensor SparseMoeImpl::experts_forward(const torch::Tensor& tokens, const Routes& routes) {
  TORCH_CHECK(!ep_, "SparseMoe: an expert-parallel block computes its experts with its group");
  if (grouped_gemm() && !grouped_refused_ && !torch::GradMode::is_enabled()) {
    try {
      return grouped_forward(tokens, routes);
    } catch (const c10::Error& e) {
      grouped_refused_ = true;  // e.g. a dtype or an alignment the kernel does not take
      TORCH_WARN("SparseMoe: torch's grouped GEMM refused (", e.what_without_backtrace(),
                 "); the experts run one GEMM each");
    }
  }
  const int64_t k = spec_.top_k;
  // Each (token, slot) pair sorted by expert, so an expert's tokens are one contiguous run.
  const torch::Tensor flat = routes.experts.reshape({-1});  // [N k]
  const torch::Tensor order = flat.argsort(/*stable=*/true);
  const torch::Tensor counts =
      torch::bincount(flat, /*weights=*/{}, spec_.experts).to(torch::kCPU);  // one host sync
  const torch::Tensor weights = routing_scales(routes, spec_.fp32_weights, tokens.scalar_type());
  torch::Tensor out = torch::zeros_like(tokens);
  const auto* count = counts.data_ptr<int64_t>();
  int64_t start = 0;
  for (int64_t e = 0; e < spec_.experts; ++e) {
    const int64_t n = count[e];
    if (n == 0) continue;
    const torch::Tensor pairs = order.narrow(0, start, n);
    start += n;
    const torch::Tensor rows = pairs.div(k, "floor");
    auto h = experts[e]->as<ExpertImpl>()->forward(tokens.index_select(0, rows));
    h = (h * weights.index_select(0, pairs).unsqueeze(-1)).to(tokens.scalar_type());
    out.index_add_(0, rows, h);
  }
  return out;
}

torch::Tensor SparseMoeImpl::forward(const torch::Tensor& x) {
  const torch::Tensor tokens = x.reshape({-1, x.size(-1)});
  Routes routes = route(tokens);
  torch::Tensor out;
  if (ep_) {  // this rank's experts on every EP rank's pairs routed to them, and back
    std::vector<ExpertImpl*> local;
    for (int64_t e = 0; e < local_experts(); ++e) local.push_back(experts[e]->as<ExpertImpl>());
    out = expert_parallel_forward(tokens, routes, local, first_expert_, spec_.experts,
                                  spec_.fp32_weights, *ep_->group);
  } else {
    out = experts_forward(tokens, routes);
  }
  if (record) record->push_back(routes);
  if (tp_) tensor_parallel_all_reduce(*tp_, out);  // each rank's slices' partial sums
  if (aux) out = aux->attach(out, routes);
  if (shared_expert)  // Qwen2MoeSparseMoeBlock: sigmoid(gate(x)) * shared(x), added
    out =
        out + torch::sigmoid(shared_expert_gate->forward(tokens)) * shared_expert->forward(tokens);
  return out.view(x.sizes());
}

std::vector<std::pair<std::string, Linear>> SparseMoeImpl::linears() {
  std::vector<std::pair<std::string, Linear>> out;
  for (int64_t e = 0; e < local_experts(); ++e)
    for (auto& [name, linear] : experts[e]->as<ExpertImpl>()->linears())
      out.emplace_back("experts." + std::to_string(first_expert_ + e) + "." + name, linear);
  if (shared_expert)
    for (const auto& [name, linear] :
         {std::pair<std::string, Linear>{"gate_proj", shared_expert->gate_proj},
          {"up_proj", shared_expert->up_proj},
          {"down_proj", shared_expert->down_proj}})
      out.emplace_back("shared_expert." + name, linear);
  return out;
}

}  // namespace rlhf::models
