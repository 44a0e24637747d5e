// The PPO-family job's setup and top loop: data, tokenizer and reward sources, starting every
// role through the job runtime, building the phases (phases.h), then `run` (resume, first
// sync, the step loop, export).
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
  j.sync.phases = engine::PhaseSettings::from_spec(spec);
  j.sync.bucket_bytes =
      static_cast<int64_t>(spec.get_float("rollout.sync_bucket_mb") * static_cast<double>(1 << 20));
  j.sync.lora_sync = spec.get_string("rollout.lora_sync");
  j.sync.tensor_parallel_size = c.tensor_parallel_size;
  j.actor_model = spec.get_string("actor.model");
  j.logged_samples = spec.get_int("logger.samples_per_step");
  return j;
}

PpoJob::PpoJob(const JobSpec& spec, PpoDriverOptions options)
    : options_(options),
      c_(PpoConfig::from_spec(spec)),
      runtime_(runtime::RuntimeSettings::from_spec(spec, "ppo")),
      kl_(spec.get_float("algo.kl.init_coef"), spec.get_float("algo.kl.target"),
          spec.get_int("algo.kl.horizon")) {
  // No ref workers for a LoRA actor on the reference's model (core/spec_rules.cpp used_roles).
  roles_.ref_from_actor =
      !spec.uses(Role::kRef) &&
      (spec.get_float("algo.kl.init_coef") > 0 || spec.get_bool("algo.kl.use_loss")) &&
      (spec.get_int("actor.lora.rank") > 0 || !spec.get_string("actor.lora.adapter").empty());
  roles_.ref = spec.uses(Role::kRef) || roles_.ref_from_actor;
  roles_.critic = spec.uses(Role::kCritic);
  roles_.reward_model = spec.uses(Role::kReward);
  roles_.teacher = spec.uses(Role::kTeacher);
  if (spec.uses(Role::kJudge)) {
    judge_model_ = spec.get_string("judge.model");
    judge_dtype_ = spec.get_string("judge.dtype");
  }
  {
    auto rc = rewards::RewardSourcesConfig::from_spec(spec);
    rc.python_log_path =
        (fs::path(runtime_.settings().run_dir) / "logs" / "python_rewards.log").string();
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
    eval_.steps = spec.get_int("eval.steps");
    eval_.n_samples = spec.get_int("eval.n_samples");
    eval_.accuracy_source = spec.get_string("eval.accuracy_source");
    const auto& names = rewards_->names();
    if (!eval_.accuracy_source.empty() &&
        std::find(names.begin(), names.end(), eval_.accuracy_source) == names.end())
      throw InputError("eval.accuracy_source: no reward source named \"" + eval_.accuracy_source +
                       "\" (sources: " + join(names, ", ") + ")");
  }
  const int64_t steps_per_episode =
      (stream_->size() + c_.rollout_batch_size - 1) / c_.rollout_batch_size;
  total_steps_ = c_.max_steps > 0 ? c_.max_steps : c_.num_episodes * steps_per_episode;
  settings_ = JobSettings::from_spec(spec, c_, total_steps_ * c_.optimizer_steps_per_step());
  // The held-out evaluation's slice (its schedule and source were read above).
  eval_.temperature = c_.temperature;
  eval_.seed = c_.seed;
  eval_.logged_samples = settings_.logged_samples;
  eval_.max_tokens_per_micro_batch = c_.max_tokens_per_micro_batch;
  eval_.micro_batch_size = c_.rollout_micro_batch_size;
  if (roles_.reward_model) eval_.reward_dispatch = settings_.dispatch.at(Role::kReward);
  eval_.pad_id = pad_id_;
  eval_.teacher = roles_.teacher;
  eval_.run_dir = runtime_.settings().run_dir;
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
    if (!source.output_key.empty()) {  // GKD's dataset response: its tokens, then EOS
      const auto r = tokenizer_->encode(row.response, tokenizer::AddSpecial::kNo);
      p.response_ids.assign(r.begin(), r.end());
      p.response_ids.push_back(eos_id_);
      if (static_cast<int64_t>(p.response_ids.size()) > c_.max_new_tokens)
        p.response_ids.resize(static_cast<size_t>(c_.max_new_tokens));
    }
    if (rewards_->reads_rows() || !c_.environment.is_null()) p.columns = row.columns;
    out.push_back(std::move(p));
  }
  return out;
}

