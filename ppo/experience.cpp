// Making experience: the rollout group generates (with DAPO dynamic sampling when on), the
// samples fan out at once to the actor (old log-probs), reference, critic and reward model
// while the rule, Python and remote reward sources score on the driver, and the KL-shaped
// rewards and advantages are computed here. Training is training.cpp.
#include <algorithm>
#include <future>
#include <optional>
#include <tuple>
#include <utility>

#include "ppo/advantages.h"
#include "ppo/kl.h"
#include "ppo/ppo_job.h"
#include "ppo/reward_shaping.h"
#include "rewards/reward_sources.h"
#include "scheduler/role_group.h"
#include "scheduler/scheduler.h"
#include "tokenizer/tokenizer.h"

namespace rlhf::ppo::job {

using nlohmann::json;

std::vector<NamedTensor> sequence_tensors(const Rollout& r) {
  return {{"sequences", r.sequences}, {"attention_mask", r.attention_mask}};
}

Rollout PpoJob::generate(Scheduler& s, const PromptBatch& batch, int64_t step, int64_t refill) {
  // Seeds follow the prompt's position in the step (prompt_index), not the micro batch, so
  // a step samples the same whatever the rollout group size. A refill batch (dynamic
  // sampling) draws with its own seed.
  return generate_with(
      s, batch, c_.temperature, c_.n_samples_per_prompt,
      c_.seed * 7919 + static_cast<uint64_t>(step) + static_cast<uint64_t>(refill) * 1000003);
}

Rollout PpoJob::generate_with(Scheduler& s, const PromptBatch& batch, double temperature, int64_t n,
                              uint64_t seed) {
  // Each micro batch goes to one engine: with tensor parallelism, the same request to each of
  // its ranks at once (RoleGroup replicas). n overrides the engine's samples per prompt.
  ops::Generate request;
  request.sampling.temperature = temperature;
  request.sampling.top_p = c_.top_p;
  request.sampling.top_k = c_.top_k;
  request.sampling.seed = seed;
  request.n_samples_per_prompt = n;
  torch::Tensor index = torch::arange(batch.prompt_ids.size(0), torch::kLong);
  if (!c_.environment.is_null()) {
    // Each prompt's row for its environment's reset (indexed by prompt_index).
    json rows = json::array();
    for (size_t i = 0; i < batch.labels.size(); ++i) {
      json row = i < batch.columns.size() && batch.columns[i].is_object() ? batch.columns[i]
                                                                          : json::object();
      if (!row.contains("label")) row["label"] = batch.labels[i];
      rows.push_back(std::move(row));
    }
    request.rows = std::move(rows);
  }
  Message reply = s.group(Role::kRollout)
                      .scatter(request,
                               {{"prompt_ids", batch.prompt_ids},
                                {"prompt_mask", batch.prompt_mask},
                                {"prompt_index", index}},
                               c_.rollout_micro_batch_size);
  Rollout r;
  // Micro batches spread over the engines (an engine's TP ranks compute each one together).
  r.compute_s = scatter_compute(reply, s.group(Role::kRollout).replicas());
  r.sequences = reply.tensor("sequences").to(torch::kLong).contiguous();
  r.attention_mask = reply.tensor("attention_mask").to(torch::kLong).contiguous();
  r.action_mask = reply.tensor("action_mask").to(torch::kLong).contiguous();
  r.behaviour_log_probs = reply.tensor("log_probs").to(torch::kFloat32).contiguous();
  for (const ops::GenerateReply& mb : micro_batch_replies<ops::Generate>(reply)) {
    r.weight_version = std::max(r.weight_version, mb.weight_version);
    r.preempted += mb.preempted;
    r.kv_peak_bytes = std::max(r.kv_peak_bytes, mb.kv_peak_bytes);
  }
  if (reply.has_tensor("env_rewards")) read_trajectories(r, reply);
  for (int64_t i = 0; i < r.sequences.size(0); ++i) {
    r.prompts.push_back(batch.texts[static_cast<size_t>(i / n)]);
    r.labels.push_back(batch.labels[static_cast<size_t>(i / n)]);
    if (rewards_->reads_rows()) r.columns.push_back(batch.columns[static_cast<size_t>(i / n)]);
    r.responses.push_back(response_text(r, i));
  }
  return r;
}

void PpoJob::read_trajectories(Rollout& r, const Message& reply) const {
  r.env_rewards = reply.tensor("env_rewards").to(torch::kFloat32).contiguous();
  r.turns = reply.tensor("turns").to(torch::kLong).contiguous();
  r.tool_calls = reply.tensor("tool_calls").to(torch::kLong).contiguous();
  r.tool_errors = reply.tensor("tool_errors").to(torch::kLong).contiguous();
  r.env_seconds = reply.tensor("env_seconds").to(torch::kFloat32).contiguous();
  r.env_timed_out = reply.tensor("env_timed_out").to(torch::kLong).contiguous();
  for (const ops::GenerateReply& mb : micro_batch_replies<ops::Generate>(reply)) {
    r.env_stall_s += mb.env_stall_seconds;
    if (mb.conversations.is_array())
      for (const auto& c : mb.conversations) r.conversations.push_back(c);
  }
  TORCH_CHECK(static_cast<int64_t>(r.conversations.size()) == r.sequences.size(0),
              "generate: ", r.conversations.size(), " conversations for ", r.sequences.size(0),
              " trajectories");
}

Rollout select_rows(const Rollout& r, const torch::Tensor& index) {
  Rollout out = r;
  out.sequences = r.sequences.index_select(0, index).contiguous();
  out.attention_mask = r.attention_mask.index_select(0, index).contiguous();
  out.action_mask = r.action_mask.index_select(0, index).contiguous();
  out.behaviour_log_probs = r.behaviour_log_probs.index_select(0, index).contiguous();
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
    // [B, prompt + A] -> [B, p + act]; the action mask has no prompt part.
    const int64_t rows = t.size(0);
    const int64_t width = prompt_part ? p + act : act;
    torch::Tensor out = torch::full({rows, width}, value, t.options());
    const int64_t a_len = prompt_part ? t.size(1) - prompt : t.size(1);
    if (prompt_part) out.slice(1, p - prompt, p).copy_(t.slice(1, 0, prompt));
    out.slice(1, width - act, width - act + a_len).copy_(t.slice(1, t.size(1) - a_len));
    return out;
  };
  Rollout out = a;
  out.sequences =
      torch::cat({pad(a.sequences, pa, pad_id, true), pad(b.sequences, pb, pad_id, true)});
  out.attention_mask =
      torch::cat({pad(a.attention_mask, pa, 0, true), pad(b.attention_mask, pb, 0, true)});
  out.action_mask = torch::cat({pad(a.action_mask, 0, 0, false), pad(b.action_mask, 0, 0, false)});
  out.behaviour_log_probs = torch::cat(
      {pad(a.behaviour_log_probs, 0, 0, false), pad(b.behaviour_log_probs, 0, 0, false)});
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

void PpoJob::score_rewards(Rollout& r, const torch::Tensor& model_scores) const {
  if (r.scores.defined()) return;
  std::vector<double> model;
  if (model_scores.defined()) {
    const auto m = model_scores.to(torch::kFloat64).contiguous();
    model.assign(m.data_ptr<double>(), m.data_ptr<double>() + m.numel());
  }
  const auto got = rewards_->score(r.prompts, r.responses, r.labels, r.columns, model);
  r.scores = torch::tensor(got.total, torch::kFloat64).to(torch::kFloat32);
  // A trajectory's environment rewards (its turns' sum) add to the reward sources' score.
  if (r.env_rewards.defined()) r.scores = r.scores + r.env_rewards;
  std::vector<torch::Tensor> rows;
  for (const auto& s : got.sources)
    rows.push_back(torch::tensor(s.scores, torch::kFloat64).to(torch::kFloat32));
  // [0, B] when the environment is the only source.
  r.source_scores = rows.empty() ? torch::zeros({0, static_cast<int64_t>(r.responses.size())})
                                 : torch::stack(rows);
}

// DAPO dynamic sampling (algo.dynamic_sampling): groups whose samples all score the same are
// dropped (groups_with_distinct_scores); up to rollout.max_refill_batches more batches of
// rollout.batch_size prompts are generated until rollout.batch_size groups are kept, and
// extra kept groups are left out (as veRL's DAPO). If none is kept, the first batch is
// trained as it is: its group advantages are all 0.
Rollout PpoJob::sample(Scheduler& s, int64_t step) {
  Rollout first = generate(s, stream_->next(c_.rollout_batch_size), step);
  if (!c_.dynamic_sampling) return first;
  const int64_t n = c_.n_samples_per_prompt, want = c_.rollout_batch_size;
  auto keep = [&](Rollout batch) {
    score_rewards(batch);
    torch::Tensor groups = groups_with_distinct_scores(batch.scores, n);
    torch::Tensor rows = (groups.unsqueeze(1) * n + torch::arange(n, torch::kLong)).reshape({-1});
    return select_rows(batch, rows);
  };
  score_rewards(first);
  Rollout kept = keep(first);
  double compute_s = first.compute_s;  // every generate call is on the step's critical path
  int64_t refills = 0;
  while (kept.sequences.size(0) < want * n && refills < c_.max_refill_batches) {
    ++refills;
    Rollout more = keep(generate(s, stream_->next(want), step, refills));
    compute_s += more.compute_s;
    kept = kept.sequences.size(0) == 0 ? more : concat_rollouts(kept, more, pad_id_);
  }
  const int64_t kept_groups = kept.sequences.size(0) / n;
  Rollout out = kept_groups == 0 ? first : kept;
  if (kept_groups > want) out = select_rows(out, torch::arange(want * n, torch::kLong));
  out.compute_s = compute_s;
  out.sampling = {{"groups_generated", want * (refills + 1)},
                  {"groups_kept", std::min(kept_groups, want)},
                  {"refill_batches", refills}};
  return out;
}

std::string PpoJob::response_text(const Rollout& r, int64_t row) const {
  const int64_t a = r.action_mask.size(1), t = r.sequences.size(1);
  auto mask = r.action_mask.accessor<int64_t, 2>();
  auto seq = r.sequences.accessor<int64_t, 2>();
  // The last run of action tokens: the model's last turn (its only one when single-turn).
  int64_t end = a;
  while (end > 0 && mask[row][end - 1] == 0) --end;
  int64_t begin = end;
  while (begin > 0 && mask[row][begin - 1] != 0) --begin;
  std::vector<tokenizer::TokenId> ids;
  for (int64_t j = begin; j < end; ++j) {
    const int64_t id = seq[row][t - a + j];
    if (id == eos_id_) break;
    ids.push_back(static_cast<tokenizer::TokenId>(id));
  }
  return tokenizer_->decode(ids, tokenizer::SkipSpecial::kYes);
}

Experience PpoJob::score(Scheduler& s, Rollout& r) {
  const int64_t micro = c_.rollout_micro_batch_size * c_.n_samples_per_prompt;
  // Every forward of a scorer holds at most max_tokens (rows x padded length); max_rows lets
  // ranks that gather weights in each forward (ZeRO-3) agree on the number of forwards.
  // Actor and reference log-probs at the sampling temperature (logits / T), so the ratio and
  // the KL compare the distributions the samples were drawn from (OpenRLHF, veRL).
  const ops::ForwardBudget budget{c_.max_tokens_per_micro_batch, micro};
  const int64_t action_len = r.action_mask.size(1);
  auto seq = sequence_tensors(r);
  // Each future yields the group's reply and its ranks (for the compute accounting).
  using Scored = std::pair<Message, int>;
  auto call = [&](Role role, auto request) {
    const Dispatch dispatch = settings_.dispatch.at(role);
    return in_parallel([&s, &seq, role, request, micro, dispatch]() -> Scored {
      RoleGroup& g = s.group(role);
      return {g.scatter(request, seq, micro, dispatch), g.size()};
    });
  };
  auto old =
      call(Role::kActor, ops::LogProbs{action_len, budget, c_.temperature, true, ref_from_actor_});
  std::future<Scored> ref, values, model_scores;
  if (has_ref_ && !ref_from_actor_)
    ref = call(Role::kRef, ops::LogProbs{action_len, budget, c_.temperature, false, false});
  if (has_critic_) values = call(Role::kCritic, ops::Values{action_len, budget});
  if (has_reward_model_) model_scores = call(Role::kReward, ops::Score{budget});
  Experience e;
  // Rule, Python and remote sources on the driver while the groups compute.
  if (!has_reward_model_) score_rewards(r);
  // Each group's reply, with its worker time counted toward the slowest scorer.
  auto take = [&e](std::future<Scored>& f) {
    Scored got = f.get();
    e.compute_s = std::max(e.compute_s, scatter_compute(got.first, got.second));
    return got.first;
  };
  const Message actor_reply = take(old);
  const torch::Tensor current = actor_reply.tensor("log_probs");
  set_old_log_probs(e, r, current);
  e.entropy = actor_reply.tensor("entropy");
  if (has_ref_)
    e.log_probs_ref =
        ref_from_actor_ ? actor_reply.tensor("ref_log_probs") : take(ref).tensor("log_probs");
  if (has_critic_) e.values = take(values).tensor("values");
  if (has_reward_model_) score_rewards(r, take(model_scores).tensor("scores"));
  e.scores = r.scores;
  e.source_scores = r.source_scores;
  shape_rewards(e, r, current);
  return e;
}

void PpoJob::set_old_log_probs(Experience& e, const Rollout& r,
                               const torch::Tensor& current) const {
  // One-step off-policy (algo.async_steps 1): the samples were drawn with the weights before
  // the last update, so the ratio's denominator is the distribution they were drawn from,
  // the rollout's own log-probs; the KL and entropy are the current policy's. A rollout
  // correction keeps the trainer's log-probs as the ratio's denominator (AReaL's proximal
  // policy) and weights the loss by pi_old / pi_rollout instead (ppo/rollout_correction.h).
  e.log_probs_behaviour =
      r.behaviour_log_probs.narrow(1, 0, r.action_mask.size(1)) * r.action_mask.to(torch::kFloat32);
  const bool corrected = c_.policy.correction.mode != RolloutCorrection::kNone;
  e.log_probs_old = c_.async_steps > 0 && !corrected ? e.log_probs_behaviour : current;
  e.mismatch =
      measure_rollout_mismatch(c_.policy.correction, current, e.log_probs_behaviour, r.action_mask);
  const auto mask = r.action_mask.to(torch::kFloat32);
  const auto diff =
      (r.behaviour_log_probs.narrow(1, 0, mask.size(1)) - current).abs() * mask;  // [B, A]
  e.logprob_diff_mean = (diff.sum() / mask.sum().clamp_min(1)).item<double>();
  e.logprob_diff_max = diff.max().item<double>();
}

void PpoJob::shape_rewards(Experience& e, const Rollout& r, const torch::Tensor& current) {
  e.response_length = r.action_mask.sum(1);
  // DAPO overlong reward shaping, on the scores the advantages see (the logged reward stays
  // the reward source's score).
  e.overlong_penalty = overlong_penalty(e.response_length, c_.max_new_tokens,
                                        c_.overlong_buffer_len, c_.overlong_penalty_factor);

  // The KL is measured whenever there is a reference (issue 19: with use_loss OpenRLHF zeroes
  // it and logs 0); with use_loss it enters the actor loss and not the reward, as OpenRLHF.
  e.kl =
      has_ref_ ? approx_kl(current, e.log_probs_ref, c_.kl_estimator) : torch::zeros_like(current);
  e.kl = e.kl * r.action_mask.to(torch::kFloat32);
  e.kl_mean = sequence_mean_kl(e.kl, r.action_mask);
  const torch::Tensor reward_kl = c_.kl_use_loss ? torch::Tensor() : e.kl;
  e.adv = compute_advantages(c_.advantage, e.scores + e.overlong_penalty, reward_kl, kl_.value(),
                             e.values, r.action_mask);
}

}  // namespace rlhf::ppo::job
