#include "ppo/driver.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <future>
#include <iomanip>
#include <mutex>
#include <optional>
#include <sstream>

#include "core/errors.h"
#include "core/metrics.h"
#include "core/run_dir.h"
#include "core/text.h"
#include "engine/driver_state.h"
#include "engine/memory_check.h"
#include "engine/memory_plan.h"
#include "engine/role_config.h"
#include "ppo/advantages.h"
#include "ppo/ppo_config.h"
#include "ppo/prompt_batches.h"
#include "ppo/rollout_correction.h"
#include "rewards/reward_sources.h"
#include "scheduler/peak_memory.h"
#include "scheduler/role_group.h"
#include "scheduler/scheduler.h"
#include "tokenizer/prompt_format.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_config.h"

namespace rlhf::ppo {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

// A number from a reply's args; JSON has no NaN, so a NaN arrives as null and reads as NaN.
double number(const json& args, const char* key) {
  auto it = args.find(key);
  if (it == args.end())
    throw RuntimeError(std::string("reply without \"") + key + "\": " + args.dump());
  return it->is_number() ? it->get<double>() : std::nan("");
}

// Worker compute of one role-group call on its critical path: a scatter's micro batches
// spread over the group's ranks (sum / ranks); call_all's ranks run together (max).
double scatter_compute(const Message& reply, int ranks) {
  double sum = 0;
  for (const auto& mb : reply.args.value("micro_batches", json::array()))
    sum += mb.value("compute_s", 0.0);
  return sum / std::max(1, ranks);
}
double call_all_compute(const std::vector<Message>& replies) {
  double most = 0;
  for (const auto& r : replies) most = std::max(most, r.args.value("compute_s", 0.0));
  return most;
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// "1.2": seconds for console lines (without touching the stream's number format).
std::string seconds_text(double seconds) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(1) << seconds;
  return o.str();
}

// {name: mean score} of each reward source ([S, B]; NaN scores, "not applicable", left out).
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

// The metrics record's rollout_mismatch: the KL always, the weights when a correction applies.
json mismatch_json(RolloutCorrection mode, const RolloutMismatch& m) {
  json out = {{"kl", m.kl}};
  if (mode == RolloutCorrection::kNone) return out;
  out.update(
      {{"weight_mean", m.weight_mean}, {"weight_max", m.weight_max}, {"truncated", m.truncated}});
  return out;
}

// One step's samples, prompt-major (the n samples of a prompt are consecutive).
struct Rollout {
  torch::Tensor sequences;            // [B, T] prompt (left-padded) + response (right-padded)
  torch::Tensor attention_mask;       // [B, T]
  torch::Tensor action_mask;          // [B, A] response tokens up to and including EOS
  torch::Tensor behaviour_log_probs;  // [B, A] FP32 log-probs the rollout sampled from
  std::vector<std::string> prompts, responses, labels;  // [B]
  std::vector<json> columns;    // [B] the rows' other columns for Python rewards (else empty)
  torch::Tensor scores;         // [B] reward-source total when dynamic sampling needed it early
  torch::Tensor source_scores;  // [S, B] each source's scores, with `scores`
  json sampling;                // dynamic sampling's counts (null when off)
  int64_t weight_version = 0;
  double compute_s = 0;       // rollout workers' generate time on the critical path
  int64_t preempted = 0;      // sequences the rollout evicted and recomputed (paged KV)
  int64_t kv_peak_bytes = 0;  // most KV cache bytes in use on one rollout worker
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

std::vector<NamedTensor> sequence_tensors(const Rollout& r) {
  return {{"sequences", r.sequences}, {"attention_mask", r.attention_mask}};
}

// Runs f on its own thread (role groups are independent, so their calls overlap).
template <typename F>
auto in_parallel(F&& f) {
  return std::async(std::launch::async, std::forward<F>(f));
}

// The weight sync's collective backend and the path its buckets take (rollout::SyncPath).
struct SyncRoute {
  std::string backend = "gloo";
  std::string path = "gloo";
};

class PpoJob {
 public:
  PpoJob(const JobSpec& spec, PpoDriverOptions options);
  void run(Scheduler& scheduler, std::ostream& out);

 private:
  std::vector<TokenizedPrompt> tokenize_prompts(const JobSpec& spec, const PromptDataConfig& data);
  // Held-out evaluation (data.eval_dataset): greedy responses (and eval.n_samples sampled
  // ones) to every held-out prompt, scored by the job's reward sources; writes an
  // eval record ({"split": "eval", "accuracy", "reward", ...}) and a console line.
  void evaluate(Scheduler& s, int64_t step, MetricsSink& metrics, std::ostream& out);
  void init_roles(Scheduler& s, std::ostream& out);
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
  json train(Scheduler& s, const Rollout& r, const Experience& e, int64_t step);
  double sync_weights(Scheduler& s);  // returns worker compute on the critical path
  // Colocation sleep mode (rollout.offload_while_training,
  // actor.offload_optimizer_while_generating): each call moves what its key asks for and adds
  // the figures to offload_; returns the worker compute on the critical path.
  double before_training(Scheduler& s);    // rollout to sleep, actor optimizer back
  double before_generating(Scheduler& s);  // actor optimizer to host, rollout awake
  // prompts_consumed: where a resume continues the prompt stream (the prompts of steps
  // 1..step; with async_steps, not those already drawn for the next step).
  void save(Scheduler& s, int64_t step, int64_t prompts_consumed, std::ostream& out);
  int64_t resume(Scheduler& s);
  std::string response_text(const Rollout& r, int64_t row) const;

