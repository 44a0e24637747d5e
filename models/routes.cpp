// Routing replay for a whole model; see routes.h.
#include "models/routes.h"

#include <utility>

#include "models/causal_lm.h"
#include "models/decoder_layer.h"

namespace rlhf::models {

std::vector<SparseMoeImpl*> sparse_blocks(CausalLM& model) {
  std::vector<SparseMoeImpl*> out;
  for (int64_t i = 0; i < model.num_layers(); ++i) {
    auto* layer = model.layers->ptr(i)->as<DecoderLayerImpl>();
    if (layer->moe) out.push_back(layer->moe.get());
  }
  return out;
}

RouteRecorder::RouteRecorder(CausalLM& model)
    : blocks_(sparse_blocks(model)), seen_(blocks_.size()) {
  for (size_t i = 0; i < blocks_.size(); ++i) blocks_[i]->record = &seen_[i];
}

RouteRecorder::~RouteRecorder() {
  for (SparseMoeImpl* block : blocks_) block->record = nullptr;
}

RouteRecorder::Taken RouteRecorder::take() {
  const int64_t k = blocks_.empty() ? 0 : blocks_.front()->spec().top_k;
  std::vector<torch::Tensor> used, own;
  int64_t tokens = -1;
  for (size_t i = 0; i < blocks_.size(); ++i) {
    std::vector<torch::Tensor> u, o;
    for (const Routes& r : seen_[i]) {
      u.push_back(r.experts);
      o.push_back(r.own);
    }
    seen_[i].clear();
    torch::Tensor ui = u.empty() ? torch::empty({0, k}, torch::kInt64) : torch::cat(u);
    torch::Tensor oi = o.empty() ? torch::empty({0, k}, torch::kInt64) : torch::cat(o);
    TORCH_CHECK(tokens < 0 || ui.size(0) == tokens, "RouteRecorder: sparse layer ", i, " recorded ",
                ui.size(0), " tokens, the first one ", tokens);
    tokens = ui.size(0);
    used.push_back(ui.to(torch::kCPU, kRouteDtype));
    own.push_back(oi.to(torch::kCPU, kRouteDtype));
  }
  if (used.empty())
    return {torch::empty({0, 0, 0}, kRouteDtype), torch::empty({0, 0, 0}, kRouteDtype)};
  return {torch::stack(used, 1), torch::stack(own, 1)};
}

RouteReplay::RouteReplay(CausalLM& model) : blocks_(sparse_blocks(model)) {}

RouteReplay::~RouteReplay() {
  for (SparseMoeImpl* block : blocks_) block->replay = torch::Tensor();
}

void RouteReplay::set(const torch::Tensor& routes) {
  if (!routes.defined()) {
    for (SparseMoeImpl* block : blocks_) block->replay = torch::Tensor();
    return;
  }
  const auto S = static_cast<int64_t>(blocks_.size());
  TORCH_CHECK(routes.dim() == 3 && routes.size(1) == S &&
                  (S == 0 || routes.size(2) == blocks_.front()->spec().top_k),
              "routing replay: routes are ", routes.sizes(), ", expected [tokens, ", S,
              " sparse layers, ", S == 0 ? 0 : blocks_.front()->spec().top_k, "]");
  for (int64_t i = 0; i < S; ++i) blocks_[i]->replay = routes.select(1, i);
}

AuxLossScope::AuxLossScope(CausalLM& model) : blocks_(sparse_blocks(model)) {
  if (blocks_.empty()) return;
  loss_ = std::make_unique<AuxLoss>(blocks_.front()->spec().experts);
  for (SparseMoeImpl* block : blocks_) block->aux = loss_.get();
}

AuxLossScope::~AuxLossScope() {
  for (SparseMoeImpl* block : blocks_) block->aux = nullptr;
}

torch::Tensor forward_routes(const torch::Tensor& routes, const torch::Tensor& attention_mask,
                             bool packed) {
  TORCH_CHECK(routes.dim() == 4 && routes.size(0) == attention_mask.size(0) &&
                  routes.size(1) == attention_mask.size(1),
              "routing replay: routes ", routes.sizes(), " do not match the batch ",
              attention_mask.sizes());
  if (!packed) return routes.reshape({-1, routes.size(2), routes.size(3)});
  return routes.index({attention_mask.to(routes.device()) != 0});
}

std::pair<torch::Tensor, torch::Tensor> count_route_differences(const torch::Tensor& a,
                                                                const torch::Tensor& b) {
  TORCH_CHECK(a.sizes() == b.sizes() && a.dim() == 4, "routing: compared routes ", a.sizes(),
              " and ", b.sizes());
  const auto sa = std::get<0>(a.to(torch::kInt64).sort(-1));
  const auto sb = std::get<0>(b.to(torch::kInt64).sort(-1));
  // A token counts where both recorded it in every layer.
  const auto both = ((sa >= 0).all(-1) & (sb >= 0).all(-1)).all(-1);  // [B, T]
  const auto differ = (sa != sb).any(-1).any(-1) & both;
  return {both.sum(1), differ.sum(1)};
}

}  // namespace rlhf::models
