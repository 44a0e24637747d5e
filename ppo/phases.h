// The phases of a PPO-family step, each an object built from its own slice of the job's
// settings and handed only what it works with: the role groups it calls, the reward sources,
// the tokenizer, the prompt stream, the KL controller. PpoJob (ppo_job.h) builds them once the
// workers are up and runs them in its step loop.
//   ExperienceMaker (experience.cpp)  generate (with dynamic sampling), score, advantages
//   PolicyTrainer   (training.cpp)    the actor's and critic's train steps over the experience
//   WeightSync      (syncing.cpp)     actor -> rollout weights, the colocation sleep mode
//   Evaluator       (evaluation.cpp)  held-out evaluation
// Private to rlhf_ppo_driver; nothing here includes actors/ or holds a JobSpec.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "engine/phase_policy.h"
#include "ppo/advantages.h"
#include "ppo/kl.h"
#include "ppo/losses.h"
#include "ppo/ppo_config.h"
#include "ppo/prompt_batches.h"
#include "ppo/rollout_data.h"
#include "ppo/stream_scorer.h"
#include "ppo/worker_ops.h"
#include "rollout/worker_ops.h"
#include "scheduler/role_group.h"
#include "transport/worker_ops.h"

namespace rlhf {
class PhaseProgress;
class Scheduler;
namespace report {
class MetricsSink;
}  // namespace report
namespace tokenizer {
class Tokenizer;
}  // namespace tokenizer
namespace rewards {
class RewardSources;
}  // namespace rewards
}  // namespace rlhf

namespace rlhf::ppo::job {

// Which model roles the job has (the rollout and actor always).
struct JobRoles {
  bool ref = false;             // reference log-probs (ref workers, or the actor's adapters off)
  bool ref_from_actor = false;  // a LoRA actor with adapters off is the reference (issue 30.2)
  bool critic = false;
  bool reward_model = false;
  bool teacher = false;  // on-policy distillation: teacher log-probs of the sampled tokens
};

// The role groups a phase calls; null where the job has no such role.
struct RoleGroups {
  RoleGroup* rollout = nullptr;
  RoleGroup* actor = nullptr;
  RoleGroup* ref = nullptr;
  RoleGroup* critic = nullptr;
  RoleGroup* reward = nullptr;
  RoleGroup* teacher = nullptr;

  static RoleGroups of(Scheduler& s);  // the groups s has workers for
};

// Making experience: what generating, scoring and shaping read.
struct ExperienceSettings {
  // Generation (rollout.*, train.seed).
  double temperature = 1.0, top_p = 1.0;
  int64_t top_k = -1;
  int64_t n_samples_per_prompt = 1;
  int64_t batch_size = 1;        // prompts per step
  int64_t micro_batch_size = 1;  // prompts per generate call on one engine
  uint64_t seed = 42;
  bool multi_turn = false;  // an environment: each prompt's row goes with it
  bool dynamic_sampling = false;
  int64_t max_refill_batches = 0;
  // Scoring.
  int64_t max_tokens_per_micro_batch = 0;
  JobRoles roles;
  std::map<Role, Dispatch> dispatch;
  // Off-policy samples (algo.max_staleness, rollout.partial_rollout).
  int64_t max_staleness = 0;
  bool in_flight_updates = false;  // training samples' generate calls take weight syncs
  bool streaming = false;          // rollout.streaming: scoring starts on finished groups
  // Mixtures of experts: the rollout records routes (algo.routing_stats), the actor's
  // log-probs replay them (algo.routing_replay).
  bool record_routes = false;
  bool routing_replay = false;
  // Shaping (algo.*).
  RolloutCorrectionConfig correction;
  int64_t max_new_tokens = 0;
  int64_t overlong_buffer_len = 0;
  double overlong_penalty_factor = 1.0;
  bool kl_use_loss = false;
  KlEstimator kl_estimator = KlEstimator::kK1;
  AdvantageConfig advantage;
  double distill_coef = 0;  // algo.distill.coef (ppo/kl.h distill_advantage)
  int64_t gkd_top_k = 0;    // GKD: the teacher's top-k tokens per position (0: not asked)
  double gkd_lambda = 1.0;  // GKD: the share of on-policy steps (the rest: dataset responses)
  int64_t eos_id = -1, pad_id = 0;