  JobSpec spec_;
  PpoDriverOptions options_;
  PpoConfig c_;
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
  bool ref_from_actor_ = false;  // a LoRA actor with adapters off is the reference (issue 30.2)
  json planned_;  // plan.json's per-role figures (null without a plan), beside measured peaks
  SyncRoute sync_route_;            // actor -> rollout weight sync (see sync_route)
  json last_sync_;                  // the last sync's figures (actor rank 0's reply)
  bool sleep_rollout_ = false;      // rollout.offload_while_training, where it applies
  bool offload_optimizer_ = false;  // actor.offload_optimizer_while_generating, where it applies
  json offload_;                    // this step's offload figures (see before_training)
};

// How the weight sync travels: CUDA IPC (over a Gloo group that carries only the handle and
// the signals) when every rollout rank is on actor rank 0's GPU and the rollout is not
// tensor-parallel (IPC hands over whole tensors; a TP rank takes only its slices); NCCL when
// actor rank 0 and every rollout rank have a GPU and none shares the actor's (NCCL refuses
// two ranks of one communicator on one device); else Gloo, which stages CUDA tensors through
// the host.
SyncRoute sync_route(const std::vector<Message>& actor, const std::vector<Message>& rollout,
                     int tensor_parallel_size) {
  auto where = [](const Message& m) {
    return std::make_pair(m.args.value("node", std::string()),
                          m.args.value("device", std::string()));
  };
  auto on_cuda = [](const std::pair<std::string, std::string>& w) {
    return w.second.rfind("cuda", 0) == 0;
  };
  const auto root = where(actor.at(0));
  if (!on_cuda(root)) return {"gloo", "gloo"};
  bool all_shared = true, all_own = true;
  for (const auto& r : rollout) {
    all_shared = all_shared && where(r) == root;
    all_own = all_own && on_cuda(where(r)) && where(r) != root;
  }
  if (all_shared && tensor_parallel_size == 1) return {"gloo", "cuda_ipc"};
  if (all_own) return {"nccl", "nccl"};
  return {"gloo", "gloo"};
}

PpoJob::PpoJob(const JobSpec& spec, PpoDriverOptions options)
    : spec_(spec),
      options_(options),
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
}

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
    if (rewards_->reads_rows()) p.columns = row.columns;
    out.push_back(std::move(p));
  }
  return out;
}

