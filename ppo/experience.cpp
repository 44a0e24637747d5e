// Making experience: the rollout group generates (the step's sampling, with DAPO dynamic
// sampling when on, is sampling.cpp), the samples fan out at once to the actor (old log-probs),
// reference, critic and reward model while the rule, Python and remote reward sources score on the
// driver, and the KL-shaped rewards and advantages are computed here. Training is training.cpp.
#include <algorithm>
#include <future>
#include <map>
#include <optional>
#include <tuple>
#include <utility>

#include "core/errors.h"
#include "core/timing.h"
#include "ppo/advantages.h"
#include "ppo/kl.h"
#include "ppo/phases.h"
#include "ppo/reward_shaping.h"
#include "ppo/stream_scorer.h"
#include "rewards/reward_sources.h"
#include "scheduler/role_group.h"
#include "scheduler/scheduler.h"
#include "tokenizer/tokenizer.h"

namespace rlhf::ppo::job {

using nlohmann::json;

RoleGroups RoleGroups::of(Scheduler& s) {
  RoleGroups g;
  for (Role role : s.roles()) {
    RoleGroup* group = &s.group(role);
    switch (role) {
      case Role::kRollout:
        g.rollout = group;
        break;
      case Role::kActor:
        g.actor = group;
        break;
      case Role::kRef:
        g.ref = group;
        break;
      case Role::kCritic:
        g.critic = group;
        break;
      case Role::kReward:
        g.reward = group;
        break;
      case Role::kTeacher:
        g.teacher = group;
        break;
    }
  }
  return g;
}

ExperienceSettings ExperienceSettings::from(const ppo::PpoConfig& c, const JobRoles& roles,
                                            std::map<Role, Dispatch> dispatch, int64_t eos_id,
                                            int64_t pad_id) {
  ExperienceSettings s;
  s.temperature = c.temperature;
  s.top_p = c.top_p;
  s.top_k = c.top_k;
  s.n_samples_per_prompt = c.n_samples_per_prompt;
  s.batch_size = c.rollout_batch_size;
  s.micro_batch_size = c.rollout_micro_batch_size;
  s.seed = c.seed;
  s.multi_turn = !c.environment.is_null();
  s.dynamic_sampling = c.dynamic_sampling;
  s.max_refill_batches = c.max_refill_batches;
  s.max_tokens_per_micro_batch = c.max_tokens_per_micro_batch;
  s.roles = roles;
  s.dispatch = std::move(dispatch);
  s.max_staleness = c.max_staleness;
  s.streaming = c.streaming;
  s.record_routes = c.routing_stats;
  s.routing_replay = c.routing_replay;
  s.in_flight_updates = c.max_staleness > 0 && c.partial_rollout;
  s.correction = c.policy.correction;
  s.max_new_tokens = c.max_new_tokens;
  s.overlong_buffer_len = c.overlong_buffer_len;
  s.overlong_penalty_factor = c.overlong_penalty_factor;
  s.kl_use_loss = c.kl_use_loss;
  s.kl_estimator = c.kl_estimator;
  s.advantage = c.advantage;
  s.distill_coef = c.distill_coef;
  s.gkd_top_k = c.gkd_coef > 0 ? c.gkd_top_k : 0;
  s.gkd_lambda = c.gkd_coef > 0 ? c.gkd_lambda : 1.0;
  s.eos_id = eos_id;
  s.pad_id = pad_id;
  return s;
}

ExperienceMaker::ExperienceMaker(ExperienceSettings settings, RoleGroups groups,
                                 const tokenizer::Tokenizer& tokenizer,
                                 rewards::RewardSources& rewards, PromptStream& stream,
                                 const KlController& kl)
    : s_(std::move(settings)),
      groups_(groups),
      tokenizer_(tokenizer),
      rewards_(rewards),
      stream_(stream),
      kl_(kl) {}

uint64_t ExperienceMaker::sample_seed(int64_t step, int64_t refill) const {
  // Seeds follow the prompt's position in the step (prompt_index), not the micro batch, so
  // a step samples the same whatever the rollout group size. A refill batch (dynamic
  // sampling) draws with its own seed.
  return s_.seed * 7919 + static_cast<uint64_t>(step) + static_cast<uint64_t>(refill) * 1000003;
}

std::map<Role, StreamScorer::Call> ExperienceMaker::early_calls() const {
  // rollout.streaming: the groups that may score while the rollout generates start on each
  // prompt group as it ends: the frozen ones always; the actor and critic only on-policy
  // (max_staleness 0: nothing trains meanwhile, and their weights are the samples' policy).
  auto calls = scoring_calls(s_.max_new_tokens);
  if (s_.max_staleness > 0) {
    calls.erase(Role::kActor);
    calls.erase(Role::kCritic);
  }
  return calls;
}

Rollout ExperienceMaker::generate(const PromptBatch& batch, int64_t step, int64_t refill) {
  const uint64_t seed = sample_seed(step, refill);
  const int64_t n = s_.n_samples_per_prompt;
  if (!s_.streaming) return generate_with(batch, s_.temperature, n, seed, /*training=*/true);
  StreamScorer early(early_calls(), batch.prompt_ids.size(0) * n);
  const GroupSink sink = [&](const torch::Tensor& prompts, const Message& part) {
    early.add(group_rows(prompts, n), part_tensors(part));
  };
  Rollout r = generate_with(batch, s_.temperature, n, seed, /*training=*/true, sink);
  r.early = early.finish(r.early_compute_s);
  return r;
}

namespace {

// A streamed generate's parts (each finished prompt group's rows, "prompt_index" giving its
// prompts) into `reply`, rows in the request's order, as an unstreamed reply has them. Throws
// RuntimeError when a prompt's rows did not all come.
void merge_parts(Message& reply, const std::vector<Message>& parts, int64_t prompts, int64_t n) {
  if (parts.empty()) throw RuntimeError("generate: the rollout streamed no prompt group");
  std::vector<torch::Tensor> rows;
  int64_t count = 0;
  for (const Message& part : parts) {
    const auto p = part.tensor("prompt_index").to(torch::kLong);
    rows.push_back(group_rows(p, n));
    count += p.numel();
  }
  if (count != prompts)
    throw RuntimeError("generate: the rollout streamed " + std::to_string(count) + " of " +
                       std::to_string(prompts) + " prompt groups");
  for (const NamedTensor& t : parts.front().tensors) {
    if (t.name == "prompt_index") continue;
    std::vector<int64_t> shape(t.tensor.sizes().begin(), t.tensor.sizes().end());
    shape[0] = prompts * n;
    torch::Tensor all = torch::zeros(shape, t.tensor.options());
    for (size_t i = 0; i < parts.size(); ++i) all.index_copy_(0, rows[i], parts[i].tensor(t.name));
    reply.add(t.name, all);
  }
}

}  // namespace

Rollout ExperienceMaker::generate_with(const PromptBatch& batch, double temperature, int64_t n,
                                       uint64_t seed, bool training, const GroupSink& on_group) {
  // Each micro batch goes to one engine: with tensor parallelism, the same request to each of
  // its ranks at once (RoleGroup replicas). n overrides the engine's samples per prompt.
  ops::Generate request;
  request.sampling.temperature = temperature;
  request.sampling.top_p = s_.top_p;
  request.sampling.top_k = s_.top_k;
  request.sampling.seed = seed;
  request.n_samples_per_prompt = n;
  request.in_flight_updates = training && s_.in_flight_updates;
  request.record_routes = training && s_.record_routes;
  request.stream_groups = static_cast<bool>(on_group);
  torch::Tensor index = torch::arange(batch.prompt_ids.size(0), torch::kLong);
  if (s_.multi_turn) {
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
  // Streaming: each finished prompt group's rows to `on_group` as they come.
  std::vector<Message> parts;
  RoleGroup::PartHandler on_part;
  if (on_group)
    on_part = [&](int64_t, Message part) {
      on_group(part.tensor("prompt_index").to(torch::kLong), part);
      parts.push_back(std::move(part));
    };
  Message reply =
      groups_.rollout->scatter(request,
                               {{"prompt_ids", batch.prompt_ids},
                                {"prompt_mask", batch.prompt_mask},
                                {"prompt_index", index}},
                               s_.micro_batch_size, Dispatch::kLeastLoaded, std::nullopt, on_part);
  if (on_group) merge_parts(reply, parts, batch.prompt_ids.size(0), n);
  Rollout r;
  // Micro batches spread over the engines (an engine's TP ranks compute each one together).
  r.compute_s = scatter_compute(reply, groups_.rollout->replicas());
  r.sequences = reply.tensor("sequences").to(torch::kLong).contiguous();
  r.attention_mask = reply.tensor("attention_mask").to(torch::kLong).contiguous();
  r.action_mask = reply.tensor("action_mask").to(torch::kLong).contiguous();
  r.behaviour_log_probs = reply.tensor("log_probs").to(torch::kFloat32).contiguous();
  r.token_versions = reply.tensor("weight_versions").to(torch::kLong).contiguous();
  if (reply.has_tensor("routes")) r.routes = reply.tensor("routes");
  for (const ops::GenerateReply& mb : micro_batch_replies<ops::Generate>(reply)) {
    r.weight_version = std::max(r.weight_version, mb.weight_version);
    r.preempted += mb.preempted;
    r.kv_peak_bytes = std::max(r.kv_peak_bytes, mb.kv_peak_bytes);
  }
  if (reply.has_tensor("env_rewards")) read_trajectories(r, reply);
  std::vector<int64_t> prompt_of_row;
  for (int64_t i = 0; i < r.sequences.size(0); ++i) prompt_of_row.push_back(i / n);
  add_texts(r, batch, prompt_of_row);
  return r;
}

void ExperienceMaker::add_texts(Rollout& r, const PromptBatch& batch,
                                const std::vector<int64_t>& prompt_of_row) const {
  for (size_t i = 0; i < prompt_of_row.size(); ++i) {
    const auto p = static_cast<size_t>(prompt_of_row[i]);
    r.prompts.push_back(batch.texts[p]);
    r.labels.push_back(batch.labels[p]);
    if (rewards_.reads_rows()) r.columns.push_back(batch.columns[p]);
    r.responses.push_back(response_text(r, static_cast<int64_t>(i)));
  }
}

void ExperienceMaker::read_trajectories(Rollout& r, const Message& reply) const {
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

void ExperienceMaker::score_rewards(Rollout& r, const torch::Tensor& model_scores) const {
  if (r.scores.defined()) return;
  std::vector<double> model;
  if (model_scores.defined()) {
    const auto m = model_scores.to(torch::kFloat64).contiguous();
    model.assign(m.data_ptr<double>(), m.data_ptr<double>() + m.numel());
  }
  const auto got = rewards_.score(r.prompts, r.responses, r.labels, r.columns, model);
  r.scores = torch::tensor(got.total, torch::kFloat64).to(torch::kFloat32);
  // A trajectory's environment rewards (its turns' sum) add to the reward sources' score.
  if (r.env_rewards.defined()) r.scores = r.scores + r.env_rewards;
  std::vector<torch::Tensor> rows;
  for (const auto& s : got.sources) {
    rows.push_back(torch::tensor(s.scores, torch::kFloat64).to(torch::kFloat32));
    if (s.unparsed >= 0) r.judges[s.name] = {{"votes", s.votes}, {"unparsed", s.unparsed}};
  }
  // [0, B] when the environment is the only source.
  r.source_scores = rows.empty() ? torch::zeros({0, static_cast<int64_t>(r.responses.size())})
                                 : torch::stack(rows);
}

std::string ExperienceMaker::response_text(const Rollout& r, int64_t row) const {
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
    if (id == s_.eos_id) break;
    ids.push_back(static_cast<tokenizer::TokenId>(id));
  }
  return tokenizer_.decode(ids, tokenizer::SkipSpecial::kYes);
}

std::map<Role, StreamScorer::Call> ExperienceMaker::scoring_calls(int64_t action_len) const {
  const int64_t micro = s_.micro_batch_size * s_.n_samples_per_prompt;
  // Every forward of a scorer holds at most max_tokens (rows x padded length); max_rows lets
  // ranks that gather weights in each forward (ZeRO-3) agree on the number of forwards.
  // Actor and reference log-probs at the sampling temperature (logits / T), so the ratio and
  // the KL compare the distributions the samples were drawn from (OpenRLHF, veRL).
  const ops::ForwardBudget budget{s_.max_tokens_per_micro_batch, micro};
  std::map<Role, StreamScorer::Call> calls;
  auto add = [&](RoleGroup* group, auto request) {
    const Dispatch dispatch = s_.dispatch.at(group->role());
    calls[group->role()] = [group, request, micro, dispatch](std::vector<NamedTensor> rows) {
      if (group->role() != Role::kActor)  // the rollout's routes are the actor's to replay
        rows.erase(std::remove_if(rows.begin(), rows.end(),
                                  [](const NamedTensor& t) { return t.name == "routes"; }),
                   rows.end());
      Message reply = group->scatter(request, rows, micro, dispatch);
      const double compute = scatter_compute(reply, group->size());
      return std::make_pair(std::move(reply), compute);
    };
  };
  const JobRoles& has = s_.roles;
  add(groups_.actor, ops::LogProbs{action_len, budget, s_.temperature, true, has.ref_from_actor,
                                   s_.routing_replay});
  if (has.ref && !has.ref_from_actor) add(groups_.ref, frozen_log_probs(action_len));
  if (has.teacher) {
    ops::LogProbs teacher = frozen_log_probs(action_len);
    teacher.top_k = s_.gkd_top_k;  // GKD: the teacher's distribution as its top-k
    add(groups_.teacher, teacher);
  }
  if (has.critic) add(groups_.critic, ops::Values{action_len, budget});
  if (has.reward_model) add(groups_.reward, ops::Score{budget});
  return calls;
}

ops::LogProbs ExperienceMaker::frozen_log_probs(int64_t action_len) const {
  // The reference's and the teacher's log-probs at the sampling temperature too: the KL and the
  // reverse KL compare the distributions the samples were drawn from. No entropy, no routes.
  const int64_t micro = s_.micro_batch_size * s_.n_samples_per_prompt;
  return ops::LogProbs{
      action_len, {s_.max_tokens_per_micro_batch, micro}, s_.temperature, false, false, false};
}

double ExperienceMaker::teacher_reverse_kl(const Rollout& r) const {
  const int64_t micro = s_.micro_batch_size * s_.n_samples_per_prompt;
  const ops::LogProbs request = frozen_log_probs(r.action_mask.size(1));
  const auto rows = sequence_tensors(r);
  auto teacher = in_parallel([&] {
    return groups_.teacher->scatter(request, rows, micro, s_.dispatch.at(Role::kTeacher));
  });
  const Message actor = groups_.actor->scatter(request, rows, micro, s_.dispatch.at(Role::kActor));
  const auto kl = distill_reverse_kl(actor.tensor("log_probs"), teacher.get().tensor("log_probs"),
                                     r.action_mask);
  return sequence_mean_kl(kl, r.action_mask);
}

Experience ExperienceMaker::score(Rollout& r) {
  // The groups not scored while the rollout generated (rollout.streaming), at once.
  const auto seq = sequence_tensors(r);
  std::map<Role, std::future<std::pair<Message, double>>> calls;
  for (auto& [role, call] : scoring_calls(r.action_mask.size(1)))
    if (!r.early.count(role))
      calls[role] = in_parallel([call = std::move(call), &seq] { return call(seq); });
  Experience e;
  const JobRoles& has = s_.roles;
  // Rule, Python and remote sources on the driver while the groups compute.
  if (!has.reward_model) score_rewards(r);
  // Each group's reply, with its worker time counted toward the slowest scorer.
  auto take = [&](Role role) {
    if (auto it = r.early.find(role); it != r.early.end()) return it->second;
    auto [reply, compute] = calls.at(role).get();
    e.compute_s = std::max(e.compute_s, compute);
    return reply;
  };
  const Message actor_reply = take(Role::kActor);
  const torch::Tensor current = actor_reply.tensor("log_probs");
  // A dataset step was not sampled: the actor's own log-probs stand for the sampler's.
  if (r.from_dataset) r.behaviour_log_probs = current.clone();
  set_old_log_probs(e, r, current);
  e.entropy = actor_reply.tensor("entropy");
  if (actor_reply.has_tensor("route_tokens")) {  // the rollout's routes went along
    const double tokens = actor_reply.tensor("route_tokens").sum().item<double>();
    auto share = [&](const char* name) {
      return tokens > 0 ? actor_reply.tensor(name).sum().item<double>() / tokens : 0.0;
    };
    e.route_differ_share = share("route_differ");
    e.router_differ_share = share("router_differ");
  }
  if (has.ref)
    e.log_probs_ref = has.ref_from_actor ? actor_reply.tensor("ref_log_probs")
                                         : take(Role::kRef).tensor("log_probs");
  if (has.teacher) {
    const Message teacher = take(Role::kTeacher);
    e.log_probs_teacher = teacher.tensor("log_probs");
    if (s_.gkd_top_k > 0) {
      e.teacher_top_log_probs = teacher.tensor("top_log_probs");
      e.teacher_top_ids = teacher.tensor("top_ids");
      e.teacher_top_rest = teacher.tensor("top_rest");
    }
  }
  if (has.critic) e.values = take(Role::kCritic).tensor("values");
  if (has.reward_model) score_rewards(r, take(Role::kReward).tensor("scores"));
  e.scores = r.scores;
  e.source_scores = r.source_scores;
  shape_rewards(e, r, current);
  return e;
}

void ExperienceMaker::set_old_log_probs(Experience& e, const Rollout& r,
                                        const torch::Tensor& current) const {
  // Off-policy (algo.max_staleness k > 0): the samples were drawn with weights up to k
  // updates old (a sequence's later tokens newer with in-flight updates), so the ratio's
  // denominator is the distribution each token was drawn from, the rollout's own per-token
  // log-probs; the KL and entropy are the current policy's. A rollout
  // correction keeps the trainer's log-probs as the ratio's denominator (AReaL's proximal
  // policy) and weights the loss by pi_old / pi_rollout instead (ppo/rollout_correction.h).
  e.log_probs_behaviour =
      r.behaviour_log_probs.narrow(1, 0, r.action_mask.size(1)) * r.action_mask.to(torch::kFloat32);
  const bool corrected = s_.correction.mode != RolloutCorrection::kNone;
  e.log_probs_old = s_.max_staleness > 0 && !corrected ? e.log_probs_behaviour : current;
  e.mismatch =
      measure_rollout_mismatch(s_.correction, current, e.log_probs_behaviour, r.action_mask);
  const auto mask = r.action_mask.to(torch::kFloat32);
  const auto diff =
      (r.behaviour_log_probs.narrow(1, 0, mask.size(1)) - current).abs() * mask;  // [B, A]
  e.logprob_diff_mean = (diff.sum() / mask.sum().clamp_min(1)).item<double>();
  e.logprob_diff_max = diff.max().item<double>();
}

void ExperienceMaker::shape_rewards(Experience& e, const Rollout& r,
                                    const torch::Tensor& current) const {
  e.response_length = r.action_mask.sum(1);
  // DAPO overlong reward shaping, on the scores the advantages see (the logged reward stays
  // the reward source's score).
  e.overlong_penalty = overlong_penalty(e.response_length, s_.max_new_tokens,
                                        s_.overlong_buffer_len, s_.overlong_penalty_factor);

  // The KL is measured whenever there is a reference (issue 19: with use_loss OpenRLHF zeroes
  // it and logs 0); with use_loss it enters the actor loss and not the reward, as OpenRLHF.
  e.kl = s_.roles.ref ? approx_kl(current, e.log_probs_ref, s_.kl_estimator)
                      : torch::zeros_like(current);
  e.kl = e.kl * r.action_mask.to(torch::kFloat32);
  e.kl_mean = sequence_mean_kl(e.kl, r.action_mask);
  const torch::Tensor reward_kl = s_.kl_use_loss ? torch::Tensor() : e.kl;
  e.adv = compute_advantages(s_.advantage, e.scores + e.overlong_penalty, reward_kl, kl_.value(),
                             e.values, r.action_mask);
  if (s_.roles.teacher) {  // on-policy distillation: each token's reverse KL, after the estimator
    e.reverse_kl = distill_reverse_kl(current, e.log_probs_teacher, r.action_mask);
    e.reverse_kl_mean = sequence_mean_kl(e.reverse_kl, r.action_mask);
    e.adv.advantages = e.adv.advantages + distill_advantage(e.reverse_kl, s_.distill_coef);
  }
  // GKD's dataset step: only the GKD term trains (no policy gradient on responses the actor
  // did not sample).
  if (r.from_dataset) e.adv.advantages = torch::zeros_like(e.adv.advantages);
}

}  // namespace rlhf::ppo::job