  static ExperienceSettings from(const ppo::PpoConfig& c, const JobRoles& roles,
                                 std::map<Role, Dispatch> dispatch, int64_t eos_id, int64_t pad_id);
};

class ExperienceMaker {
 public:
  ExperienceMaker(ExperienceSettings settings, RoleGroups groups,
                  const tokenizer::Tokenizer& tokenizer, rewards::RewardSources& rewards,
                  PromptStream& stream, const KlController& kl);

  // The step's samples: the stream's next batch generated, with dynamic sampling when on
  // (the prompts consumed and the time it took set). Called by one thread at a time.
  Rollout sample(int64_t step);
  // One generate request for `batch` over the rollout group: `n` samples per prompt at
  // `temperature` (0: greedy), drawn from `seed`; the reply as a Rollout with its texts.
  // `training`: the step's samples, not an evaluation's: weight syncs may land between its
  // decode steps (in_flight_updates) and the rollout records routes (record_routes) as set.
  // `on_group` (rollout.streaming): the rollout streams each finished prompt group back and
  // its part of the reply goes to `on_group` at once, with its prompts' positions in `batch`.
  using GroupSink = std::function<void(const torch::Tensor& prompts, const Message& part)>;
  Rollout generate_with(const PromptBatch& batch, double temperature, int64_t n, uint64_t seed,
                        bool training = false, const GroupSink& on_group = {});
  // Scores r with every reward source (the reward model's scores passed in where there is
  // one): sets r.scores [B] and r.source_scores [S, B] unless already set.
  void score_rewards(Rollout& r, const torch::Tensor& model_scores = {}) const;
  // The samples to the actor, reference, critic and reward model at once; rewards, KL and
  // advantages. Fills r's reward scores.
  Experience score(Rollout& r);
  // On-policy distillation: the reverse KL to the teacher on r's responses, as
  // distill/reverse_kl (sequence_mean_kl of ppo/kl.h distill_reverse_kl): what an evaluation
  // reports. Needs a teacher.
  double teacher_reverse_kl(const Rollout& r) const;

 private:
  uint64_t sample_seed(int64_t step, int64_t refill) const;
  Rollout generate(const PromptBatch& batch, int64_t step, int64_t refill = 0);
  Rollout sample_groups(int64_t step);  // sample() without its accounting
  // GKD's lambda (algo.distill.gkd.lambda): whether `step` trains on the actor's own samples,
  // drawn from (train.seed, step) with that probability, so a resumed run draws the same.
  bool on_policy_step(int64_t step) const;
  // GKD's dataset step: `batch`'s dataset responses as a rollout, each repeated
  // n_samples_per_prompt times (PromptBatch::response_ids; Rollout::from_dataset).
  Rollout dataset_rollout(const PromptBatch& batch) const;
  // DAPO's filter over the batches `draw(refill)` gives (sampling.cpp).
  Rollout filter_groups(const std::function<Rollout(int64_t refill)>& draw);
  // Dynamic sampling with rollout.streaming: each arriving group is scored by the reward
  // sources and, if its scores differ, goes to the early scorers at once.
  Rollout sample_streamed_groups(int64_t step);
  // The scoring calls that may run while the rollout generates (rollout.streaming).
  std::map<Role, StreamScorer::Call> early_calls() const;
  // r's prompts, labels, rows and response texts: row i's prompt is batch's prompt_of_row[i].
  void add_texts(Rollout& r, const PromptBatch& batch,
                 const std::vector<int64_t>& prompt_of_row) const;
  // Each scoring group's call on rows' sequences (the actor's log-probs with entropy, and
  // the reference's with adapters off; the reference's; the critic's values; the reward
  // model's scores), by role.
  std::map<Role, StreamScorer::Call> scoring_calls(int64_t action_len) const;
  // The log-probs request of a frozen scorer (the reference, the teacher; the actor's in an
  // evaluation's reverse KL): at the sampling temperature, without entropy or routes.
  ops::LogProbs frozen_log_probs(int64_t action_len) const;
  // From the actor's current log-probs [B, A]: the ratio's denominator, the rollout
  // mismatch and the log-prob difference.
  void set_old_log_probs(Experience& e, const Rollout& r, const torch::Tensor& current) const;
  // KL, overlong penalty and advantages, once scores, references and values are in.
  void shape_rewards(Experience& e, const Rollout& r, const torch::Tensor& current) const;
  // The model's last turn (the whole response when single-turn), EOS and specials dropped:
  // what the reward sources score.
  std::string response_text(const Rollout& r, int64_t row) const;
  // The environment's figures of a generate reply into r (multi-turn rollouts).
  void read_trajectories(Rollout& r, const Message& reply) const;