void PpoJob::init_roles(Scheduler& s, std::ostream& out) {
  const int64_t per_step = c_.optimizer_steps_per_step();
  const auto t0 = Clock::now();
  std::mutex out_mutex;  // roles finish on their own threads
  // rollout.kv_cache_memory_gb auto: on GPUs the pool the plan leaves in the generate phase.
  const double kv_cache_gb = engine::kv_cache_gb_for_run(spec_);
  if (spec_.at("rollout.kv_cache_memory_gb").is_string() && kv_cache_gb > 0)
    out << "ppo: rollout KV cache (auto): " << std::fixed << std::setprecision(2) << kv_cache_gb
        << " GiB per rollout worker (rollout.gpu_memory_utilization "
        << spec_.get_float("rollout.gpu_memory_utilization") << ")" << std::defaultfloat
        << std::endl;
  std::vector<std::future<void>> calls;
  for (Role role : s.roles()) {
    RoleGroup& g = s.group(role);
    json args;
    std::string op = "init";
    std::string workers = std::to_string(g.size()) + " worker" + (g.size() == 1 ? "" : "s");
    if (role == Role::kRollout) {
      std::vector<int64_t> stop = c_.stop_token_ids;
      stop.push_back(eos_id_);
      // Engines of tensor_parallel_size consecutive workers: every micro batch goes to all
      // ranks of one engine (see generate).
      g.set_ranks_per_replica(c_.tensor_parallel_size);
      if (c_.tensor_parallel_size > 1)
        workers += ": " + std::to_string(g.replicas()) + " engine" +
                   (g.replicas() == 1 ? "" : "s") + " of tensor parallel size " +
                   std::to_string(c_.tensor_parallel_size);
      op = "load_model";
      args = {{"model", spec_.get_string("rollout.model")},
              {"dtype", spec_.get_string("rollout.dtype")},
              {"max_new_tokens", c_.max_new_tokens},
              {"n_samples_per_prompt", c_.n_samples_per_prompt},
              {"micro_batch_size", c_.rollout_micro_batch_size},
              {"kv_cache_memory_gb", kv_cache_gb},
              {"kv_block_size", spec_.get_int("rollout.kv_block_size")},
              {"max_num_seqs", spec_.get_int("rollout.max_num_seqs")},
              {"enforce_eager", spec_.get_bool("rollout.enforce_eager")},
              {"stop_token_ids", stop},
              {"pad_token_id", pad_id_}};
      if (c_.tensor_parallel_size > 1) {
        args["tensor_parallel_size"] = c_.tensor_parallel_size;
        args["tp_store_path"] = s.rendezvous("rollout_tp");
      }
    } else {
      int64_t accum = c_.train_batch_size / (c_.train_micro_batch_size * g.size());
      auto config = engine::ModelRoleConfig::from_spec(spec_, role, total_steps_ * per_step, accum);
      args = {{"config", config.to_json()}, {"store_path", s.rendezvous(role_name(role))}};
    }
    out << "ppo: loading " << role_name(role) << " (" << workers << ")" << std::endl;
    calls.push_back(in_parallel([&g, &out, &out_mutex, t0, op, args] {
      g.call_all(op, args);
      std::lock_guard<std::mutex> lock(out_mutex);
      out << "ppo: " << role_name(g.role()) << " ready after " << seconds_text(seconds_since(t0))
          << " s" << std::endl;
    }));
  }
  for (auto& c : calls) c.get();
  const auto actor = s.group(Role::kActor).call_all("info");
  const auto rollout = s.group(Role::kRollout).call_all("info");
  sync_route_ = sync_route(actor, rollout, c_.tensor_parallel_size);
  // Sleep mode only where the rollout shares the actor's GPU and the two take turns: on cpu
  // nodes host memory is the same memory, and with async_steps they run at once.
  const bool colocated_gpu =
      spec_.get_string("rollout.colocate_with") == "actor" &&
      rollout.at(0).args.value("device", std::string()).rfind("cuda", 0) == 0 &&
      c_.async_steps == 0;
  sleep_rollout_ = colocated_gpu && spec_.get_bool("rollout.offload_while_training");
  offload_optimizer_ = colocated_gpu &&
                       spec_.get_bool("actor.offload_optimizer_while_generating") &&
                       !spec_.get_bool("actor.adam_offload");
  if (sleep_rollout_ || offload_optimizer_)
    out << "ppo: colocated on the GPU:"
        << (sleep_rollout_ ? " the rollout's weights go to host memory while the actor trains" : "")
        << (sleep_rollout_ && offload_optimizer_ ? ";" : "")
        << (offload_optimizer_ ? " the actor's optimizer state goes to host memory while the "
                                 "rollout generates"
                               : "")
        << std::endl;
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
  json args = {{"temperature", temperature},
               {"top_p", c_.top_p},
               {"top_k", c_.top_k},
               {"seed", seed},
               {"n_samples_per_prompt", n}};
  torch::Tensor index = torch::arange(batch.prompt_ids.size(0), torch::kLong);
  Message reply = s.group(Role::kRollout)
                      .scatter("generate",
                               {{"prompt_ids", batch.prompt_ids},
                                {"prompt_mask", batch.prompt_mask},
                                {"prompt_index", index}},
                               c_.rollout_micro_batch_size, args);
  Rollout r;
  // Micro batches spread over the engines (an engine's TP ranks compute each one together).
  r.compute_s = scatter_compute(reply, s.group(Role::kRollout).replicas());
  r.sequences = reply.tensor("sequences").to(torch::kLong).contiguous();
  r.attention_mask = reply.tensor("attention_mask").to(torch::kLong).contiguous();
  r.action_mask = reply.tensor("action_mask").to(torch::kLong).contiguous();
  r.behaviour_log_probs = reply.tensor("log_probs").to(torch::kFloat32).contiguous();
  for (const auto& mb : reply.args.value("micro_batches", json::array())) {
    r.weight_version = std::max<int64_t>(r.weight_version, mb.value("weight_version", int64_t{0}));
    r.preempted += mb.value("preempted", int64_t{0});
    r.kv_peak_bytes = std::max<int64_t>(r.kv_peak_bytes, mb.value("kv_peak_bytes", int64_t{0}));
  }
  for (int64_t i = 0; i < r.sequences.size(0); ++i) {
    r.prompts.push_back(batch.texts[static_cast<size_t>(i / n)]);
    r.labels.push_back(batch.labels[static_cast<size_t>(i / n)]);
    if (rewards_->reads_rows()) r.columns.push_back(batch.columns[static_cast<size_t>(i / n)]);
    r.responses.push_back(response_text(r, i));
  }
  return r;
}

// Rows `index` [k] of a rollout (their texts too).
Rollout select_rows(const Rollout& r, const torch::Tensor& index) {
  Rollout out = r;
  out.sequences = r.sequences.index_select(0, index).contiguous();
  out.attention_mask = r.attention_mask.index_select(0, index).contiguous();
  out.action_mask = r.action_mask.index_select(0, index).contiguous();
  out.behaviour_log_probs = r.behaviour_log_probs.index_select(0, index).contiguous();
  if (r.scores.defined()) out.scores = r.scores.index_select(0, index).contiguous();
  if (r.source_scores.defined())
    out.source_scores = r.source_scores.index_select(1, index).contiguous();
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
  }
  return out;
}

