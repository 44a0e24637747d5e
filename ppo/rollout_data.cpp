#include "ppo/rollout_data.h"

#include <algorithm>
#include <cmath>
#include <tuple>

namespace rlhf::ppo::job {

using nlohmann::json;

double scatter_compute(const Message& reply, int ranks) {
  double sum = 0;
  for (const auto& mb : reply.args.value("micro_batches", json::array()))
    sum += mb.value("compute_s", 0.0);
  return sum / std::max(1, ranks);
}
json source_means(const torch::Tensor& source_scores, const std::vector<std::string>& names) {
  json out = json::object();
  for (size_t i = 0; i < names.size(); ++i) {
    const auto row = source_scores[static_cast<int64_t>(i)];
    const auto valid = ~torch::isnan(row);
    const auto n = valid.sum().item<int64_t>();
    out[names[i]] = n > 0 ? row.masked_select(valid).mean().item<double>() : std::nan("");
  }
  return out;
}

std::vector<NamedTensor> sequence_tensors(const Rollout& r) {
  std::vector<NamedTensor> out = {{"sequences", r.sequences}, {"attention_mask", r.attention_mask}};
  if (r.routes.defined()) out.push_back({"routes", r.routes});
  return out;
}

std::vector<NamedTensor> part_tensors(const Message& part, const torch::Tensor& keep) {
  std::vector<NamedTensor> out;
  for (const char* name : {"sequences", "attention_mask", "routes"}) {
    if (!part.has_tensor(name)) continue;
    const torch::Tensor t = part.tensor(name);
    out.push_back({name, keep.defined() ? t.index_select(0, keep) : t});
  }
  return out;
}

torch::Tensor group_rows(const torch::Tensor& groups, int64_t n) {
  return (groups.unsqueeze(1) * n + torch::arange(n, torch::kLong)).reshape({-1});
}

Rollout select_rows(const Rollout& r, const torch::Tensor& index) {
  Rollout out = r;
  out.early.clear();  // scored again for the rows kept
  out.sequences = r.sequences.index_select(0, index).contiguous();
  out.attention_mask = r.attention_mask.index_select(0, index).contiguous();
  out.action_mask = r.action_mask.index_select(0, index).contiguous();
  out.behaviour_log_probs = r.behaviour_log_probs.index_select(0, index).contiguous();
  if (r.token_versions.defined())
    out.token_versions = r.token_versions.index_select(0, index).contiguous();
  if (r.routes.defined()) out.routes = r.routes.index_select(0, index).contiguous();
  if (r.scores.defined()) out.scores = r.scores.index_select(0, index).contiguous();
  if (r.source_scores.defined())
    out.source_scores = r.source_scores.index_select(1, index).contiguous();
  for (auto [to, from] :
       {std::make_pair(&out.env_rewards, &r.env_rewards), std::make_pair(&out.turns, &r.turns),
        std::make_pair(&out.tool_calls, &r.tool_calls),
        std::make_pair(&out.tool_errors, &r.tool_errors),
        std::make_pair(&out.env_seconds, &r.env_seconds),
        std::make_pair(&out.env_timed_out, &r.env_timed_out)})
    if (from->defined()) *to = from->index_select(0, index).contiguous();
  out.conversations.clear();
  out.prompts.clear();
  out.responses.clear();
  out.labels.clear();
  out.columns.clear();
  for (int64_t i :
       std::vector<int64_t>(index.data_ptr<int64_t>(), index.data_ptr<int64_t>() + index.numel())) {
    out.prompts.push_back(r.prompts[static_cast<size_t>(i)]);
    out.responses.push_back(r.responses[static_cast<size_t>(i)]);
    out.labels.push_back(r.labels[static_cast<size_t>(i)]);
    if (!r.columns.empty()) out.columns.push_back(r.columns[static_cast<size_t>(i)]);
    if (!r.conversations.empty())
      out.conversations.push_back(r.conversations[static_cast<size_t>(i)]);
  }
  return out;
}

Rollout concat_rollouts(const Rollout& a, const Rollout& b, int64_t pad_id) {
  const int64_t aa = a.action_mask.size(1), ab = b.action_mask.size(1);
  const int64_t pa = a.sequences.size(1) - aa, pb = b.sequences.size(1) - ab;
  const int64_t p = std::max(pa, pb), act = std::max(aa, ab);
  auto pad = [&](const torch::Tensor& t, int64_t prompt, int64_t value, bool prompt_part) {
    // [B, prompt + A, ...] -> [B, p + act, ...]; the action mask has no prompt part.
    const int64_t width = prompt_part ? p + act : act;
    std::vector<int64_t> shape = t.sizes().vec();
    shape[1] = width;
    torch::Tensor out = torch::full(shape, value, t.options());
    const int64_t a_len = prompt_part ? t.size(1) - prompt : t.size(1);
    if (prompt_part) out.slice(1, p - prompt, p).copy_(t.slice(1, 0, prompt));
    out.slice(1, width - act, width - act + a_len).copy_(t.slice(1, t.size(1) - a_len));
    return out;
  };
  Rollout out = a;
  out.early.clear();  // scored again for the rows together
  out.sequences =
      torch::cat({pad(a.sequences, pa, pad_id, true), pad(b.sequences, pb, pad_id, true)});
  out.attention_mask =
      torch::cat({pad(a.attention_mask, pa, 0, true), pad(b.attention_mask, pb, 0, true)});
  out.action_mask = torch::cat({pad(a.action_mask, 0, 0, false), pad(b.action_mask, 0, 0, false)});
  out.behaviour_log_probs = torch::cat(
      {pad(a.behaviour_log_probs, 0, 0, false), pad(b.behaviour_log_probs, 0, 0, false)});
  if (a.token_versions.defined() && b.token_versions.defined())
    out.token_versions = torch::cat({pad(a.token_versions, 0, a.weight_version, false),
                                     pad(b.token_versions, 0, b.weight_version, false)});
  if (a.routes.defined() && b.routes.defined())
    out.routes = torch::cat({pad(a.routes, pa, -1, true), pad(b.routes, pb, -1, true)});
  if (a.scores.defined()) out.scores = torch::cat({a.scores, b.scores});
  if (a.source_scores.defined())
    out.source_scores = torch::cat({a.source_scores, b.source_scores}, 1);
  for (auto [to, x, y] : {std::make_tuple(&out.env_rewards, &a.env_rewards, &b.env_rewards),
                          std::make_tuple(&out.turns, &a.turns, &b.turns),
                          std::make_tuple(&out.tool_calls, &a.tool_calls, &b.tool_calls),
                          std::make_tuple(&out.tool_errors, &a.tool_errors, &b.tool_errors),
                          std::make_tuple(&out.env_seconds, &a.env_seconds, &b.env_seconds),
                          std::make_tuple(&out.env_timed_out, &a.env_timed_out, &b.env_timed_out)})
    if (x->defined()) *to = torch::cat({*x, *y});
  out.conversations.insert(out.conversations.end(), b.conversations.begin(), b.conversations.end());
  out.env_stall_s = a.env_stall_s + b.env_stall_s;
  for (auto [to, from] :
       {std::make_pair(&out.prompts, &b.prompts), std::make_pair(&out.responses, &b.responses),
        std::make_pair(&out.labels, &b.labels)})
    to->insert(to->end(), from->begin(), from->end());
  out.columns.insert(out.columns.end(), b.columns.begin(), b.columns.end());
  out.weight_version = std::max(a.weight_version, b.weight_version);
  return out;
}

}  // namespace rlhf::ppo::job