  ExperienceSettings s_;
  RoleGroups groups_;
  const tokenizer::Tokenizer& tokenizer_;
  rewards::RewardSources& rewards_;
  PromptStream& stream_;
  const KlController& kl_;
};

// Training on a step's experience: what the train requests and the batching read.
struct TrainingSettings {
  int64_t batch_size = 1;  // train.batch_size: samples per optimizer step
  int64_t max_epochs = 1;
  uint64_t seed = 42;
  ops::TrainBatching batching;  // its action length set per step
  PolicyLossConfig policy;
  bool kl_use_loss = false;
  KlEstimator kl_estimator = KlEstimator::kK1;
  double temperature = 1.0;
  double value_clip = 0.5;
  bool routing_replay = false;          // the train requests carry the rollout's routes
  double aux_loss_coef = 0;             // actor.aux_loss_coef
  double gkd_coef = 0, gkd_beta = 0.5;  // algo.distill.gkd.coef and .beta (0: no GKD term)
  JobRoles roles;

  static TrainingSettings from(const ppo::PpoConfig& c, const JobRoles& roles);
};

class PolicyTrainer {
 public:
  // `critic` is null without a critic.
  PolicyTrainer(TrainingSettings settings, RoleGroup& actor, RoleGroup* critic,
                const KlController& kl, PhaseProgress& progress);
  // train.max_epochs passes over the experience in global batches of train.batch_size;
  // returns the averaged figures, "updates" and "compute_s". `at`: "step 3/10" for progress.
  nlohmann::json train(const Rollout& r, const Experience& e, int64_t step, const std::string& at);

 private:
  // One global batch (rows `idx`) to the actor and the critic at once; adds their figures
  // to `sums` and returns the update's worker compute on the critical path.
  double update(const Rollout& r, const Experience& e, const torch::Tensor& idx,
                const ops::TrainActor& actor_call, const ops::TrainCritic& critic_call,
                nlohmann::json& sums);
  ops::TrainActor actor_request(const Rollout& r) const;
  ops::TrainCritic critic_request(const Rollout& r) const;

  TrainingSettings s_;
  RoleGroup& actor_;
  RoleGroup* critic_;
  const KlController& kl_;
  PhaseProgress& progress_;
};

// The weight sync's collective backend and the path its buckets take (rollout::SyncPath).
struct SyncRoute {
  std::string backend = "gloo";
  std::string path = "gloo";
};
// How the weight sync travels, from the actor's and rollout's "info" replies.
SyncRoute sync_route(const std::vector<Answered<ops::InfoReply>>& actor,
                     const std::vector<Answered<ops::InfoReply>>& rollout,
                     int tensor_parallel_size);

struct SyncSettings {
  int64_t bucket_bytes = 0;  // rollout.sync_bucket_mb
  std::string lora_sync;     // rollout.lora_sync
  int tensor_parallel_size = 1;
  engine::PhaseSettings phases;  // what the colocation policy decides from
};

class WeightSync {
 public:
  // `rendezvous`: where the sync's collective group named so meets (Scheduler::rendezvous).
  WeightSync(SyncSettings settings, RoleGroup& actor, RoleGroup& rollout,
             std::function<std::string(const std::string&)> rendezvous);
  // The route and the sleep mode, from both groups' "info" (the same phase policy the
  // memory planner planned with, engine/phase_policy.h); says so when colocated.
  void choose(std::ostream& out);
  double sync();  // returns worker compute on the critical path
  // Colocation sleep mode (rollout.offload_while_training,
  // actor.offload_optimizer_while_generating): each call moves what its key asks for and adds
  // the figures to offload(); returns the worker compute on the critical path.
  double before_training();    // rollout to sleep, actor optimizer back
  double before_generating();  // actor optimizer to host, rollout awake
  // After a checkpoint brought the optimizer state back to the device.
  void offload_optimizer_again();
  // A relaunched rollout rank (its engine loaded again) gets the weights the others hold, in a
  // group of the actor's rank 0 and itself; the next sync forms the whole group anew. Only
  // where revivable() (fault.max_restarts).
  void resend(int rank);
  // Whether a relaunched rollout engine can be brought back without the rest: one rank per
  // engine, no sleep mode, and an actor whose weight push runs no collectives among its ranks
  // (`actor_pushes_alone`: not ZeRO-3 or expert-parallel), so it cannot interleave with the
  // actor's other calls.
  bool revivable(bool actor_pushes_alone) const;