// `a` then `b`, re-padded to the longer prompt (left) and response (right) of the two.
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
  std::vector<torch::Tensor> rows;
  for (const auto& s : got.sources)
    rows.push_back(torch::tensor(s.scores, torch::kFloat64).to(torch::kFloat32));
  r.source_scores = torch::stack(rows);
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
  std::vector<tokenizer::TokenId> ids;
  for (int64_t j = 0; j < a && mask[row][j] != 0; ++j) {
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
  const json args = {{"action_len", r.action_mask.size(1)},
                     {"max_tokens", c_.max_tokens_per_micro_batch},
                     {"max_rows", micro},
                     {"temperature", c_.temperature}};
  auto seq = sequence_tensors(r);
  // Each future yields the group's reply and its ranks (for the compute accounting).
  using Scored = std::pair<Message, int>;
  auto call = [&](Role role, const char* op, json a) {
    const Dispatch dispatch = dispatch_for(spec_, role);
    return in_parallel([&s, &seq, role, op, a, micro, dispatch]() -> Scored {
      RoleGroup& g = s.group(role);
      return {g.scatter(op, seq, micro, a, std::nullopt, dispatch), g.size()};
    });
  };
  json actor_args = args;
  actor_args["entropy"] = true;
  actor_args["reference"] = ref_from_actor_;
  auto old = call(Role::kActor, "log_probs", actor_args);
  std::future<Scored> ref, values, model_scores;
  if (has_ref_ && !ref_from_actor_) ref = call(Role::kRef, "log_probs", args);
  if (has_critic_) values = call(Role::kCritic, "values", args);
  if (has_reward_model_)
    model_scores = call(Role::kReward, "score",
                        {{"max_tokens", c_.max_tokens_per_micro_batch}, {"max_rows", micro}});
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
  e.entropy = actor_reply.tensor("entropy");
  {
    const auto mask = r.action_mask.to(torch::kFloat32);
    const auto diff =
        (r.behaviour_log_probs.narrow(1, 0, mask.size(1)) - current).abs() * mask;  // [B, A]
    e.logprob_diff_mean = (diff.sum() / mask.sum().clamp_min(1)).item<double>();
    e.logprob_diff_max = diff.max().item<double>();
  }
  if (has_ref_)
    e.log_probs_ref =
        ref_from_actor_ ? actor_reply.tensor("ref_log_probs") : take(ref).tensor("log_probs");
  if (has_critic_) e.values = take(values).tensor("values");
  if (has_reward_model_) score_rewards(r, take(model_scores).tensor("scores"));
  e.scores = r.scores;
  e.source_scores = r.source_scores;
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
  return e;
}

json PpoJob::train(Scheduler& s, const Rollout& r, const Experience& e, int64_t step) {
  const int64_t b = r.sequences.size(0);
  json actor_args = {{"action_len", r.action_mask.size(1)},
                     {"micro_batch_size", c_.train_micro_batch_size},
                     {"max_tokens", c_.max_tokens_per_micro_batch},
                     {"packing", c_.packing_samples},
                     {"clip_low", c_.policy.clip_low},
                     {"clip_high", c_.policy.clip_high},
                     {"dual_clip", c_.policy.dual_clip},
                     {"policy_loss", c_.policy_loss},
                     {"loss_agg", c_.loss_agg},
                     {"loss_norm_len", c_.policy.norm_len},
                     {"rollout_correction", c_.rollout_correction},
                     {"rollout_correction_cap", c_.policy.correction.cap},
                     {"kl_loss_coef", c_.kl_use_loss && has_ref_ ? kl_.value() : 0.0},
                     {"kl_estimator", spec_.get_string("algo.kl.estimator")},
                     {"temperature", c_.temperature}};
  json critic_args = {{"action_len", r.action_mask.size(1)},
                      {"micro_batch_size", c_.train_micro_batch_size},
                      {"max_tokens", c_.max_tokens_per_micro_batch},
                      {"packing", c_.packing_samples},
                      {"value_clip", c_.value_clip},
                      {"loss_agg", c_.loss_agg},
                      {"loss_norm_len", c_.policy.norm_len}};
  // Critic-less runs log no critic figures (rather than zeros for what does not exist).
  std::vector<const char*> averaged = {"policy_loss", "clip_frac", "approx_kl", "grad_norm"};
  if (has_critic_) averaged.insert(averaged.end(), {"value_loss", "critic_grad_norm"});
  json sums = {{"lr", 0.0}};
  for (const char* k : averaged) sums[k] = 0.0;
  int64_t updates = 0;
  double compute = 0;
  torch::Generator gen = at::detail::createCPUGenerator(c_.seed * 31 + static_cast<uint64_t>(step));
  for (int64_t epoch = 0; epoch < c_.max_epochs; ++epoch) {
    s.progress().begin("step " + std::to_string(step) + "/" + std::to_string(total_steps_) +
                       ": training, epoch " + std::to_string(epoch + 1) + "/" +
                       std::to_string(c_.max_epochs));
    torch::Tensor order = torch::randperm(b, gen, torch::kLong);
    for (int64_t start = 0; start + c_.train_batch_size <= b; start += c_.train_batch_size) {
      torch::Tensor idx = order.slice(0, start, start + c_.train_batch_size);
      auto pick = [&](const torch::Tensor& t) { return t.index_select(0, idx).contiguous(); };
      std::vector<NamedTensor> common = {{"sequences", pick(r.sequences)},
                                         {"attention_mask", pick(r.attention_mask)},
                                         {"action_mask", pick(r.action_mask)}};
      auto actor_tensors = common;
      actor_tensors.push_back({"log_probs_old", pick(e.log_probs_old)});
      actor_tensors.push_back({"advantages", pick(e.adv.advantages)});
      if (c_.policy.correction.mode != RolloutCorrection::kNone)
        actor_tensors.push_back({"log_probs_behaviour", pick(e.log_probs_behaviour)});
      if (c_.kl_use_loss && has_ref_)
        actor_tensors.push_back({"log_probs_ref", pick(e.log_probs_ref)});
      std::future<std::vector<Message>> critic;
      if (has_critic_) {
        auto critic_tensors = common;
        critic_tensors.push_back({"values_old", pick(e.values)});
        critic_tensors.push_back({"returns", pick(e.adv.returns)});
        critic = in_parallel([&, critic_tensors] {
          return s.group(Role::kCritic).call_all("train_critic", critic_args, critic_tensors);
        });
      }
      auto actor = s.group(Role::kActor).call_all("train_actor", actor_args, actor_tensors);
      double update_compute = call_all_compute(actor);
      const json& a = actor.front().args;
      sums["policy_loss"] = sums["policy_loss"].get<double>() + number(a, "loss");
      sums["clip_frac"] = sums["clip_frac"].get<double>() + number(a, "clip_frac");
      sums["approx_kl"] = sums["approx_kl"].get<double>() + number(a, "approx_kl");
      sums["grad_norm"] = sums["grad_norm"].get<double>() + number(a, "grad_norm");
      sums["lr"] = number(a, "lr");
      if (has_critic_) {
        const std::vector<Message> critic_replies = critic.get();
        update_compute = std::max(update_compute, call_all_compute(critic_replies));
        const json& cr = critic_replies.front().args;
        sums["value_loss"] = sums["value_loss"].get<double>() + number(cr, "loss");
        sums["critic_grad_norm"] = sums["critic_grad_norm"].get<double>() + number(cr, "grad_norm");
      }
      compute += update_compute;
      ++updates;
    }
  }
  for (const char* k : averaged)
    sums[k] = sums[k].get<double>() / static_cast<double>(std::max<int64_t>(1, updates));
  sums["updates"] = updates;
  sums["compute_s"] = compute;
  return sums;
}

