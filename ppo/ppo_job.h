// Private to rlhf_ppo_driver: the PPO-family job (ppo_driver's PpoJob) and what its phases
// share. One file per phase:
//   driver.cpp      setup (data, tokenizer, reward sources, loading the roles) and `run`
//   experience.cpp  making experience: generate (with dynamic sampling), score, advantages
//   training.cpp    the actor's and critic's train steps over the experience
//   syncing.cpp     actor -> rollout weight sync and the colocation sleep mode around it
//   step_loop.cpp   the step loop (with algo.async_steps 1, the next step's samples are
//                   generated while this step scores and trains) and each step's metrics
//   evaluation.cpp  held-out evaluation
//   checkpoint.cpp  save, resume, HF export
// Drivers call role groups through the scheduler's handles by operation name; nothing here
// includes actors/.
#pragma once

#include <torch/types.h>

#include <chrono>
#include <cstdint>
#include <future>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "core/spec.h"
#include "core/timing.h"
#include "engine/phase_policy.h"
#include "engine/role_config.h"
#include "ppo/advantages.h"
#include "ppo/driver.h"
#include "ppo/kl.h"
#include "ppo/ppo_config.h"
#include "ppo/prompt_batches.h"
#include "ppo/prompt_dataset.h"
#include "ppo/rollout_correction.h"
#include "ppo/worker_ops.h"
#include "rollout/worker_ops.h"
#include "scheduler/role_group.h"
#include "transport/message.h"
#include "transport/worker_ops.h"

namespace rlhf {
class Scheduler;
namespace report {
class MetricsSink;
}  // namespace report
using report::MetricsSink;
namespace tokenizer {
class Tokenizer;
}  // namespace tokenizer
namespace rewards {
class RewardSources;
}  // namespace rewards
}  // namespace rlhf

