// The rollout's record of routes; see route_log.h.
#include "rollout/route_log.h"

#include <algorithm>
#include <numeric>

#include "core/errors.h"
#include "models/causal_lm.h"
#include "rollout/paged_generation.h"

namespace rlhf::rollout {

RouteLog::RouteLog(models::CausalLM& model, int64_t rows, int64_t positions) : recorder_(model) {
  const auto blocks = models::sparse_blocks(model);
  if (blocks.empty())
    throw InputError(
        "generate: routing replay records a mixture of experts' routes, and the "
        "rollout's model has no sparse layers");
  routes_ = torch::full(
      {rows, positions, static_cast<int64_t>(blocks.size()), blocks.front()->spec().top_k}, -1,
      models::kRouteDtype);
}

void RouteLog::store(int64_t columns, const std::vector<Span>& spans, const torch::Tensor& keep) {
  const torch::Tensor taken = recorder_.take().used;  // [b * columns, S, k]
  torch::Tensor input = taken.view({-1, columns, taken.size(1), taken.size(2)});
  if (keep.defined())
    input = input.masked_fill(keep.to(torch::kCPU).logical_not().view({-1, 1, 1, 1}), -1);
  const int64_t positions = routes_.size(1);
  for (const Span& s : spans) {
    const int64_t length = std::min(s.length, positions - s.position);
    if (length <= 0) continue;
    const torch::Tensor from = input[s.input_row].narrow(0, s.column, length);
    for (int64_t row : s.rows) routes_[row].narrow(0, s.position, length).copy_(from);
  }
}

void RouteLog::prefilled(int64_t L, const std::vector<std::vector<int64_t>>& rows,
                         const std::vector<int64_t>& lengths) {
  std::vector<Span> spans;
  for (size_t i = 0; i < rows.size(); ++i)
    spans.push_back({static_cast<int64_t>(i), L - lengths[i], lengths[i], 0, rows[i]});
  store(L, spans);
}

void RouteLog::decoded(const std::vector<int64_t>& rows, const std::vector<int64_t>& positions,
                       const torch::Tensor& live) {
  std::vector<Span> spans;
  for (size_t i = 0; i < rows.size(); ++i)
    spans.push_back({static_cast<int64_t>(i), 0, 1, positions[i], {rows[i]}});
  store(1, spans, live);
}

void RouteLog::extended(int64_t T, const std::vector<int64_t>& rows,
                        const std::vector<int64_t>& positions,
                        const std::vector<int64_t>& lengths) {
  std::vector<Span> spans;
  for (size_t i = 0; i < rows.size(); ++i)
    spans.push_back({static_cast<int64_t>(i), 0, lengths[i], positions[i], {rows[i]}});
  store(T, spans);
}

torch::Tensor RouteLog::columns(const std::vector<int64_t>& rows, const torch::Tensor& prompt_mask,
                                int64_t n, const torch::Tensor& attention_mask) const {
  const int64_t P = prompt_mask.size(1), steps = attention_mask.size(1) - P;
  const auto lengths = (prompt_mask.to(torch::kCPU) != 0).sum(1).to(torch::kInt64).contiguous();
  const auto count = static_cast<int64_t>(rows.size());
  auto out =
      torch::full({count, P + steps, routes_.size(2), routes_.size(3)}, -1, models::kRouteDtype);
  for (int64_t i = 0; i < count; ++i) {
    const int64_t row = rows[static_cast<size_t>(i)];
    const int64_t lp = lengths.data_ptr<int64_t>()[row / n];
    const int64_t length = std::min(lp + steps, routes_.size(1));
    out[i].narrow(0, P - lp, length).copy_(routes_[row].narrow(0, 0, length));
  }
  // A row that stopped is fed padding until the next check of the device: not its tokens.
  out.masked_fill_((attention_mask.to(torch::kCPU) == 0).view({count, P + steps, 1, 1}), -1);
  return out;
}

torch::Tensor RouteLog::columns(const torch::Tensor& prompt_mask, int64_t n,
                                const torch::Tensor& attention_mask) const {
  std::vector<int64_t> rows(static_cast<size_t>(routes_.size(0)));
  std::iota(rows.begin(), rows.end(), 0);
  return columns(rows, prompt_mask, n, attention_mask);
}

std::unique_ptr<RouteLog> log_routes(bool on, models::CausalLM& model, PagedBatcher& batcher,
                                     bool padded_steps, int64_t rows, int64_t positions) {
  if (!on) return nullptr;
  if (padded_steps)
    throw InputError(
        "generate: padded decode steps record no routes (routing replay decodes "
        "eagerly)");
  auto log = std::make_unique<RouteLog>(model, rows, positions);
  batcher.set_route_log(log.get());
  return log;
}

}  // namespace rlhf::rollout
