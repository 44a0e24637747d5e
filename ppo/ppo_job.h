// Private to rlhf_ppo_driver: the PPO-family job (ppo_driver's PpoJob). It reads the spec
// once, when it is built, into typed settings; `run` starts the roles through the job
// runtime (runtime/job_runtime.h, shared with dpo/), builds the step's phases (phases.h:
// making experience, training, the weight sync, evaluation) and runs the step loop. Files:
//   driver.cpp      setup (data, tokenizer, reward sources), starting the roles, `run`
//   step_loop.cpp   the step loop (with algo.max_staleness k > 0, the next steps' samples
//                   are drawn ahead while this step scores and trains: rollout_pipeline.h),
//                   each step's metrics, checkpoints and resume
//   sampling.cpp    a step's samples (DAPO's dynamic sampling, on arriving groups when
//                   streamed; the scoring lanes of streaming: stream_scorer.h)
//   experience.cpp, training.cpp, syncing.cpp, evaluation.cpp: the phases
//   judge_engine.cpp  a generative judge on the job's own judge group
// Drivers call role groups through the scheduler's handles with typed requests; nothing
// here includes actors/.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "core/spec.h"
#include "engine/role_config.h"
#include "ppo/driver.h"
#include "ppo/judge_engine.h"
#include "ppo/kl.h"
#include "ppo/phases.h"
#include "ppo/ppo_config.h"
#include "ppo/prompt_batches.h"
#include "ppo/prompt_dataset.h"
#include "ppo/rollout_data.h"
#include "rollout/worker_ops.h"
#include "runtime/job_runtime.h"
#include "scheduler/role_group.h"

// (Scheduler, Tokenizer and RewardSources are declared by phases.h.)
namespace rlhf::ppo::job {

class RolloutPipeline;

// One step's samples, experience and figures, for its metrics record and console line.
struct StepOutcome {
  Rollout r;
  Experience e;
  nlohmann::json losses;    // train()'s averages, updates and compute_s
  int64_t consumed = 0;     // prompts consumed by this step (not the next step's)
  double sync_compute = 0;  // worker compute of the sync and sleep-mode calls
  double t_gen = 0;         // this step's samples (0-ish when generated ahead)
  double t_ahead = 0;       // drawing this step's samples ahead, beside earlier steps' work
  double t_score = 0, t_train = 0;
  double t_wait = 0;  // the sync waiting for the rollout's generate call (no partial rollouts)
  int64_t policy_version = 0;  // the weight version this step trains (syncs so far this run)
  double t_sync = 0, t_step = 0;
  nlohmann::json busy;  // runtime::BusyWindow over the step: busy_s, idle_s, devices_busy
};

// What the job reads of the spec beyond PpoConfig, once, when it is built: the roles'
// configs and the settings of the calls it makes to them. The job keeps no JobSpec.
struct JobSettings {
  // Each loaded model role's Init config (actor, critic, ref, reward, as the spec uses them);
  // start_roles sets a trained role's micro batches per step from its group's size.
  std::map<Role, engine::ModelRoleConfig> roles;
  std::map<Role, Dispatch> dispatch;  // how a scatter spreads over each model role's ranks
  // The rollout group's load request: model, dtype, the engine of the rollout section, and
  // with an environment its config, tokenizer and chat template (stop tokens, the KV budget
  // and the TP store are added in start_roles).
  ops::LoadModel rollout;
  double kv_cache_gb = 0;      // per rollout worker (auto: what the plan leaves; 0 on CPUs)
  bool kv_cache_auto = false;  // rollout.kv_cache_memory_gb is "auto"
  double gpu_memory_utilization = 0;
  SyncSettings sync;           // the weight sync's and the colocation policy's
  std::string actor_model;     // its tokenizer files go beside the exported actor
  int64_t logged_samples = 0;  // logger.samples_per_step

  // `trained_steps`: optimizer steps the LR schedules span.
  static JobSettings from_spec(const JobSpec& spec, const PpoConfig& c, int64_t trained_steps);
};

class PpoJob {
 public:
  PpoJob(const JobSpec& spec, PpoDriverOptions options);
  ~PpoJob();
  void run(Scheduler& scheduler, std::ostream& out);

 private:
  // Setup (driver.cpp).
  std::vector<TokenizedPrompt> tokenize_prompts(const JobSpec& spec, const PromptDataConfig& data);
  // Every role's start-up through the runtime (the rollout's load_model, the model roles' init).
  void start_roles(Scheduler& s, std::ostream& out);
  // The rollout group's load_model arguments; adds the engines to `workers` under TP.
  ops::LoadModel rollout_load_request(Scheduler& s, std::string& workers) const;
  // The phases, once the workers are up.
  void build_phases(Scheduler& s, std::ostream& out);
  // The roles whose lost workers come back alone (fault.max_restarts), from reloads_.
  void allow_restarts(Scheduler& s, std::ostream& out);

  // The step loop (step_loop.cpp): steps after `step` up to total_steps_.
  void run_steps(Scheduler& s, int64_t step, std::ostream& out);
  // One step: its samples (from `ahead` when drawn ahead, algo.max_staleness > 0), scoring,
  // training, sync.
  StepOutcome run_step(Scheduler& s, int64_t step, RolloutPipeline* ahead);
  nlohmann::json step_record(Scheduler& s, int64_t step, const StepOutcome& o, double kl_coef);
  void write_samples(int64_t step, const StepOutcome& o);
  // Checkpoints through the runtime: the actor's and critic's shards, then the driver's
  // state (prompts consumed: where a resume continues the prompt stream, not counting those
  // drawn ahead for later steps, which a resume draws again; the KL coefficient).
  void save(Scheduler& s, int64_t step, int64_t prompts_consumed, std::ostream& out);
  int64_t resume(Scheduler& s, std::ostream& out);
  std::vector<Role> trained_roles() const;

  PpoDriverOptions options_;
  PpoConfig c_;
  JobSettings settings_;
  runtime::JobRuntime runtime_;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  int64_t eos_id_ = -1, pad_id_ = 0;
  std::unique_ptr<PromptStream> stream_;
  std::vector<TokenizedPrompt> eval_prompts_;  // held-out prompts (empty: no evaluation)
  EvalSettings eval_;
  int64_t truncated_prompts_ = 0;
  int64_t total_steps_ = 0;
  KlController kl_;
  std::unique_ptr<rewards::RewardSources> rewards_;
  JobRoles roles_;
  // A reward.sources judge without a url: the judge group's engine (judge_engine.h), built in
  // start_roles.
  std::unique_ptr<LocalJudge> judge_;
  std::string judge_model_, judge_dtype_;
  // The phases (phases.h), built in `run` once the workers are up.
  std::unique_ptr<ExperienceMaker> experience_;
  std::unique_ptr<PolicyTrainer> trainer_;
  std::unique_ptr<WeightSync> sync_;
  std::unique_ptr<Evaluator> evaluator_;
  // Each role's reload of one relaunched rank (null: it cannot be loaded alone).
  std::map<Role, std::function<void(int)>> reloads_;
};

}  // namespace rlhf::ppo::job