namespace rlhf::ppo::job {

using Clock = std::chrono::steady_clock;

// Worker compute of one role-group call on its critical path: a scatter's micro batches
// spread over the group's ranks (sum / ranks); call_all's ranks run together (max).
double scatter_compute(const Message& reply, int ranks);
// (A call_all's: slowest_compute, transport/operation.h.)
// "1.2": seconds for console lines (without touching the stream's number format).
std::string seconds_text(double seconds);
// `v` with `precision` decimals, for console lines.
std::string fmt(double v, int precision = 3);
// {name: mean score} of each reward source ([S, B]; NaN scores, "not applicable", left out).
nlohmann::json source_means(const torch::Tensor& source_scores,
                            const std::vector<std::string>& names);

// Runs f on its own thread (role groups are independent, so their calls overlap).
template <typename F>
auto in_parallel(F&& f) {
  return std::async(std::launch::async, std::forward<F>(f));
}

// One step's samples, prompt-major (the n samples of a prompt are consecutive).
struct Rollout {
  torch::Tensor sequences;            // [B, T] prompt (left-padded) + response (right-padded)
  torch::Tensor attention_mask;       // [B, T]
  torch::Tensor action_mask;          // [B, A] tokens the model sampled (up to and including
                                      // EOS; an environment's turns between them are 0)
  torch::Tensor behaviour_log_probs;  // [B, A] FP32 log-probs the rollout sampled from
  std::vector<std::string> prompts, responses, labels;  // [B]
  std::vector<nlohmann::json> columns;  // [B] the rows' other columns for Python rewards
  torch::Tensor scores;         // [B] reward-source total when dynamic sampling needed it early
  torch::Tensor source_scores;  // [S, B] each source's scores, with `scores`
  nlohmann::json sampling;      // dynamic sampling's counts (null when off)
  int64_t weight_version = 0;
  double compute_s = 0;       // rollout workers' generate time on the critical path
  int64_t preempted = 0;      // sequences the rollout evicted and recomputed (paged KV)
  int64_t kv_peak_bytes = 0;  // most KV cache bytes in use on one rollout worker
  // Multi-turn rollouts (an environment; undefined / empty without one), per trajectory.
  torch::Tensor env_rewards;                  // [B] FP32 summed, added to the scores
  torch::Tensor turns;                        // [B] int64 model turns
  torch::Tensor tool_calls, tool_errors;      // [B] int64
  torch::Tensor env_timed_out;                // [B] int64: 1 where env.timeout_s ended it
  torch::Tensor env_seconds;                  // [B] FP32 its turns' waits for the environment
  std::vector<nlohmann::json> conversations;  // [B] [{"role", "content"}] after the prompt
  double env_stall_s = 0;  // summed over engines: time no row decoded (all waited)
};

// Rollout plus what the scorers returned: OpenRLHF's Experience, grouped by meaning.
struct Experience {
  // Per sequence.
  torch::Tensor scores;           // [B] weighted sum of the reward sources' scores
  torch::Tensor source_scores;    // [S, B] each source's own scores (NaN: not applicable)
  torch::Tensor response_length;  // [B] action tokens
  // Per token.
  torch::Tensor log_probs_old;        // [B, A] actor log pi_old(a|s)
  torch::Tensor log_probs_behaviour;  // [B, A] the rollout's, 0 outside the action mask
  torch::Tensor log_probs_ref;        // [B, A] reference log-probs (undefined without a ref)
  torch::Tensor values;               // [B, A] critic values (undefined without a critic)
  torch::Tensor kl;    // [B, A] policy-vs-reference KL estimate (zeros without a ref)
  double kl_mean = 0;  // sequence_mean_kl(kl): logged and fed to the KL controller
  // |rollout log-probs - actor log-probs| over action tokens: the synced weights and the two
  // engines agree (with async_steps 1 it includes the update the rollout lags by).
  double logprob_diff_mean = 0, logprob_diff_max = 0;
  RolloutMismatch mismatch;        // k3 KL and algo.rollout_correction's weights over action tokens
  torch::Tensor overlong_penalty;  // [B] DAPO soft length penalty added to the scores (<= 0)
  torch::Tensor entropy;           // [B, A] policy entropy at each action position
  BatchAdvantages adv;             // rewards, advantages, returns [B, A]
  double compute_s = 0;            // slowest scoring group's worker time
};

// The sequences and attention mask, as a scatter's tensors.
std::vector<NamedTensor> sequence_tensors(const Rollout& r);
// Rows `index` [k] of a rollout (their texts too).
Rollout select_rows(const Rollout& r, const torch::Tensor& index);
// `a` then `b`, re-padded to the longer prompt (left) and response (right) of the two.
Rollout concat_rollouts(const Rollout& a, const Rollout& b, int64_t pad_id);

// The weight sync's collective backend and the path its buckets take (rollout::SyncPath).
struct SyncRoute {
  std::string backend = "gloo";
  std::string path = "gloo";
};
// How the weight sync travels, from the actor's and rollout's "info" replies (syncing.cpp).
SyncRoute sync_route(const std::vector<Answered<ops::InfoReply>>& actor,
                     const std::vector<Answered<ops::InfoReply>>& rollout,
                     int tensor_parallel_size);

// One step's samples, experience and figures, for its metrics record and console line.
struct StepOutcome {
  Rollout r;
  Experience e;
  nlohmann::json losses;    // train()'s averages, updates and compute_s
  int64_t consumed = 0;     // prompts consumed by this step (not the next step's)
  double sync_compute = 0;  // worker compute of the sync and sleep-mode calls
  double t_gen = 0;         // this step's samples (0-ish when generated ahead)
  double t_ahead = 0;       // the next step's generation, beside this step's work
  double t_score = 0, t_train = 0;
  double t_wait = 0;  // waiting for the next step's samples
  double t_sync = 0, t_step = 0;
};

// What the job reads of the spec beyond PpoConfig, once, when it is built: the roles'
// configs and the settings of the calls it makes to them. The job keeps no JobSpec.
struct JobSettings {
  // Each loaded model role's Init config (actor, critic, ref, reward, as the spec uses them);
  // init_roles sets a trained role's micro batches per step from its group's size.
  std::map<Role, engine::ModelRoleConfig> roles;
  std::map<Role, Dispatch> dispatch;  // how a scatter spreads over each model role's ranks
  // The rollout group's load request: model, dtype, the engine of the rollout section, and
  // with an environment its config, tokenizer and chat template (stop tokens, the KV budget
  // and the TP store are added in init_roles).
  ops::LoadModel rollout;
  double kv_cache_gb = 0;      // per rollout worker (auto: what the plan leaves; 0 on CPUs)
  bool kv_cache_auto = false;  // rollout.kv_cache_memory_gb is "auto"
  double gpu_memory_utilization = 0;
  engine::PhaseSettings phases;        // what the colocation policy decides from
  std::string actor_model;             // its tokenizer files go beside the exported actor
  nlohmann::json trajectory_settings;  // recorded with each checkpoint (driver_state.h)
  bool tensorboard = false;            // logger.tensorboard
  int64_t logged_samples = 0;          // logger.samples_per_step
  int64_t sync_bucket_bytes = 0;       // rollout.sync_bucket_mb
  std::string lora_sync;               // rollout.lora_sync

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
  void init_roles(Scheduler& s, std::ostream& out);
  // The rollout group's load_model arguments; adds the engines to `workers` under TP.
  ops::LoadModel rollout_load_request(Scheduler& s, double kv_cache_gb, std::string& workers);
  // Sleep mode from the rollout's "info" replies (see sleep_rollout_).
  void choose_sleep_mode(const std::vector<Answered<ops::InfoReply>>& rollout, std::ostream& out);