double PpoJob::sync_weights(Scheduler& s) {
  const std::string store = s.rendezvous("weight_sync");
  RoleGroup& rollout = s.group(Role::kRollout);
  auto receive = in_parallel([&] {
    return rollout.call_all("sync_weights",
                            {{"store_path", store}, {"backend", sync_route_.backend}});
  });
  const auto bucket_bytes = static_cast<int64_t>(spec_.get_float("rollout.sync_bucket_mb") *
                                                 static_cast<double>(1 << 20));
  auto pushed = s.group(Role::kActor)
                    .call_all("push_weights", {{"store_path", store},
                                               {"sync_size", rollout.size() + 1},
                                               {"backend", sync_route_.backend},
                                               {"path", sync_route_.path},
                                               {"bucket_bytes", bucket_bytes},
                                               {"tensor_parallel_size", c_.tensor_parallel_size}});
  const auto received = receive.get();
  const json& a = pushed.at(0).args;
  const double seconds = a.value("seconds", 0.0);
  const auto bytes = a.value("bytes", int64_t{0});
  last_sync_ = {{"path", a.value("path", sync_route_.path)},
                {"bytes", bytes},
                {"buckets", a.value("buckets", int64_t{0})},
                {"seconds", seconds},
                {"gb_per_s", seconds > 0 ? static_cast<double>(bytes) / 1e9 / seconds : 0.0}};
  return std::max(call_all_compute(pushed), call_all_compute(received));
}

double PpoJob::before_training(Scheduler& s) {
  offload_ = json::object();
  double compute = 0;
  if (sleep_rollout_) {
    const auto replies = s.group(Role::kRollout).call_all("sleep");
    const json& r = replies.at(0).args;
    offload_["rollout_bytes"] = r.value("offloaded_bytes", int64_t{0});
    offload_["rollout_sleep_s"] = r.value("seconds", 0.0);
    offload_["rollout_cuda_allocated_bytes_asleep"] = r.value("cuda_allocated_bytes", int64_t{0});
    offload_["rollout_cuda_reserved_bytes_asleep"] = r.value("cuda_reserved_bytes", int64_t{0});
    compute += call_all_compute(replies);
  }
  if (offload_optimizer_) {
    const auto replies = s.group(Role::kActor).call_all("restore_optimizer");
    offload_["actor_optimizer_restore_s"] = replies.at(0).args.value("seconds", 0.0);
    compute += call_all_compute(replies);
  }
  return compute;
}

