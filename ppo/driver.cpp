// The PPO-family job's setup and top loop: data, tokenizer and reward sources, loading every
// role, then `run` (resume, first sync, the step loop, export). The phases are in their own
// files (see ppo_job.h).
#include "ppo/driver.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <functional>
#include <iomanip>
#include <mutex>
#include <sstream>

#include "core/errors.h"
#include "core/run_dir.h"
#include "core/text.h"
#include "engine/driver_state.h"
#include "engine/memory_check.h"
#include "engine/memory_plan.h"
#include "engine/phase_policy.h"
#include "engine/role_config.h"
#include "ppo/ppo_job.h"
#include "report/metrics.h"
#include "rewards/reward_sources.h"
#include "rollout/generation_config.h"
#include "scheduler/role_group.h"
#include "scheduler/scheduler.h"
#include "tokenizer/prompt_format.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_config.h"

namespace rlhf::ppo {
namespace job {

namespace fs = std::filesystem;
using nlohmann::json;

double scatter_compute(const Message& reply, int ranks) {
  double sum = 0;
  for (const auto& mb : reply.args.value("micro_batches", json::array()))
    sum += mb.value("compute_s", 0.0);
  return sum / std::max(1, ranks);
}
std::string seconds_text(double seconds) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(1) << seconds;
  return o.str();
}

std::string fmt(double v, int precision) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(precision) << v;
  return o.str();
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

JobSettings JobSettings::from_spec(const JobSpec& spec, const PpoConfig& c, int64_t trained_steps) {
  JobSettings j;
  j.roles = engine::model_role_configs(spec, trained_steps);
  j.dispatch = model_role_dispatch(spec);
  // The engine of the spec's rollout section (the same function `rlhf generate` builds its
  // engine with).
  j.rollout.generation = rollout::generation_config_from_rollout_section(spec.json().at("rollout"));
  j.rollout.model = spec.get_string("rollout.model");
  j.rollout.dtype = spec.get_string("rollout.dtype");
  if (!c.environment.is_null()) {
    j.rollout.env = envs::EnvironmentConfig::from_spec(spec);
    // The engine renders the environment's turns with the actor's tokenizer and the data's
    // chat template (rollout/trajectory.h).
    j.rollout.tokenizer = spec.get_string("actor.model");
    j.rollout.chat_template = spec.get_string("data.chat_template");
  }
  j.kv_cache_gb = engine::kv_cache_gb_for_run(spec);
  j.kv_cache_auto = spec.at("rollout.kv_cache_memory_gb").is_string();
  j.gpu_memory_utilization = spec.get_float("rollout.gpu_memory_utilization");
  j.phases = engine::PhaseSettings::from_spec(spec);
  j.actor_model = spec.get_string("actor.model");
  j.trajectory_settings = engine::trajectory_settings(spec);
  j.tensorboard = spec.get_bool("logger.tensorboard");
  j.logged_samples = spec.get_int("logger.samples_per_step");
  j.sync_bucket_bytes =
      static_cast<int64_t>(spec.get_float("rollout.sync_bucket_mb") * static_cast<double>(1 << 20));
  j.lora_sync = spec.get_string("rollout.lora_sync");
  return j;
}

PpoJob::PpoJob(const JobSpec& spec, PpoDriverOptions options)
    : options_(options),
      kl_(spec.get_float("algo.kl.init_coef"), spec.get_float("algo.kl.target"),
          spec.get_int("algo.kl.horizon")) {
  run_dir_ = run_directory(spec);
  c_ = PpoConfig::from_spec(spec, run_dir_);
  // No ref workers for a LoRA actor on the reference's model (core/spec_rules.cpp used_roles).
  ref_from_actor_ =
      !spec.uses(Role::kRef) &&
      (spec.get_float("algo.kl.init_coef") > 0 || spec.get_bool("algo.kl.use_loss")) &&
      (spec.get_int("actor.lora.rank") > 0 || !spec.get_string("actor.lora.adapter").empty());
  has_ref_ = spec.uses(Role::kRef) || ref_from_actor_;
  has_critic_ = spec.uses(Role::kCritic);
  has_reward_model_ = spec.uses(Role::kReward);
  {
    auto rc = rewards::RewardSourcesConfig::from_spec(spec);
    rc.python_log_path = (fs::path(run_dir_) / "logs" / "python_rewards.log").string();
    fs::create_directories(fs::path(rc.python_log_path).parent_path());
    rewards_ = std::make_unique<rewards::RewardSources>(rc);
  }
  tokenizer_ = tokenizer::load_tokenizer(spec.get_string("actor.model"));
  const auto& special = tokenizer_->special_ids();
  if (!special.eos)
    throw InputError(spec.get_string("actor.model") + ": the tokenizer has no EOS token");
  eos_id_ = *special.eos;
  pad_id_ = special.pad ? *special.pad : eos_id_;
  stream_ = std::make_unique<PromptStream>(
      tokenize_prompts(spec, PromptDataConfig::from_spec(spec)), pad_id_, c_.seed);
  if (!spec.get_string("data.eval_dataset").empty()) {
    eval_prompts_ = tokenize_prompts(spec, PromptDataConfig::from_spec(spec, /*eval=*/true));
    eval_steps_ = spec.get_int("eval.steps");
    eval_samples_ = spec.get_int("eval.n_samples");
    eval_accuracy_source_ = spec.get_string("eval.accuracy_source");
    const auto& names = rewards_->names();
    if (!eval_accuracy_source_.empty() &&
        std::find(names.begin(), names.end(), eval_accuracy_source_) == names.end())
      throw InputError("eval.accuracy_source: no reward source named \"" + eval_accuracy_source_ +
                       "\" (sources: " + join(names, ", ") + ")");
  }
  const int64_t steps_per_episode =
      (stream_->size() + c_.rollout_batch_size - 1) / c_.rollout_batch_size;
  total_steps_ = c_.max_steps > 0 ? c_.max_steps : c_.num_episodes * steps_per_episode;
  settings_ = JobSettings::from_spec(spec, c_, total_steps_ * c_.optimizer_steps_per_step());
}

PpoJob::~PpoJob() = default;

std::vector<TokenizedPrompt> PpoJob::tokenize_prompts(const JobSpec& spec,
                                                      const PromptDataConfig& source) {
  PromptDataset data = load_prompts(source);
  tokenizer::PromptFormatConfig fc;
  fc.input_template = spec.get_string("data.input_template");
  fc.apply_chat_template = spec.get_bool("data.apply_chat_template");
  fc.chat_template = tokenizer::parse_chat_template(spec.get_string("data.chat_template"));
  tokenizer::PromptFormatter formatter(
      fc, tokenizer::read_tokenizer_config(spec.get_string("actor.model")));
  std::vector<TokenizedPrompt> out;
  for (const auto& row : data.rows) {
    TokenizedPrompt p;
    p.text = formatter.format(row.input);
    // A chat template writes BOS itself; plain and templated prompts get the tokenizer's.
    auto ids = tokenizer_->encode(
        p.text, fc.apply_chat_template ? tokenizer::AddSpecial::kNo : tokenizer::AddSpecial::kYes);
    // Keep the end of an over-long prompt: the response continues from it.
    if (static_cast<int64_t>(ids.size()) > c_.prompt_max_len) {
      ids.erase(ids.begin(), ids.end() - c_.prompt_max_len);
      ++truncated_prompts_;
    }
    p.ids.assign(ids.begin(), ids.end());
    p.label = row.label;
    if (rewards_->reads_rows() || !c_.environment.is_null()) p.columns = row.columns;
    out.push_back(std::move(p));
  }
  return out;
}

ops::LoadModel PpoJob::rollout_load_request(Scheduler& s, double kv_cache_gb,
                                            std::string& workers) {
  RoleGroup& g = s.group(Role::kRollout);
  std::vector<int64_t> stop = c_.stop_token_ids;
  stop.push_back(eos_id_);
  // Engines of tensor_parallel_size consecutive workers: every micro batch goes to all
  // ranks of one engine (see generate).
  g.set_ranks_per_replica(c_.tensor_parallel_size);
  if (c_.tensor_parallel_size > 1)
    workers += ": " + std::to_string(g.replicas()) + " engine" + (g.replicas() == 1 ? "" : "s") +
               " of tensor parallel size " + std::to_string(c_.tensor_parallel_size);
  // The engine of the spec's rollout section, with the tokenizer's stop and pad tokens and
  // the pool the plan sized.
  ops::LoadModel request = settings_.rollout;
  rollout::GenerationConfig& generation = request.generation;
  generation.kv_cache_bytes =
      static_cast<int64_t>(kv_cache_gb * static_cast<double>(int64_t{1} << 30));
  generation.pad_token_id = pad_id_;
  if (!c_.environment.is_null()) {
    // Multi-turn rollouts: a turn ends at the template's end-of-turn token, which is not
    // always the tokenizer's EOS (Llama-3.0's is <|end_of_text|>).
    for (const char* end_of_turn : {"<|im_end|>", "<|eot_id|>"})
      if (const auto id = tokenizer_->token_to_id(end_of_turn)) stop.push_back(*id);
    request.max_turns = c_.max_turns;
  }
  generation.stop_token_ids = stop;
  request.tensor_parallel_size = static_cast<int>(c_.tensor_parallel_size);
  if (c_.tensor_parallel_size > 1) request.tp_store_path = s.rendezvous("rollout_tp");
  return request;
}

void PpoJob::init_roles(Scheduler& s, std::ostream& out) {
  const auto t0 = Clock::now();
  std::mutex out_mutex;  // roles finish on their own threads
  // rollout.kv_cache_memory_gb auto: on GPUs the pool the plan leaves in the generate phase.
  const double kv_cache_gb = settings_.kv_cache_gb;
  if (settings_.kv_cache_auto && kv_cache_gb > 0)
    out << "ppo: rollout KV cache (auto): " << std::fixed << std::setprecision(2) << kv_cache_gb
        << " GiB per rollout worker (rollout.gpu_memory_utilization "
        << settings_.gpu_memory_utilization << ")" << std::defaultfloat << std::endl;
  std::vector<std::future<void>> calls;
  for (Role role : s.roles()) {
    RoleGroup& g = s.group(role);
    std::string workers = std::to_string(g.size()) + " worker" + (g.size() == 1 ? "" : "s");
    std::function<void()> load;
    if (role == Role::kRollout) {
      load = [&g, request = rollout_load_request(s, kv_cache_gb, workers)] { g.call_all(request); };
    } else {
      auto found = settings_.roles.find(role);
      if (found == settings_.roles.end())
        throw RuntimeError(std::string("ppo: no config for the ") + role_name(role) + " group");
      ops::Init request{found->second, s.rendezvous(role_name(role))};
      if (request.config.trainer) {  // micro batches per optimizer step on each rank
        const int64_t accum = c_.train_batch_size / (c_.train_micro_batch_size * g.size());
        request.config.trainer->grad_accum_steps = std::max<int64_t>(1, accum);
      }
      load = [&g, request] { g.call_all(request); };
    }
    out << "ppo: loading " << role_name(role) << " (" << workers << ")" << std::endl;
    calls.push_back(in_parallel([&g, &out, &out_mutex, t0, load] {
      load();
      std::lock_guard<std::mutex> lock(out_mutex);
      out << "ppo: " << role_name(g.role()) << " ready after " << seconds_text(seconds_since(t0))
          << " s" << std::endl;
    }));
  }
  for (auto& c : calls) c.get();
  const auto actor = s.group(Role::kActor).call_all(ops::Info{});
  const auto rollout = s.group(Role::kRollout).call_all(ops::Info{});
  sync_route_ = sync_route(actor, rollout, c_.tensor_parallel_size);
  choose_sleep_mode(rollout, out);
}

void PpoJob::choose_sleep_mode(const std::vector<Answered<ops::InfoReply>>& rollout,
                               std::ostream& out) {
  // The same policy the memory planner planned the phases with (engine/phase_policy.h).
  const engine::PhasePolicy policy =
      engine::phase_policy(settings_.phases, rollout.at(0).reply.device.rfind("cuda", 0) == 0);
  sleep_rollout_ = policy.rollout_sleeps;
  offload_optimizer_ = policy.actor_offloads_optimizer;
  if (sleep_rollout_ || offload_optimizer_)
    out << "ppo: colocated on the GPU:"
        << (sleep_rollout_ ? " the rollout's weights go to host memory while the actor trains" : "")
        << (sleep_rollout_ && offload_optimizer_ ? ";" : "")
        << (offload_optimizer_ ? " the actor's optimizer state goes to host memory while the "
                                 "rollout generates"
                               : "")
        << std::endl;
}

void PpoJob::run(Scheduler& s, std::ostream& out) {
  planned_ = engine::planned_roles(run_dir_);
  MetricsSink metrics((fs::path(run_dir_) / "metrics.jsonl").string(), settings_.tensorboard);
  out << "ppo: " << stream_->size() << " prompts (" << truncated_prompts_ << " truncated to "
      << c_.prompt_max_len << " tokens), " << total_steps_ << " steps of " << c_.rollout_batch_size
      << " prompts x " << c_.n_samples_per_prompt << " samples; metrics: " << metrics.path()
      << std::endl;
  s.progress().begin("loading models");
  init_roles(s, out);
  int64_t step = 0;
  if (options_.resume) {
    s.progress().begin("loading the checkpoint");
    step = resume(s);
    out << "ppo: resumed after step " << step << " from " << c_.ckpt_path << std::endl;
  }
  s.progress().begin("sending the actor's weights to the rollout group");
  sync_weights(s);
  before_generating(s);
  // Held-out accuracy before training (or at the resumed step unless the interrupted run
  // logged it already), every eval.steps, at the end.
  if (!eval_prompts_.empty() && !(options_.resume && evaluated_at(step)))
    evaluate(s, step, metrics, out);
  run_steps(s, step, metrics, out);
  if (c_.export_hf) export_actor(s, out);
  out << "ppo: done; metrics in " << metrics.path() << std::endl;
}

}  // namespace job

JobDriver ppo_driver(const JobSpec& spec, PpoDriverOptions options) {
  auto ppo_job = std::make_shared<job::PpoJob>(spec, options);
  return [ppo_job](Scheduler& scheduler, std::ostream& out) { ppo_job->run(scheduler, out); };
}

}  // namespace rlhf::ppo