  // Making experience (experience.cpp).
  Rollout generate(Scheduler& s, const PromptBatch& batch, int64_t step, int64_t refill = 0);
  // One generate request for `batch` over the rollout group: `n` samples per prompt at
  // `temperature` (0: greedy), drawn from `seed`; the reply as a Rollout with its texts.
  Rollout generate_with(Scheduler& s, const PromptBatch& batch, double temperature, int64_t n,
                        uint64_t seed);
  Rollout sample(Scheduler& s, int64_t step);  // generate, with dynamic sampling when on
  // Scores r with every reward source (the reward model's scores passed in where there is
  // one): sets r.scores [B] and r.source_scores [S, B] unless already set.
  void score_rewards(Rollout& r, const torch::Tensor& model_scores = {}) const;
  Experience score(Scheduler& s, Rollout& r);  // fills r's reward scores
  // From the actor's current log-probs [B, A]: the ratio's denominator, the rollout
  // mismatch and the log-prob difference.
  void set_old_log_probs(Experience& e, const Rollout& r, const torch::Tensor& current) const;
  // KL, overlong penalty and advantages, once scores, references and values are in.
  void shape_rewards(Experience& e, const Rollout& r, const torch::Tensor& current);
  // The model's last turn (the whole response when single-turn), EOS and specials dropped:
  // what the reward sources score.
  std::string response_text(const Rollout& r, int64_t row) const;
  // The environment's figures of a generate reply into r (multi-turn rollouts).
  void read_trajectories(Rollout& r, const Message& reply) const;

  // Training (training.cpp): train.max_epochs passes in global batches of
  // train.batch_size; returns the averaged figures, "updates" and "compute_s".
  nlohmann::json train(Scheduler& s, const Rollout& r, const Experience& e, int64_t step);
  // One global batch (rows `idx`) to the actor and the critic at once; adds their figures
  // to `sums` and returns the update's worker compute on the critical path.
  double train_update(Scheduler& s, const Rollout& r, const Experience& e, const torch::Tensor& idx,
                      const ops::TrainActor& actor_request, const ops::TrainCritic& critic_request,
                      nlohmann::json& sums);
  ops::TrainActor actor_train_request(const Rollout& r) const;
  ops::TrainCritic critic_train_request(const Rollout& r) const;