double PpoJob::before_generating(Scheduler& s) {
  double compute = 0;
  if (offload_optimizer_) {
    const auto replies = s.group(Role::kActor).call_all("offload_optimizer");
    const json& r = replies.at(0).args;
    offload_["actor_optimizer_bytes"] = r.value("offloaded_bytes", int64_t{0});
    offload_["actor_optimizer_offload_s"] = r.value("seconds", 0.0);
    offload_["actor_cuda_allocated_bytes_offloaded"] = r.value("cuda_allocated_bytes", int64_t{0});
    compute += call_all_compute(replies);
  }
  if (sleep_rollout_) {
    const auto replies = s.group(Role::kRollout).call_all("wake_up");
    const json& r = replies.at(0).args;
    offload_["rollout_wake_s"] = r.value("seconds", 0.0);
    offload_["rollout_cuda_allocated_bytes_awake"] = r.value("cuda_allocated_bytes", int64_t{0});
    offload_["rollout_cuda_reserved_bytes_awake"] = r.value("cuda_reserved_bytes", int64_t{0});
    compute += call_all_compute(replies);
  }
  return compute;
}

void PpoJob::save(Scheduler& s, int64_t step, int64_t prompts_consumed, std::ostream& out) {
  const std::string tag = "global_step" + std::to_string(step);
  const auto t0 = Clock::now();
  out << "ppo: saving the checkpoint of step " << step << " to " << c_.ckpt_path << std::endl;
  s.progress().begin("saving the checkpoint of step " + std::to_string(step));
  json args = {{"save_only_model", c_.save_only_model}, {"max_num", c_.max_ckpt}};
  std::vector<std::future<void>> calls;
  for (Role role : {Role::kActor, Role::kCritic}) {
    if (role == Role::kCritic && !has_critic_) continue;
    json a = args;
    a["dir"] = (fs::path(c_.ckpt_path) / role_name(role) / tag).string();
    calls.push_back(in_parallel([&s, role, a] { s.group(role).call_all("save", a); }));
  }
  for (auto& c : calls) c.get();
  // The driver's own state last: its presence marks the whole step's checkpoint complete.
  const std::string file = engine::write_driver_state(
      c_.ckpt_path, step, {{"prompts_consumed", prompts_consumed}, {"kl_coef", kl_.value()}}, spec_,
      c_.max_ckpt);
  s.progress().end();
  out << "ppo: checkpoint of step " << step << " saved in " << seconds_text(seconds_since(t0))
      << " s (" << file << ")" << std::endl;
}

int64_t PpoJob::resume(Scheduler& s) {
  const auto state = engine::latest_driver_state(c_.ckpt_path, Role::kActor);
  if (!state) throw InputError("--resume: no complete checkpoint under " + c_.ckpt_path);
  std::vector<std::future<void>> calls;
  for (Role role : {Role::kActor, Role::kCritic}) {
    if (role == Role::kCritic && !has_critic_) continue;
    json a = {{"dir", (fs::path(c_.ckpt_path) / role_name(role) / state->tag).string()}};
    calls.push_back(in_parallel([&s, role, a] { s.group(role).call_all("load", a); }));
  }
  for (auto& c : calls) c.get();
  stream_->seek(state->data.at("prompts_consumed").get<int64_t>());
  kl_.set_value(state->data.at("kl_coef").get<double>());
  return state->step;
}

std::string fmt(double v, int precision = 3) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(precision) << v;
  return o.str();
}

void PpoJob::evaluate(Scheduler& s, int64_t step, MetricsSink& metrics, std::ostream& out) {
  const auto t0 = Clock::now();
  const int64_t count = static_cast<int64_t>(eval_prompts_.size());
  s.progress().begin("evaluating " + std::to_string(count) + " held-out prompts");
  // Every held-out prompt once, in one left-padded batch, scattered micro batch by micro batch.
  PromptStream stream(eval_prompts_, pad_id_, c_.seed);
  const PromptBatch batch = stream.next(count);
  auto run = [&](double temperature, int64_t n) {
    Rollout r = generate_with(s, batch, temperature, n, c_.seed * 7919 + 104729);
    torch::Tensor model_scores;
    if (has_reward_model_)
      model_scores = s.group(Role::kReward)
                         .scatter("score", sequence_tensors(r), c_.rollout_micro_batch_size * n,
                                  {{"max_tokens", c_.max_tokens_per_micro_batch},
                                   {"max_rows", c_.rollout_micro_batch_size * n}},
                                  std::nullopt, dispatch_for(spec_, Role::kReward))
                         .tensor("scores");
    score_rewards(r, model_scores);
    return r;
  };
  // Correct: the accuracy source (eval.accuracy_source, else the first) at its full score.
  const auto& names = rewards_->names();
  const int64_t source =
      eval_accuracy_source_.empty()
          ? 0
          : std::find(names.begin(), names.end(), eval_accuracy_source_) - names.begin();
  auto correct = [&](const Rollout& r) { return (r.source_scores[source] >= 1.0 - 1e-9); };
  const Rollout greedy = run(0.0, 1);
  const auto right = correct(greedy);
  json rec = {
      {"step", step},
      {"split", "eval"},
      {"prompts", count},
      {"accuracy", right.to(torch::kFloat64).mean().item<double>()},
      {"correct", right.sum().item<int64_t>()},
      {"reward", greedy.scores.mean().item<double>()},
      {"sources", source_means(greedy.source_scores, names)},
      {"response_length", greedy.action_mask.sum(1).to(torch::kFloat64).mean().item<double>()}};
  if (eval_samples_ > 0) {
    const Rollout sampled = run(c_.temperature, eval_samples_);
    const auto ok = correct(sampled).to(torch::kFloat64).reshape({count, eval_samples_});
    rec["accuracy_sampled"] = ok.mean().item<double>();  // mean over samples
    rec["pass_at_n"] = (ok.amax(1) > 0).to(torch::kFloat64).mean().item<double>();
  }
  rec["time_s"] = seconds_since(t0);
  metrics.write(rec);
  json rows = json::array();
  for (int64_t i = 0; i < std::min<int64_t>(count, spec_.get_int("logger.samples_per_step")); ++i)
    rows.push_back({{"split", "eval"},
                    {"prompt", greedy.prompts[static_cast<size_t>(i)]},
                    {"response", greedy.responses[static_cast<size_t>(i)]},
                    {"label", greedy.labels[static_cast<size_t>(i)]},
                    {"reward", greedy.scores[i].item<double>()}});
  if (!rows.empty()) metrics.samples(step, rows);
  s.progress().end();
  out << "eval after step " << step << " | accuracy " << fmt(rec["accuracy"]) << " ("
      << rec["correct"].get<int64_t>() << "/" << count << ")"
      << (eval_samples_ > 0 ? " | sampled " + fmt(rec["accuracy_sampled"]) + ", pass@" +
                                  std::to_string(eval_samples_) + " " + fmt(rec["pass_at_n"])
                            : std::string())
      << " | reward " << fmt(rec["reward"]) << " | len " << fmt(rec["response_length"], 1) << " | "
      << fmt(rec["time_s"], 1) << " s" << std::endl;
}

