// Training on one step's experience: train.max_epochs passes, each over a fresh permutation
// of the samples in global batches of train.batch_size; every global batch goes to the actor
// (train_actor) and the critic (train_critic) at once, and their figures are averaged over
// the updates. What the trainers do with a batch is actors/' business.
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <future>

#include "ppo/phases.h"
#include "scheduler/progress.h"
#include "scheduler/role_group.h"

namespace rlhf::ppo::job {

using nlohmann::json;

TrainingSettings TrainingSettings::from(const ppo::PpoConfig& c, const JobRoles& roles) {
  TrainingSettings s;
  s.batch_size = c.train_batch_size;
  s.max_epochs = c.max_epochs;
  s.seed = c.seed;
  s.batching = {0, c.train_micro_batch_size, c.max_tokens_per_micro_batch, c.packing_samples};
  s.policy = c.policy;
  s.kl_use_loss = c.kl_use_loss;
  s.kl_estimator = c.kl_estimator;
  s.temperature = c.temperature;
  s.value_clip = c.value_clip;
  s.routing_replay = c.routing_replay;
  s.aux_loss_coef = c.aux_loss_coef;
  s.gkd_coef = c.gkd_coef;
  s.gkd_beta = c.gkd_beta;
  s.roles = roles;
  return s;
}

PolicyTrainer::PolicyTrainer(TrainingSettings settings, RoleGroup& actor, RoleGroup* critic,
                             const KlController& kl, PhaseProgress& progress)
    : s_(std::move(settings)), actor_(actor), critic_(critic), kl_(kl), progress_(progress) {}

namespace {

ops::TrainBatching batching(const TrainingSettings& s, const Rollout& r) {
  ops::TrainBatching b = s.batching;
  b.action_len = r.action_mask.size(1);
  return b;
}

}  // namespace

ops::TrainActor PolicyTrainer::actor_request(const Rollout& r) const {
  ops::TrainActor request;
  request.batching = batching(s_, r);
  request.policy = s_.policy;
  request.kl_loss_coef = s_.kl_use_loss && s_.roles.ref ? kl_.value() : 0.0;
  request.kl_estimator = s_.kl_estimator;
  request.temperature = s_.temperature;
  request.replay_routes = s_.routing_replay;
  request.aux_loss_coef = s_.aux_loss_coef;
  request.gkd_coef = s_.gkd_coef;
  request.gkd_beta = s_.gkd_beta;
  return request;
}

// The value loss aggregates as the policy loss does (OpenRLHF's ValueLoss follows
// token_level_loss too).
ops::TrainCritic PolicyTrainer::critic_request(const Rollout& r) const {
  return {batching(s_, r), s_.value_clip, s_.policy.aggregation, s_.policy.norm_len};
}

json PolicyTrainer::train(const Rollout& r, const Experience& e, int64_t step,
                          const std::string& at) {
  const int64_t b = r.sequences.size(0);
  const ops::TrainActor actor_train = actor_request(r);
  const ops::TrainCritic critic_train = critic_request(r);
  // Critic-less runs log no critic figures (rather than zeros for what does not exist).
  std::vector<const char*> averaged = {"policy_loss", "clip_frac", "approx_kl", "grad_norm"};
  if (critic_) averaged.insert(averaged.end(), {"value_loss", "critic_grad_norm"});
  if (s_.aux_loss_coef > 0) averaged.push_back("aux_loss");
  if (s_.gkd_coef > 0) averaged.push_back("gkd_loss");
  json sums = {{"lr", 0.0}};
  for (const char* k : averaged) sums[k] = 0.0;
  int64_t updates = 0;
  double compute = 0;
  torch::Generator gen = at::detail::createCPUGenerator(s_.seed * 31 + static_cast<uint64_t>(step));
  for (int64_t epoch = 0; epoch < s_.max_epochs; ++epoch) {
    progress_.begin(at + ": training, epoch " + std::to_string(epoch + 1) + "/" +
                    std::to_string(s_.max_epochs));
    torch::Tensor order = torch::randperm(b, gen, torch::kLong);
    for (int64_t start = 0; start + s_.batch_size <= b; start += s_.batch_size) {
      torch::Tensor idx = order.slice(0, start, start + s_.batch_size);
      compute += update(r, e, idx, actor_train, critic_train, sums);
      ++updates;
    }
  }
  for (const char* k : averaged)
    sums[k] = sums[k].get<double>() / static_cast<double>(std::max<int64_t>(1, updates));
  sums["updates"] = updates;
  sums["compute_s"] = compute;
  return sums;
}

double PolicyTrainer::update(const Rollout& r, const Experience& e, const torch::Tensor& idx,
                             const ops::TrainActor& actor_call, const ops::TrainCritic& critic_call,
                             json& sums) {
  auto pick = [&](const torch::Tensor& t) { return t.index_select(0, idx).contiguous(); };
  std::vector<NamedTensor> common = {{"sequences", pick(r.sequences)},
                                     {"attention_mask", pick(r.attention_mask)},
                                     {"action_mask", pick(r.action_mask)}};
  auto actor_tensors = common;
  actor_tensors.push_back({"log_probs_old", pick(e.log_probs_old)});
  actor_tensors.push_back({"advantages", pick(e.adv.advantages)});
  if (s_.policy.correction.mode != RolloutCorrection::kNone)
    actor_tensors.push_back({"log_probs_behaviour", pick(e.log_probs_behaviour)});
  if (s_.kl_use_loss && s_.roles.ref)
    actor_tensors.push_back({"log_probs_ref", pick(e.log_probs_ref)});
  if (s_.routing_replay) actor_tensors.push_back({"routes", pick(r.routes)});
  if (s_.gkd_coef > 0) {
    actor_tensors.push_back({"teacher_top_ids", pick(e.teacher_top_ids)});
    actor_tensors.push_back({"teacher_top_log_probs", pick(e.teacher_top_log_probs)});
    actor_tensors.push_back({"teacher_top_rest", pick(e.teacher_top_rest)});
  }
  std::future<std::vector<Answered<ops::TrainCriticReply>>> critic;
  if (critic_) {
    auto critic_tensors = common;
    critic_tensors.push_back({"values_old", pick(e.values)});
    critic_tensors.push_back({"returns", pick(e.adv.returns)});
    critic =
        in_parallel([&, critic_tensors] { return critic_->call_all(critic_call, critic_tensors); });
  }
  auto actor = actor_.call_all(actor_call, actor_tensors);
  double update_compute = slowest_compute(actor);
  const ops::TrainActorReply& a = actor.front().reply;
  sums["policy_loss"] = sums["policy_loss"].get<double>() + a.metrics.loss;
  sums["clip_frac"] = sums["clip_frac"].get<double>() + a.clip_frac;
  sums["approx_kl"] = sums["approx_kl"].get<double>() + a.approx_kl;
  if (s_.aux_loss_coef > 0) sums["aux_loss"] = sums["aux_loss"].get<double>() + a.aux_loss;
  if (s_.gkd_coef > 0) sums["gkd_loss"] = sums["gkd_loss"].get<double>() + a.gkd_loss;
  sums["grad_norm"] = sums["grad_norm"].get<double>() + a.metrics.grad_norm;
  sums["lr"] = a.metrics.lr;
  if (a.metrics.loss_scale != 1.0) {  // FP16: the scale this update used, overflows so far
    sums["loss_scale"] = a.metrics.loss_scale;
    sums["skipped_steps"] = a.metrics.skipped_steps;
  }
  if (critic_) {
    const auto critic_replies = critic.get();
    update_compute = std::max(update_compute, slowest_compute(critic_replies));
    const ops::StepFigures& cr = critic_replies.front().reply.metrics;
    sums["value_loss"] = sums["value_loss"].get<double>() + cr.loss;
    sums["critic_grad_norm"] = sums["critic_grad_norm"].get<double>() + cr.grad_norm;
  }
  return update_compute;
}

}  // namespace rlhf::ppo::job