ops::LoadModel PpoJob::rollout_load_request(Scheduler& s, std::string& workers) const {
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
      static_cast<int64_t>(settings_.kv_cache_gb * static_cast<double>(int64_t{1} << 30));
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

void PpoJob::start_roles(Scheduler& s, std::ostream& out) {
  // rollout.kv_cache_memory_gb auto: on GPUs the pool the plan leaves in the generate phase.
  if (settings_.kv_cache_auto && settings_.kv_cache_gb > 0)
    out << "ppo: rollout KV cache (auto): " << runtime::fixed(settings_.kv_cache_gb, 2)
        << " GiB per rollout worker (rollout.gpu_memory_utilization "
        << runtime::fixed(settings_.gpu_memory_utilization, 2) << ")" << std::endl;
  runtime_.start_roles(
      s,
      [&](RoleGroup& g) -> runtime::RoleStart {
        std::string workers = std::to_string(g.size()) + " worker" + (g.size() == 1 ? "" : "s");
        if (g.role() == Role::kJudge) {  // the judge's engines, one per device
          judge_ =
              std::make_unique<LocalJudge>(g, judge_model_, c_.rollout_micro_batch_size, c_.seed);
          rewards_->set_judge_engine(
              [this](const std::vector<std::string>& contents, const rewards::JudgeConfig& c) {
                return (*judge_)(contents, c);
              });
          ops::LoadModel engine = settings_.rollout;  // the rollout section's engine settings
          engine.generation.kv_cache_bytes =
              static_cast<int64_t>(settings_.kv_cache_gb * static_cast<double>(int64_t{1} << 30));
          const ops::LoadModel request =
              judge_->load_request(engine, judge_dtype_, rewards_->local_judge_max_tokens());
          return {workers, [&g, request] { g.call_all(request); },
                  [&g, request](int rank) { g.call(rank, request); }};
        }
        runtime::RoleStart started;
        if (g.role() != Role::kRollout) {
          started = runtime_.init_role(s, g, settings_.roles, c_.train_batch_size,
                                       c_.train_micro_batch_size);
        } else {
          ops::LoadModel request = rollout_load_request(s, workers);
          started = {workers, [&g, request] { g.call_all(request); },
                     [&g, request](int rank) { g.call(rank, request); }};
        }
        reloads_[g.role()] = started.reload;
        return started;
      },
      out);
}

// Fault tolerance (fault.max_restarts): the roles whose lost workers are relaunched and catch
// up alone, each with its load request again and a rollout engine with the weights the
// others hold. Anything else lost (an actor or critic rank, a sharded scorer, a
// tensor-parallel engine) fails the run, which rlhf run restarts from its last checkpoint.
void PpoJob::allow_restarts(Scheduler& s, std::ostream& out) {
  if (s.config().max_restarts <= 0) return;
  std::vector<std::string> alone;
  for (const auto& [role, reload] : reloads_) {
    if (!reload) continue;
    RoleGroup& g = s.group(role);
    if (role == Role::kRollout) {
      if (!sync_->revivable(settings_.dispatch.at(Role::kActor) == Dispatch::kLeastLoaded))
        continue;
      g.set_revive([this, reload = reload](int rank) {
        reload(rank);
        sync_->resend(rank);
      });
    } else {
      g.set_revive(reload);
    }
    alone.push_back(role_name(role));
  }
  out << "ppo: fault: " << (alone.empty() ? "no role" : join(alone, ", "))
      << " workers are relaunched alone when lost (at most " << s.config().max_restarts
      << " per role within fault.restart_window_s); any other lost worker restarts the job from "
         "its last checkpoint"
      << std::endl;
}

void PpoJob::build_phases(Scheduler& s, std::ostream& out) {
  const RoleGroups groups = RoleGroups::of(s);
  experience_ = std::make_unique<ExperienceMaker>(
      ExperienceSettings::from(c_, roles_, settings_.dispatch, eos_id_, pad_id_), groups,
      *tokenizer_, *rewards_, *stream_, kl_);
  trainer_ = std::make_unique<PolicyTrainer>(TrainingSettings::from(c_, roles_), *groups.actor,
                                             groups.critic, kl_, s.progress());
  sync_ =
      std::make_unique<WeightSync>(settings_.sync, *groups.actor, *groups.rollout,
                                   [&s](const std::string& name) { return s.rendezvous(name); });
  sync_->choose(out);
  allow_restarts(s, out);
  evaluator_ = std::make_unique<Evaluator>(eval_, eval_prompts_, *experience_, rewards_->names(),
                                           groups.reward, s.progress());
}

void PpoJob::run(Scheduler& s, std::ostream& out) {
  report::MetricsSink& metrics = runtime_.open_metrics();
  out << "ppo: " << stream_->size() << " prompts (" << truncated_prompts_ << " truncated to "
      << c_.prompt_max_len << " tokens), " << total_steps_ << " steps of " << c_.rollout_batch_size
      << " prompts x " << c_.n_samples_per_prompt << " samples; metrics: " << metrics.path()
      << std::endl;
  s.progress().begin("loading models");
  start_roles(s, out);
  build_phases(s, out);
  int64_t step = 0;
  if (options_.resume) step = resume(s, out);
  s.progress().begin("sending the actor's weights to the rollout group");
  sync_->sync();
  sync_->before_generating();
  // Held-out accuracy before training (or at the resumed step unless the interrupted run
  // logged it already), every eval.steps, at the end.
  if (!evaluator_->empty() && !(options_.resume && evaluator_->evaluated_at(step)))
    evaluator_->evaluate(step, metrics, out);
  run_steps(s, step, out);
  if (runtime_.settings().export_hf)
    runtime_.export_model(s, Role::kActor, settings_.actor_model, out);
  out << "ppo: done; metrics in " << metrics.path() << std::endl;
}

}  // namespace job

JobDriver ppo_driver(const JobSpec& spec, PpoDriverOptions options) {
  auto ppo_job = std::make_shared<job::PpoJob>(spec, options);
  return [ppo_job](Scheduler& scheduler, std::ostream& out) { ppo_job->run(scheduler, out); };
}

}  // namespace rlhf::ppo