void PpoJob::run(Scheduler& s, std::ostream& out) {
  planned_ = engine::planned_roles(run_dir_);
  MetricsSink metrics((fs::path(run_dir_) / "metrics.jsonl").string(),
                      spec_.get_bool("logger.tensorboard"));
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
  // Held-out accuracy before training (or at the resumed step), every eval.steps, at the end.
  if (!eval_prompts_.empty()) evaluate(s, step, metrics, out);
  const auto loop_start = Clock::now();
  const int64_t first_step = step + 1;
  // algo.async_steps 1: the next step's samples, generated while this step scores and trains
  // (with the weights this step's samples came from, or after a resume the checkpoint's).
  std::optional<Rollout> ready;
  for (++step; step <= total_steps_; ++step) {
    const auto t0 = Clock::now();
    const std::string at = "step " + std::to_string(step) + "/" + std::to_string(total_steps_);
    s.progress().begin(at + ": generating " + std::to_string(c_.rollout_batch_size) +
                       " prompts x " + std::to_string(c_.n_samples_per_prompt) + " samples");
    Rollout r = ready ? std::move(*ready) : sample(s, step);
    ready.reset();
    const int64_t consumed = stream_->consumed();  // this step's prompts, not the next one's
    std::future<Rollout> ahead;
    const auto ahead_start = Clock::now();
    double t_ahead = 0;  // the next step's generation, beside this step's work
    if (c_.async_steps > 0 && step < total_steps_)
      ahead = in_parallel([this, &s, step, &t_ahead, ahead_start] {
        Rollout next = sample(s, step + 1);
        t_ahead = seconds_since(ahead_start);
        return next;
      });
    const double t_gen = seconds_since(t0);
    const auto t1 = Clock::now();
    const double offload_compute = before_training(s);
    s.progress().begin(at + ": scoring " + std::to_string(r.sequences.size(0)) + " samples");
    Experience e = score(s, r);
    const double t_score = seconds_since(t1);
    const auto t2 = Clock::now();
    json losses = train(s, r, e, step);
    const double t_train = seconds_since(t2);
    // The weights change under the rollout only after the next step's samples are drawn.
    const auto t_wait_start = Clock::now();
    if (ahead.valid()) {
      s.progress().begin(at + ": waiting for the next step's samples");
      ready = ahead.get();
    }
    const double t_wait = seconds_since(t_wait_start);
    const auto t3 = Clock::now();
    const double reload_compute = before_generating(s);
    s.progress().begin(at + ": sending the actor's weights to the rollout group");
    const double sync_compute = sync_weights(s) + offload_compute + reload_compute;
    s.progress().end();
    const double t_sync = seconds_since(t3);
    const double t_step = seconds_since(t0);
    auto mask = r.action_mask.to(torch::kFloat32);
    const double kl_mean = e.kl_mean;
    const double kl_coef = kl_.value();
    kl_.update(kl_mean, r.sequences.size(0));
    if (step % c_.logging_steps == 0 || step == total_steps_) {
      const double tokens = r.attention_mask.sum().item<double>();
      // Worker compute on the step's critical path; the rest is scheduling, transport,
      // driver-side math (advantages, rewards) and waiting (bench/ppo_overhead measures it).
      const double compute =
          r.compute_s + e.compute_s + losses["compute_s"].get<double>() + sync_compute;
      json rec = {
          {"step", step},
          {"total_steps", total_steps_},
          {"reward_mean", e.scores.mean().item<double>()},
          {"reward_std", e.scores.std(false).item<double>()},
          {"reward", source_means(e.source_scores, rewards_->names())},
          {"return_mean", (e.adv.rewards.sum(1)).mean().item<double>()},
          {"kl", kl_mean},
          {"kl_coef", kl_coef},
          {"response_length", e.response_length.to(torch::kFloat32).mean().item<double>()},
          {"entropy", ((e.entropy * mask).sum() / mask.sum().clamp_min(1)).item<double>()},
          {"worker_compute_s", compute},
          {"overhead_share", std::max(0.0, 1.0 - compute / t_step)},
          {"time_s",
           {{"generate", t_gen + t_wait},
            {"generate_ahead", t_ahead},
            {"score", t_score},
            {"train", t_train},
            {"sync", t_sync},
            {"step", t_step}}},
          {"samples_per_s", static_cast<double>(r.sequences.size(0)) / t_step},
          {"tokens_per_s", tokens / t_step},
          {"weight_version", r.weight_version},
          {"rollout_preempted", r.preempted},
          {"rollout_kv_peak_bytes", r.kv_peak_bytes},
          {"prompts_consumed", consumed},
          {"weight_sync", last_sync_},
          {"rollout_logprob_diff", {{"mean", e.logprob_diff_mean}, {"max", e.logprob_diff_max}}},
          {"rollout_mismatch", mismatch_json(c_.policy.correction.mode, e.mismatch)},
          {"memory", peak_memory_by_role(s, planned_)}};
      if (!offload_.empty()) rec["offload"] = offload_;
      rec.update(losses);
      if (!r.sampling.is_null()) rec.update(r.sampling);
      if (c_.overlong_buffer_len > 0)
        rec["overlong_penalty"] = e.overlong_penalty.mean().item<double>();
      metrics.write(rec);
      // A few generations of the step, spread over its prompts, to read beside the numbers.
      const int64_t b = r.sequences.size(0),
                    k = std::min(b, spec_.get_int("logger.samples_per_step"));
      if (k > 0) {
        json rows = json::array();
        for (int64_t j = 0; j < k; ++j) {
          const auto i = static_cast<size_t>(j * b / k);
          rows.push_back({{"prompt", r.prompts[i]},
                          {"response", r.responses[i]},
                          {"reward", e.scores[static_cast<int64_t>(i)].item<double>()}});
        }
        metrics.samples(step, rows);
      }
      out << "step " << step << "/" << total_steps_ << " | reward " << fmt(rec["reward_mean"])
          << " +- " << fmt(rec["reward_std"]) << " | kl " << fmt(kl_mean, 4) << " | policy "
          << fmt(rec["policy_loss"])
          << (has_critic_ ? " | value " + fmt(rec["value_loss"]) : std::string()) << " | len "
          << fmt(rec["response_length"], 1) << " | " << fmt(t_step, 2) << " s (gen "
          << static_cast<int>(100 * t_gen / t_step) << "%) | " << fmt(rec["samples_per_s"], 1)
          << " samples/s | "
          << elapsed_and_eta(seconds_since(loop_start), step - first_step + 1,
                             total_steps_ - first_step + 1)
          << std::endl;
    }
    if (!eval_prompts_.empty() &&
        ((eval_steps_ > 0 && step % eval_steps_ == 0) || step == total_steps_)) {
      // The rollout has this step's weights (synced above); with async_steps it is generating
      // nothing now (the next step's samples are drawn).
      evaluate(s, step, metrics, out);
    }
    // Every ckpt.save_steps, and always after the last step (a finished run can be resumed
    // with more steps, and its final state is kept whatever save_steps says).
    if ((c_.save_steps > 0 && step % c_.save_steps == 0) || step == total_steps_) {
      save(s, step, consumed, out);
      // The save brought the optimizer state back to the device; the rollout generates next.
      if (offload_optimizer_ && step < total_steps_)
        s.group(Role::kActor).call_all("offload_optimizer");
    }
  }
  if (c_.export_hf) {
    std::string dir = (fs::path(run_dir_) / "export" / "actor").string();
    out << "ppo: exporting the trained actor to " << dir << std::endl;
    s.progress().begin("exporting the actor");
    s.group(Role::kActor).call_all("export_hf", {{"dir", dir}});
    s.progress().end();
    // The export is a complete model directory: the tokenizer comes along.
    for (const char* name :
         {"tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json",
          "generation_config.json", "chat_template.jinja"}) {
      const fs::path from = fs::path(spec_.get_string("actor.model")) / name;
      if (fs::exists(from))
        fs::copy_file(from, fs::path(dir) / name, fs::copy_options::overwrite_existing);
    }
    out << "ppo: trained actor exported to " << dir << std::endl;
  }
  out << "ppo: done; metrics in " << metrics.path() << std::endl;
}

}  // namespace

JobDriver ppo_driver(const JobSpec& spec, PpoDriverOptions options) {
  auto job = std::make_shared<PpoJob>(spec, options);
  return [job](Scheduler& scheduler, std::ostream& out) { job->run(scheduler, out); };
}

}  // namespace rlhf::ppo