  // Syncing (syncing.cpp).
  double sync_weights(Scheduler& s);  // returns worker compute on the critical path
  // Colocation sleep mode (rollout.offload_while_training,
  // actor.offload_optimizer_while_generating): each call moves what its key asks for and adds
  // the figures to offload_; returns the worker compute on the critical path.
  double before_training(Scheduler& s);    // rollout to sleep, actor optimizer back
  double before_generating(Scheduler& s);  // actor optimizer to host, rollout awake

  // The step loop (step_loop.cpp): steps after `step` up to total_steps_.
  void run_steps(Scheduler& s, int64_t step, MetricsSink& metrics, std::ostream& out);
  // One step: its samples (`ready` when generated ahead; with async_steps it starts the
  // next step's into `ready`), scoring, training, sync.
  StepOutcome run_step(Scheduler& s, int64_t step, std::optional<Rollout>& ready);
  nlohmann::json step_record(Scheduler& s, int64_t step, const StepOutcome& o, double kl_coef);
  void write_samples(int64_t step, const StepOutcome& o, MetricsSink& metrics) const;

  // Held-out evaluation (evaluation.cpp, data.eval_dataset): greedy responses (and
  // eval.n_samples sampled ones) to every held-out prompt, scored by the job's reward
  // sources; writes an eval record ({"split": "eval", "accuracy", "reward", ...}) and a
  // console line.
  void evaluate(Scheduler& s, int64_t step, MetricsSink& metrics, std::ostream& out);
  // Whether metrics.jsonl already holds the eval record of `step` (a resumed run keeps the
  // records up to its checkpoint, so the evaluation at the resumed step may have run).
  bool evaluated_at(int64_t step) const;
  // The held-out batch generated at `temperature`, n per prompt, and scored.
  Rollout eval_rollout(Scheduler& s, const PromptBatch& batch, double temperature, int64_t n);

  // Checkpoints (checkpoint.cpp). prompts_consumed: where a resume continues the prompt
  // stream (the prompts of steps 1..step; with async_steps, not those already drawn for
  // the next step).
  void save(Scheduler& s, int64_t step, int64_t prompts_consumed, std::ostream& out);
  int64_t resume(Scheduler& s);
  void export_actor(Scheduler& s, std::ostream& out);

  PpoDriverOptions options_;
  PpoConfig c_;
  JobSettings settings_;
  std::string run_dir_;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  int64_t eos_id_ = -1, pad_id_ = 0;
  std::unique_ptr<PromptStream> stream_;
  std::vector<TokenizedPrompt> eval_prompts_;  // held-out prompts (empty: no evaluation)
  int64_t eval_steps_ = 0, eval_samples_ = 0;
  std::string eval_accuracy_source_;
  int64_t truncated_prompts_ = 0;
  int64_t total_steps_ = 0;
  KlController kl_;
  std::unique_ptr<rewards::RewardSources> rewards_;
  bool has_ref_ = false, has_critic_ = false, has_reward_model_ = false;
  bool ref_from_actor_ = false;     // a LoRA actor with adapters off is the reference (issue 30.2)
  nlohmann::json planned_;          // plan.json's per-role figures (null without a plan)
  SyncRoute sync_route_;            // actor -> rollout weight sync (see sync_route)
  nlohmann::json last_sync_;        // the last sync's figures (actor rank 0's reply)
  bool sleep_rollout_ = false;      // rollout.offload_while_training, where it applies
  bool offload_optimizer_ = false;  // actor.offload_optimizer_while_generating, where it applies
  nlohmann::json offload_;          // this step's offload figures (see before_training)
};

}  // namespace rlhf::ppo::job
