// Expert parallelism's token dispatch; see expert_parallel.h.
#include "models/expert_parallel.h"

#include <torch/autograd.h>

#include "core/errors.h"
#include "models/layer_spec.h"
#include "transport/collective_group.h"

namespace rlhf::models {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

std::vector<int64_t> host_counts(const torch::Tensor& t) {
  const auto c = t.to(torch::kCPU, torch::kInt64).contiguous();
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

torch::Tensor exchange(const torch::Tensor& x, const std::vector<int64_t>& receive,
                       const std::vector<int64_t>& send, transport::CollectiveGroup& group) {
  int64_t rows = 0;
  for (int64_t r : receive) rows += r;
  std::vector<int64_t> shape = x.sizes().vec();
  shape[0] = rows;
  torch::Tensor y = torch::empty(shape, x.options());
  const torch::Tensor in = x.contiguous();
  group.all_to_all(y, in, receive, send);
  return y;
}

class AllToAllRows : public torch::autograd::Function<AllToAllRows> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               std::vector<int64_t> receive, std::vector<int64_t> send,
                               int64_t group) {
    ctx->saved_data["receive"] = receive;
    ctx->saved_data["send"] = send;
    ctx->saved_data["group"] = group;
    return exchange(x, receive, send, *reinterpret_cast<transport::CollectiveGroup*>(group));
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto* group = reinterpret_cast<transport::CollectiveGroup*>(
        static_cast<intptr_t>(ctx->saved_data["group"].toInt()));
    // The transpose: what came from rank k goes back to it.
    return {exchange(grads[0], ctx->saved_data["send"].toIntVector(),
                     ctx->saved_data["receive"].toIntVector(), *group),
            torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

namespace {

constexpr const char* kExperts = ".experts.";

// [begin, end) of the expert index's digits in `name`, or npos.
std::pair<size_t, size_t> index_digits(const std::string& name) {
  const size_t at = name.find(kExperts);
  if (at == std::string::npos) return {std::string::npos, std::string::npos};
  const size_t begin = at + std::char_traits<char>::length(kExperts);
  size_t end = begin;
  while (end < name.size() && name[end] >= '0' && name[end] <= '9') ++end;
  if (end == begin || end >= name.size() || name[end] != '.')
    return {std::string::npos, std::string::npos};
  return {begin, end};
}

}  // namespace

int64_t expert_index(const std::string& name) {
  const auto [begin, end] = index_digits(name);
  return begin == std::string::npos ? -1 : std::stoll(name.substr(begin, end - begin));
}

std::string with_expert_index(const std::string& name, int64_t expert) {
  const auto [begin, end] = index_digits(name);
  TORCH_CHECK(begin != std::string::npos, "with_expert_index: ", name, " names no expert");
  return name.substr(0, begin) + std::to_string(expert) + name.substr(end);
}

void check_expert_parallel(const ModelConfig& config, int ep_size, const std::string& what) {
  if (ep_size < 1) throw InputError(what + ": expert_parallel_size must be >= 1");
  if (ep_size == 1) return;
  bool sparse = false;
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    const MoeSpec moe = layer_spec(config, i).moe;
    if (!moe.sparse()) continue;
    sparse = true;
    if (moe.experts % ep_size != 0)
      throw InputError(what + ": expert_parallel_size " + std::to_string(ep_size) +
                       " does not divide the model's " + std::to_string(moe.experts) +
                       " experts (num_experts / num_local_experts)");
  }
  if (!sparse)
    throw InputError(what + ": expert_parallel_size " + std::to_string(ep_size) + " on " +
                     config.model_type + ", which has no mixture-of-experts layer");
}

torch::Tensor all_to_all_rows(const torch::Tensor& x, const std::vector<int64_t>& receive,
                              const std::vector<int64_t>& send, transport::CollectiveGroup& group) {
  return AllToAllRows::apply(x, receive, send,
                             static_cast<int64_t>(reinterpret_cast<intptr_t>(&group)));
}

torch::Tensor expert_parallel_forward(const torch::Tensor& tokens, const Routes& routes,
                                      const std::vector<ExpertImpl*>& local, int64_t first,
                                      int64_t experts, bool fp32_weights,
                                      transport::CollectiveGroup& group) {
  const int64_t k = routes.experts.size(1), ranks = group.size();
  const auto per_rank = static_cast<int64_t>(local.size());
  TORCH_CHECK(per_rank * ranks == experts && first == per_rank * group.rank(),
              "expert parallelism: rank ", group.rank(), " of ", ranks, " holds experts [", first,
              ", ", first + per_rank, ") of ", experts, "; expected equal ranges in rank order");
  // Each (token, slot) pair in expert order: its destination rank's pairs are one run.
  const torch::Tensor flat = routes.experts.reshape({-1});  // [N k]
  const torch::Tensor order = flat.argsort(/*stable=*/true);
  const torch::Tensor sorted = flat.index_select(0, order);
  const torch::Tensor owner = sorted.div(per_rank, "floor");
  const std::vector<int64_t> send = host_counts(torch::bincount(owner, {}, ranks));
  std::vector<int64_t> ones(static_cast<size_t>(ranks), 1);
  const std::vector<int64_t> receive =
      host_counts(exchange(torch::tensor(send, torch::kInt64), ones, ones, group));
  // The pairs' rows and their experts (as indices into the destination's range).
  const torch::Tensor rows = order.div(k, "floor");
  const torch::Tensor arrived = all_to_all_rows(tokens.index_select(0, rows), receive, send, group);
  const torch::Tensor ids = exchange(sorted - owner * per_rank, receive, send, group);
  // This rank's experts on what arrived (in arrival order), then back to the senders.
  torch::Tensor done = torch::zeros_like(arrived);
  const torch::Tensor by_expert = ids.argsort(/*stable=*/true);
  const std::vector<int64_t> count = host_counts(torch::bincount(ids, {}, per_rank));
  int64_t start = 0;
  for (int64_t e = 0; e < per_rank; ++e) {
    if (count[e] == 0) continue;
    const torch::Tensor at = by_expert.narrow(0, start, count[e]);
    start += count[e];
    done = done.index_add(0, at, local[e]->forward(arrived.index_select(0, at)));
  }
  const torch::Tensor back = all_to_all_rows(done, send, receive, group);  // [N k, H], `order`
  const torch::Tensor weights =
      routing_scales(routes, fp32_weights, tokens.scalar_type()).index_select(0, order);
  const torch::Tensor scaled = (back * weights.unsqueeze(-1)).to(tokens.scalar_type());
  return torch::zeros_like(tokens).index_add(0, rows, scaled);
}

}  // namespace rlhf::models