  const nlohmann::json& last_sync() const { return last_sync_; }  // actor rank 0's reply
  // The weight version the rollout holds after the last sync (0: the weights it loaded);
  // the actor trains that version until its next update.
  int64_t version() const { return version_; }
  const nlohmann::json& offload() const { return offload_; }  // this step's figures

 private:
  SyncSettings s_;
  RoleGroup& actor_;
  RoleGroup& rollout_;
  std::function<std::string(const std::string&)> rendezvous_;
  std::mutex mutex_;      // the group names below
  int64_t regroups_ = 0;  // resend()s so far: each sync group after one meets at a new name
  SyncRoute route_;
  bool sleep_rollout_ = false;      // rollout.offload_while_training, where it applies
  bool offload_optimizer_ = false;  // actor.offload_optimizer_while_generating, where it applies
  nlohmann::json last_sync_;
  int64_t version_ = 0;
  nlohmann::json offload_;
};

// Held-out evaluation (data.eval_dataset, eval.*).
struct EvalSettings {
  int64_t steps = 0;      // eval.steps (0: before training and at the end only)
  int64_t n_samples = 0;  // eval.n_samples: sampled responses per prompt beside the greedy one
  std::string accuracy_source;  // eval.accuracy_source ("": the first reward source)
  double temperature = 1.0;
  uint64_t seed = 42;
  int64_t logged_samples = 0;              // logger.samples_per_step
  int64_t max_tokens_per_micro_batch = 0;  // the reward model's forward budget
  int64_t micro_batch_size = 1;            // rollout.micro_batch_size (prompts)
  Dispatch reward_dispatch = Dispatch::kLeastLoaded;
  int64_t pad_id = 0;
  std::string run_dir;   // where metrics.jsonl is
  bool teacher = false;  // distill/reverse_kl of the greedy replies (on-policy distillation)
};

class Evaluator {
 public:
  // `reward` is null without a reward model.
  Evaluator(EvalSettings settings, std::vector<TokenizedPrompt> prompts, ExperienceMaker& maker,
            const std::vector<std::string>& source_names, RoleGroup* reward,
            PhaseProgress& progress);
  bool empty() const { return prompts_.empty(); }
  // Every eval.steps and at the last step.
  bool due(int64_t step, int64_t total_steps) const;
  // Whether metrics.jsonl already holds the eval record of `step` (a resumed run keeps the
  // records up to its checkpoint, so the evaluation at the resumed step may have run).
  bool evaluated_at(int64_t step) const;
  // Greedy responses (and eval.n_samples sampled ones) to every held-out prompt, scored by
  // the job's reward sources; writes an eval record ({"split": "eval", "accuracy", "reward",
  // ...}) and a console line.
  void evaluate(int64_t step, report::MetricsSink& metrics, std::ostream& out);

 private:
  // The held-out batch generated at `temperature`, n per prompt, and scored.
  Rollout rollout(const PromptBatch& batch, double temperature, int64_t n);

  EvalSettings s_;
  std::vector<TokenizedPrompt> prompts_;
  ExperienceMaker& maker_;
  std::vector<std::string> names_;
  RoleGroup* reward_;
  PhaseProgress& progress_;
};

}  // namespace rlhf::ppo::job
