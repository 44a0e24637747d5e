// The step loop: per step, samples (with algo.max_staleness k > 0 drawn ahead by the rollout
// pipeline, at most k weight versions behind the step that trains them), scoring, training
// and the weight sync; then the KL controller, the step's metrics record and console line,
// held-out evaluation and checkpoints on their schedules.
#include <algorithm>
#include <limits>
#include <memory>
#include <utility>

#include "core/errors.h"
#include "core/timing.h"
#include "ppo/ppo_job.h"
#include "ppo/rollout_pipeline.h"
#include "report/metrics.h"
#include "rewards/reward_sources.h"
#include "scheduler/progress.h"
#include "scheduler/role_group.h"
#include "scheduler/scheduler.h"

namespace rlhf::ppo::job {

using nlohmann::json;
using runtime::fixed;

namespace {

// The metrics record's rollout_mismatch: the KL always, the weights when a correction applies.
json mismatch_json(RolloutCorrection mode, const RolloutMismatch& m) {
  json out = {{"kl", m.kl}};
  if (mode == RolloutCorrection::kNone) return out;
  out.update(
      {{"weight_mean", m.weight_mean}, {"weight_max", m.weight_max}, {"truncated", m.truncated}});
  return out;
}

// How many weight versions each sample lags the policy that trains it (issue 42.2): per
// sample its oldest action token's, per token each one's; "histogram" counts the samples at
// each staleness 0, 1, ... (TensorBoard's histogram of the step); "mixed" counts the samples
// whose tokens came from two versions or more (a weight sync landed while they generated).
json staleness_json(const Rollout& r, int64_t policy_version) {
  const auto mask = r.action_mask.to(torch::kBool);
  const auto lag = (policy_version - r.token_versions.narrow(1, 0, mask.size(1))).clamp_min(0);
  const auto per_sample = torch::where(mask, lag, torch::zeros_like(lag)).amax(1);  // [B]
  const auto newest =
      torch::where(mask, lag, torch::full_like(lag, std::numeric_limits<int64_t>::max())).amin(1);
  const int64_t mixed = (mask.any(1) & (newest < per_sample)).sum().item<int64_t>();
  const auto tokens = lag.masked_select(mask).to(torch::kFloat64);
  json histogram = json::array();
  const int64_t most = per_sample.numel() ? per_sample.max().item<int64_t>() : 0;
  for (int64_t v = 0; v <= most; ++v) histogram.push_back((per_sample == v).sum().item<int64_t>());
  return {{"mean", per_sample.to(torch::kFloat64).mean().item<double>()},
          {"max", most},
          {"token_mean", tokens.numel() ? tokens.mean().item<double>() : 0.0},
          {"mixed", mixed},
          {"histogram", std::move(histogram)}};
}

}  // namespace

void PpoJob::run_steps(Scheduler& s, int64_t step, std::ostream& out) {
  report::MetricsSink& metrics = runtime_.metrics();
  const runtime::StepClock clock(step + 1, total_steps_);
  // algo.max_staleness k > 0: the steps' samples drawn ahead while this step scores and
  // trains (after a resume, the first with the checkpoint's weights).
  std::unique_ptr<RolloutPipeline> ahead;
  if (c_.max_staleness > 0 && step < total_steps_)
    ahead = std::make_unique<RolloutPipeline>(
        [this](int64_t at) { return experience_->sample(at); }, step + 1, total_steps_,
        c_.max_staleness, c_.partial_rollout);
  for (++step; step <= total_steps_; ++step) {
    const StepOutcome o = run_step(s, step, ahead.get());
    const double kl_mean = o.e.kl_mean;
    const double kl_coef = kl_.value();
    kl_.update(kl_mean, o.r.sequences.size(0));
    if (runtime_.logs_at(step, total_steps_)) {
      const json rec = step_record(s, step, o, kl_coef);
      metrics.write(rec);
      write_samples(step, o);
      out << "step " << step << "/" << total_steps_ << " | reward " << fixed(rec["reward_mean"])
          << " +- " << fixed(rec["reward_std"]) << " | kl " << fixed(kl_mean, 4)
          << (roles_.teacher ? " | reverse kl " + fixed(o.e.reverse_kl_mean, 4) : std::string())
          << (c_.gkd_coef > 0 ? " | gkd " + fixed(rec["distill"]["gkd"], 4) : std::string())
          << (o.r.from_dataset ? " (dataset responses)" : "") << " | policy "
          << fixed(rec["policy_loss"])
          << (roles_.critic ? " | value " + fixed(rec["value_loss"]) : std::string()) << " | len "
          << fixed(rec["response_length"], 1) << " | " << fixed(o.t_step, 2) << " s (gen "
          << static_cast<int>(100 * o.t_gen / o.t_step) << "%) | " << fixed(rec["samples_per_s"], 1)
          << " samples/s | devices busy "
          << static_cast<int>(100 * rec["devices_busy"].get<double>() + 0.5) << "% | "
          << clock.after(step) << std::endl;
    }
    // The rollout has this step's weights (synced above); with max_staleness it may be
    // generating later steps' samples: the evaluation waits for that call and holds the next.
    if (evaluator_->due(step, total_steps_)) {
      if (ahead) ahead->pause();  // its generate calls and the evaluation's, one at a time
      evaluator_->evaluate(step, metrics, out);
      if (ahead) ahead->resume();
    }
    if (runtime_.saves_at(step, total_steps_)) {
      save(s, step, o.consumed, out);
      // The save brought the optimizer state back to the device; the rollout generates next.
      if (step < total_steps_) sync_->offload_optimizer_again();
    }
  }
}

StepOutcome PpoJob::run_step(Scheduler& s, int64_t step, RolloutPipeline* ahead) {
  StepOutcome o;
  const auto t0 = Clock::now();
  const runtime::BusyWindow busy(s);
  const std::string at = "step " + std::to_string(step) + "/" + std::to_string(total_steps_);
  s.progress().begin(at + ": generating " + std::to_string(c_.rollout_batch_size) + " prompts x " +
                     std::to_string(c_.n_samples_per_prompt) + " samples");
  o.r = ahead ? ahead->take(step) : experience_->sample(step);
  o.consumed = o.r.consumed;  // this step's prompts, not those drawn ahead
  o.t_ahead = ahead ? o.r.generate_s : 0.0;
  o.policy_version = sync_->version();
  o.t_gen = seconds_since(t0);
  const auto t1 = Clock::now();
  const double offload_compute = sync_->before_training();
  s.progress().begin(at + ": scoring " + std::to_string(o.r.sequences.size(0)) + " samples");
  o.e = experience_->score(o.r);
  o.t_score = seconds_since(t1);
  const auto t2 = Clock::now();
  o.losses = trainer_->train(o.r, o.e, step, at);
  o.t_train = seconds_since(t2);
  // Without partial rollouts the weights change under the rollout only between generate
  // calls: the sync waits for the one in progress.
  const auto t_wait_start = Clock::now();
  if (ahead) {
    s.progress().begin(at + ": waiting for the rollout's generate call to end");
    ahead->before_sync();
  }
  o.t_wait = seconds_since(t_wait_start);
  const auto t3 = Clock::now();
  const double reload_compute = sync_->before_generating();
  s.progress().begin(at + ": sending the actor's weights to the rollout group");
  o.sync_compute = sync_->sync() + offload_compute + reload_compute;
  if (ahead) ahead->synced();
  s.progress().end();
  o.t_sync = seconds_since(t3);
  o.t_step = seconds_since(t0);
  o.busy = busy.since(s, o.t_step);
  return o;
}

// Multi-turn rollouts: turns per trajectory, tool calls and errors in the step, the
// environment's rewards and time, and the share of response tokens the environment wrote
// (outside the action mask: no loss on them).
static json trajectory_metrics(const Rollout& r) {
  const int64_t A = r.action_mask.size(1);
  const double response_tokens =
      r.attention_mask.narrow(1, r.attention_mask.size(1) - A, A).sum().item<double>();
  const double model_tokens = r.action_mask.sum().item<double>();
  return {{"turns_mean", r.turns.to(torch::kFloat64).mean().item<double>()},
          {"tool_calls", r.tool_calls.sum().item<int64_t>()},
          {"tool_call_rate", (r.tool_calls > 0).to(torch::kFloat64).mean().item<double>()},
          {"tool_errors", r.tool_errors.sum().item<int64_t>()},
          {"env_timeouts", r.env_timed_out.sum().item<int64_t>()},
          {"env_reward_mean", r.env_rewards.to(torch::kFloat64).mean().item<double>()},
          {"env_time_s", r.env_seconds.to(torch::kFloat64).sum().item<double>()},
          {"env_stall_s", r.env_stall_s},
          {"masked_token_share",
           response_tokens > 0 ? (response_tokens - model_tokens) / response_tokens : 0.0}};
}

json PpoJob::step_record(Scheduler& s, int64_t step, const StepOutcome& o, double kl_coef) {
  const Rollout& r = o.r;
  const Experience& e = o.e;
  const auto mask = r.action_mask.to(torch::kFloat32);
  const double tokens = r.attention_mask.sum().item<double>();
  // Worker compute on the step's critical path; the rest is scheduling, transport,
  // driver-side math (advantages, rewards) and waiting (bench/ppo_overhead measures it).
  const double compute =
      r.compute_s + e.compute_s + o.losses["compute_s"].get<double>() + o.sync_compute;
  json rec = {
      {"step", step},
      {"total_steps", total_steps_},
      {"reward_mean", e.scores.mean().item<double>()},
      {"reward_std", e.scores.std(false).item<double>()},
      {"reward", source_means(e.source_scores, rewards_->names())},
      {"return_mean", (e.adv.rewards.sum(1)).mean().item<double>()},
      {"kl", e.kl_mean},
      {"kl_coef", kl_coef},
      {"response_length", e.response_length.to(torch::kFloat32).mean().item<double>()},
      {"entropy", ((e.entropy * mask).sum() / mask.sum().clamp_min(1)).item<double>()},
      {"worker_compute_s", compute},
      {"overhead_share", std::max(0.0, 1.0 - compute / o.t_step)},
      {"time_s",
       {{"generate", o.t_gen + o.t_wait},
        {"generate_ahead", o.t_ahead},
        {"score", o.t_score},
        {"train", o.t_train},
        {"sync", o.t_sync},
        {"step", o.t_step}}},
      {"samples_per_s", static_cast<double>(r.sequences.size(0)) / o.t_step},
      {"tokens_per_s", tokens / o.t_step},
      {"weight_version", r.weight_version},
      {"staleness", staleness_json(r, o.policy_version)},
      {"rollout_preempted", r.preempted},
      {"rollout_kv_peak_bytes", r.kv_peak_bytes},
      {"prompts_consumed", o.consumed},
      {"weight_sync", sync_->last_sync()},
      {"rollout_logprob_diff", {{"mean", e.logprob_diff_mean}, {"max", e.logprob_diff_max}}},
      {"rollout_mismatch", mismatch_json(c_.policy.correction.mode, e.mismatch)},
      {"memory", runtime_.memory(s)},
      {"restarts", s.fault_counts()}};
  if (r.from_dataset) rec.erase("staleness");  // not sampled by any weights
  rec.update(o.busy);
  if (!sync_->offload().empty()) rec["offload"] = sync_->offload();
  rec.update(o.losses);
  if (!r.sampling.is_null()) rec.update(r.sampling);
  if (c_.overlong_buffer_len > 0)
    rec["overlong_penalty"] = e.overlong_penalty.mean().item<double>();
  if (r.turns.defined()) rec.update(trajectory_metrics(r));
  if (e.route_differ_share >= 0)  // the share of routed tokens whose experts differ
    rec["routing"] = {{"differ_share", e.route_differ_share},
                      {"router_differ_share", e.router_differ_share}};
  if (roles_.teacher) {  // distill/reverse_kl, and GKD's divergence as distill/gkd
    rec["distill"] = {{"reverse_kl", e.reverse_kl_mean}};
    if (c_.gkd_lambda < 1) rec["distill"]["on_policy"] = r.from_dataset ? 0 : 1;
    if (rec.contains("gkd_loss")) {
      rec["distill"]["gkd"] = rec["gkd_loss"];
      rec.erase("gkd_loss");
    }
  }
  if (!r.judges.is_null()) rec["judge"] = r.judges;  // judge/<name>/unparsed
  return rec;
}

namespace {

// A logged sample's distillation details: the sequence's token ids (padding dropped) and, for
// each response token, the actor's and the teacher's log-probs and their difference (what a
// user reads to see where the teacher disagrees; `rlhf logprobs` of the teacher on input_ids
// gives the same teacher numbers).
json distill_row(const Rollout& r, const Experience& e, int64_t i) {
  const auto values = [](const torch::Tensor& row, const torch::Tensor& keep) {
    const auto kept = row.masked_select(keep != 0).to(torch::kFloat64).contiguous();
    return std::vector<double>(kept.data_ptr<double>(), kept.data_ptr<double>() + kept.numel());
  };
  const auto mask = r.action_mask[i];
  const auto ids = r.sequences[i].masked_select(r.attention_mask[i] != 0).contiguous();
  const auto teacher = values(e.log_probs_teacher[i], mask);
  const auto kl = values(e.reverse_kl[i], mask);
  std::vector<double> actor(teacher.size());
  for (size_t t = 0; t < teacher.size(); ++t) actor[t] = teacher[t] + kl[t];
  return {{"input_ids",
           std::vector<int64_t>(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + ids.numel())},
          {"actor_log_probs", actor},
          {"teacher_log_probs", teacher},
          {"reverse_kl",
           e.reverse_kl[i].sum().item<double>() / std::max(1.0, mask.sum().item<double>())}};
}

}  // namespace

// A few generations of the step, spread over its prompts, to read beside the numbers.
void PpoJob::write_samples(int64_t step, const StepOutcome& o) {
  const Rollout& r = o.r;
  const int64_t b = r.sequences.size(0), k = std::min(b, settings_.logged_samples);
  if (k <= 0) return;
  json rows = json::array();
  for (int64_t j = 0; j < k; ++j) {
    const auto i = static_cast<size_t>(j * b / k);
    json row = {{"prompt", r.prompts[i]},
                {"response", r.responses[i]},
                {"reward", o.e.scores[static_cast<int64_t>(i)].item<double>()}};
    if (!r.conversations.empty()) {
      // The whole conversation: the formatted prompt, then every turn with its role.
      json turns = json::array({{{"role", "prompt"}, {"content", r.prompts[i]}}});
      for (const auto& turn : r.conversations[i]) turns.push_back(turn);
      row["conversation"] = std::move(turns);
      row["env_reward"] = r.env_rewards[static_cast<int64_t>(i)].item<double>();
    }
    if (roles_.teacher) row["distill"] = distill_row(r, o.e, static_cast<int64_t>(i));
    rows.push_back(std::move(row));
  }
  runtime_.metrics().samples(step, rows);
}

std::vector<Role> PpoJob::trained_roles() const {
  if (roles_.critic) return {Role::kActor, Role::kCritic};
  return {Role::kActor};
}

void PpoJob::save(Scheduler& s, int64_t step, int64_t prompts_consumed, std::ostream& out) {
  runtime_.save(s, step, trained_roles(),
                {{"prompts_consumed", prompts_consumed}, {"kl_coef", kl_.value()}}, out);
}

int64_t PpoJob::resume(Scheduler& s, std::ostream& out) {
  const engine::DriverState state = runtime_.resume(s, trained_roles(), out);
  stream_->seek(state.data.at("prompts_consumed").get<int64_t>());
  kl_.set_value(state.data.at("kl_coef").get<double>());
  return state.step;
}

}  // namespace rlhf::ppo::job
