#include "actors/model_operations.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "actors/device.h"
#include "actors/offline_operations.h"
#include "core/errors.h"
#include "core/timing.h"
#include "engine/token_budget.h"
#include "models/lora.h"
#include "models/pretrained.h"
#include "models/routes.h"
#include "ppo/kl.h"
#include "ppo/losses.h"
#include "ppo/worker_ops.h"
#include "rollout/weight_sync.h"
#include "rollout/worker_ops.h"

namespace rlhf {

using nlohmann::json;

models::CausalLM& ModelRole::checked_model(const std::string& op) const {
  if (!model) throw RuntimeError(op + ": the model is not loaded (call init first)");
  return *model;
}

namespace {

int64_t peak_rss_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;
}

ops::MemoryReply memory_reply(const ModelRole& role) {
  ops::MemoryReply r;
  r.peak_rss_bytes = peak_rss_bytes();
  r.cuda = device_memory_log().to_json();
  if (role.trainer) {
    auto m = role.trainer->memory_report();
    r.params = m.params;
    r.master = m.master;
    r.optimizer = m.optimizer;
    r.grads = m.grads;
    r.gathered = m.gathered;
    r.peak_tensor_bytes = m.peak;
    r.step_collectives = role.trainer->last_step_traffic();
  } else if (role.sharded) {
    auto m = role.sharded->memory_report();
    r.params = m.params;
    r.gathered = m.gathered;
    r.peak_tensor_bytes = m.peak;
  } else if (role.model) {
    int64_t bytes = 0;
    for (const auto& p : role.model->parameters()) bytes += p.numel() * p.element_size();
    r.params = bytes;
    r.peak_tensor_bytes = bytes;
  }
  r.tensor_phases = role.tensor_phases;
  return r;
}

// Starts a tracked-tensor window on the role's tracker (none before init).
void begin_tensor_window(ModelRole& role) {
  if (role.trainer)
    role.trainer->begin_memory_window();
  else if (role.sharded)
    role.sharded->begin_memory_window();
}

// The tracked-tensor peak since begin_tensor_window (a tracker built during the operation,
// as init's, counts from its construction), or the weights of an unsharded model; -1
// before a model exists.
int64_t tensor_window_peak(const ModelRole& role) {
  if (role.trainer) return role.trainer->memory_report().window_peak;
  if (role.sharded) return role.sharded->memory_report().window_peak;
  if (!role.model) return -1;
  int64_t bytes = 0;
  for (const auto& p : role.model->parameters()) bytes += p.numel() * p.element_size();
  return bytes;
}

// Wraps every operation registered since `before` to keep its tracked peak per name.
void record_tensor_phases(OperationRegistry& registry, const std::vector<std::string>& before,
                          const std::shared_ptr<ModelRole>& role) {
  for (const auto& name : registry.names()) {
    if (std::find(before.begin(), before.end(), name) != before.end()) continue;
    registry.wrap(name, [role, name](Operation op) -> Operation {
      return [role, name, op](const Message& req, const WorkerIdentity& self) {
        begin_tensor_window(*role);
        Message reply = op(req, self);
        const int64_t peak = tensor_window_peak(*role);
        if (peak >= 0) {
          int64_t& most = role->tensor_phases[name];
          most = std::max(most, peak);
        }
        return reply;
      };
    });
  }
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InputError(path + ": cannot read");
  std::stringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

// LoRA on a trained role: a PEFT adapter to start from (its config wins), or fresh adapters
// drawn from the job's seed (the same on every rank). The base is frozen; a value head stays
// trained (PEFT's modules_to_save for a classifier's score).
void add_adapters(ModelRole& role) {
  const std::string what = role.config.role + ".lora";
  if (!role.config.lora_adapter.empty()) {
    role.config.lora = models::load_adapter(*role.model, role.config.lora_adapter);
  } else {
    models::apply_lora(*role.model, role.config.lora, role.config.seed, what);
  }
  if (role.model->value_head) role.model->value_head->weight.set_requires_grad(true);
}

// What a LoRA role's trainer starts from beside the frozen base: its adapters and, from an
// adapter directory that saved one, the trained value head (PEFT's modules_to_save).
std::vector<std::pair<std::string, torch::Tensor>> trainable_start(ModelRole& role) {
  auto tensors = models::model_adapters(*role.model);
  if (!role.config.lora_adapter.empty())
    for (auto& saved : models::adapter_saved_modules(role.config.lora_adapter))
      tensors.push_back(std::move(saved));
  return tensors;
}

// export_hf of a LoRA role: the PEFT adapter directory at `dir` (rank 0 writes; a value-head
// role's head saved whole beside the adapters) and, with lora.export_merged, the merged model
// at DIR-merged, streamed from the base checkpoint (with the trained head).
void export_lora(ModelRole& role, const std::string& dir, const WorkerIdentity& self) {
  auto tensors = role.trainer->gather_trainable();  // collective: every rank
  if (self.rank == 0) {
    // The adapters and a value-head role's head (saved whole, as PEFT's modules_to_save).
    const std::string head = role.config.value_head_prefix + ".weight";
    std::vector<std::pair<std::string, torch::Tensor>> adapters;
    for (auto& [name, t] : tensors)
      if (name.find(".lora_") != std::string::npos || (role.model->value_head && name == head))
        adapters.emplace_back(name, t);
    const torch::Dtype dtype = models::dtype_from_name(role.config.dtype);
    models::write_adapter_dir(adapters, role.config.lora, dir, role.config.model_dir, dtype);
    if (role.config.lora_export_merged)
      models::write_merged_model(role.config.model_dir, adapters, role.config.lora, dir + "-merged",
                                 dtype);
  }
  role.group->barrier();  // the export is complete on disk when any rank returns
}

// A trained role's expert parallelism (<role>.expert_parallel_size e > 1): world rank
// w = g e + p joins EP group g as rank p and expert-data-parallel group p as rank g (stores
// beside the role's own), in that order on every rank. Disabled otherwise.
models::ExpertParallel expert_parallel(ModelRole& role, const WorkerIdentity& self,
                                       const std::string& store_path) {
  const int e = static_cast<int>(role.config.expert_parallel_size);
  if (e <= 1 || !role.config.trainer) return {};
  if (self.world_size % e != 0)
    throw InputError(role.config.role + ".expert_parallel_size " + std::to_string(e) +
                     " does not divide the role's " + std::to_string(self.world_size) + " workers");
  transport::CollectiveConfig cc;
  cc.backend =
      on_cuda(self) ? transport::CollectiveBackend::kNccl : transport::CollectiveBackend::kGloo;
  const int g = self.rank / e, p = self.rank % e;
  cc.rank = p;
  cc.size = e;
  cc.store_path = store_path + ".ep" + std::to_string(g);
  role.ep_group = transport::make_collective_group(cc);
  cc.rank = g;
  cc.size = self.world_size / e;
  cc.store_path = store_path + ".edp" + std::to_string(p);
  role.edp_group = transport::make_collective_group(cc);
  return {p, e, role.ep_group};
}

// init (engine/worker_ops.h). Every role builds its model without weights (Materialize::kDeferred)
// and fills it from the checkpoint as it will hold it: a trainer reads each rank's FP32 shard, a
// ZeRO-3 reference or reward each rank's compute-dtype shard, an unsharded one the whole model in
// the compute dtype. No role builds the whole model in FP32 or draws random weights.
Message init(ModelRole& role, const ops::Init& req, const WorkerIdentity& self) {
  role.config = req.config;
  role.device = worker_device(self);
  check_dtype_on_device(self, role.config.dtype);
  const bool trained = role.config.trainer.has_value();
  const torch::Dtype compute = models::dtype_from_name(role.config.dtype);
  models::LoadOptions load;
  load.device = role.device;
  load.dtype = compute;
  load.head = role.config.head;
  load.value_head_prefix = role.config.value_head_prefix;
  const models::PretrainedSource source(role.config.model_dir, load);
  const bool sharded_inference = !trained && role.config.shard_weights && self.world_size > 1;
  if (trained || sharded_inference) {
    transport::CollectiveConfig cc;
    cc.rank = self.rank;
    cc.size = self.world_size;
    cc.store_path = req.store_path;
    // NCCL between the GPUs of a role (one GPU per rank); Gloo on cpu nodes.
    cc.backend =
        on_cuda(self) ? transport::CollectiveBackend::kNccl : transport::CollectiveBackend::kGloo;
    role.group = transport::make_collective_group(cc);
  }
  role.model = std::make_shared<models::CausalLM>(source.config(), models::Materialize::kDeferred,
                                                  models::TensorParallel{},
                                                  expert_parallel(role, self, req.store_path));
  role.model->set_logits_chunk_tokens(role.config.logits_chunk_tokens);
  role.config_json =
      read_text((std::filesystem::path(role.config.model_dir) / "config.json").string());
  const bool tied = role.model->config().tie_word_embeddings;
  if (trained) {
    role.model->set_checkpointing(role.config.gradient_checkpointing
                                      ? models::Checkpointing::kPerLayer
                                      : models::Checkpointing::kNone);
    engine::TrainerConfig tc = *role.config.trainer;
    tc.device = role.device;
    tc.compute_dtype = compute;
    tc.tied_embeddings = tied;
    if (role.config.uses_lora()) {
      // Adapters first (the base frozen), then the trainer reads them with the base weights.
      add_adapters(role);
      const models::AdapterSource adapters(source, trainable_start(role));
      role.trainer = std::make_unique<engine::Trainer>(tc, *role.model, *role.group, &adapters);
    } else {
      role.trainer = std::make_unique<engine::Trainer>(
          tc, *role.model, *role.group, &source,
          engine::ExpertGroups{role.ep_group.get(), role.edp_group.get()});
    }
  } else if (sharded_inference) {
    role.sharded = std::make_unique<engine::ShardedInference>(*role.model, *role.group, source,
                                                              compute, role.device, tied);
    role.model->eval();
  } else {
    // A scorer that never trains (reference, reward): q/k/v and gate/up as one GEMM each.
    models::load_whole(*role.model, source, compute, role.device);
    role.model->fuse_projections();
    role.model->eval();
  }
  return reply_message(ops::InitReply{role.model->config().num_parameters(), memory_reply(role)});
}

struct Batch {
  torch::Tensor sequences;       // [B, T] int64 prompt + response ids
  torch::Tensor attention_mask;  // [B, T]
  int64_t action_len = 0;        // A: the last A positions are the response
  torch::Tensor routes;          // [B, T, S, k] the rollout's routes, when sent
};

// The request's batch on `device` (the worker's), its last action_len positions the responses.
Batch read_batch(const Message& req, int64_t action_len, torch::Device device) {
  Batch b;
  b.sequences = req.tensor("sequences").to(device, torch::kLong);
  b.attention_mask = req.tensor("attention_mask").to(device, torch::kLong);
  b.action_len = action_len;
  TORCH_CHECK(b.sequences.dim() == 2 && b.sequences.sizes() == b.attention_mask.sizes(), req.op,
              ": expected sequences and attention_mask [B, T], got ", b.sequences.sizes(), " and ",
              b.attention_mask.sizes());
  TORCH_CHECK(b.action_len >= 1 && b.action_len < b.sequences.size(1), req.op,
              ": action_len must be in [1, T), got ", b.action_len,
              " for T = ", b.sequences.size(1));
  if (req.has_tensor("routes")) {
    b.routes = req.tensor("routes").to(device);
    TORCH_CHECK(b.routes.dim() == 4 && b.routes.size(0) == b.sequences.size(0) &&
                    b.routes.size(1) == b.sequences.size(1),
                req.op, ": expected routes [B, T, sparse layers, top_k] for sequences ",
                b.sequences.sizes(), ", got ", b.routes.sizes());
  }
  return b;
}

// Rows [b0, b1) of the request's tensor `name`, on `device`.
torch::Tensor rows(const Message& req, const char* name, int64_t b0, int64_t b1,
                   torch::Device device) {
  return req.tensor(name).slice(0, b0, b1).to(device);
}

Batch slice(const Batch& b, int64_t begin, int64_t end) {
  return {b.sequences.slice(0, begin, end), b.attention_mask.slice(0, begin, end), b.action_len,
          b.routes.defined() ? b.routes.slice(0, begin, end) : torch::Tensor()};
}

// Hidden states [B, T, H] whose head outputs are the logits / temperature: the LM head is a
// linear map without bias (Llama, Qwen2), so (h / T) W^T = (h W^T) / T. Log-probs and
// entropy for the PPO ratio and KL are taken at the sampling temperature, as OpenRLHF
// (logits.div_(temperature) in Actor.forward) and veRL do. A request's temperature 1 or 0
// (greedy sampling) leaves the logits as they are.
double request_temperature(double t, const char* op) {
  if (!(t >= 0.0))
    throw InputError(std::string(op) + ": temperature must be >= 0, got " + std::to_string(t));
  return t == 0.0 ? 1.0 : t;
}
torch::Tensor at_temperature(const torch::Tensor& hidden, double temperature) {
  return temperature == 1.0 ? hidden : hidden / temperature;
}

// Log-probs [B, A] (FP32) of the last A tokens of `ids` [B, T] and, with Entropy::kCompute,
// the policy's entropy [B, A] before each: the head runs on the action positions alone
// (hidden [B, T, H] at T-1-A .. T-2), train.logits_chunk_tokens tokens at a time.
models::HeadLogProbs action_log_probs(models::CausalLM& model, const torch::Tensor& hidden,
                                      const torch::Tensor& ids, int64_t a, double temperature,
                                      models::Entropy entropy) {
  const int64_t t = hidden.size(1);
  return model.head_log_probs(at_temperature(hidden.narrow(1, t - 1 - a, a), temperature),
                              ids.narrow(1, t - a, a), entropy);
}

// One part of a log_probs request through the policy: its log-probs, its entropy when
// asked, and with the rollout's routes the counts LogProbsReply names ([n] int64 each),
// replaying the routes when asked.
std::vector<torch::Tensor> policy_log_probs(models::CausalLM& model, const Batch& mb,
                                            const ops::LogProbs& op, double temperature) {
  std::optional<models::RouteRecorder> recorder;
  models::RouteReplay replay(model);
  if (mb.routes.defined()) {
    recorder.emplace(model);
    if (op.replay_routes) replay.set(models::forward_routes(mb.routes, mb.attention_mask, false));
  }
  auto head = action_log_probs(model, model.forward(mb.sequences, mb.attention_mask), mb.sequences,
                               mb.action_len, temperature,
                               op.entropy ? models::Entropy::kCompute : models::Entropy::kSkip);
  std::vector<torch::Tensor> r = {head.log_probs};
  if (op.entropy) r.push_back(head.entropy);
  if (recorder) {
    const models::RouteRecorder::Taken taken = recorder->take();
    const torch::Tensor rollout = mb.routes.to(torch::kCPU);
    auto [tokens, differ] =
        models::count_route_differences(rollout, taken.used.view(rollout.sizes()));
    r.push_back(tokens);
    r.push_back(differ);
    r.push_back(models::count_route_differences(rollout, taken.own.view(rollout.sizes())).second);
  }
  return r;
}

// Critic values [B, A] (FP32) of the states before each action.
torch::Tensor action_values(models::CausalLM& model, const Batch& b) {
  torch::Tensor v = model.values(model.forward(b.sequences, b.attention_mask));  // [B, T]
  const int64_t t = v.size(1);
  return v.slice(1, t - 1 - b.action_len, t - 1);
}

// This rank's rows of a global batch of `rows` split evenly over the group.
std::pair<int64_t, int64_t> rank_rows(int64_t rows, const WorkerIdentity& self,
                                      const std::string& op) {
  if (rows % self.world_size != 0)
    throw InputError(op + ": " + std::to_string(rows) + " rows do not split over " +
                     std::to_string(self.world_size) + " ranks");
  int64_t per = rows / self.world_size;
  return {self.rank * per, (self.rank + 1) * per};
}

// True when each forward of this role runs collectives over its group (a ZeRO-3 trainer or
// sharded inference gathers weights; an expert-parallel model's tokens reach their experts
// by all-to-all): its ranks must run the same number of forwards.
bool forwards_gather(const ModelRole& role) {
  return role.sharded || role.ep_group ||
         (role.trainer && role.trainer->config().zero_stage == engine::ZeroStage::kParameters);
}

// f(rows [b0, b1)) -> tensors with rows first, for the request's token budget,
// concatenated along rows. An empty range (a ZeRO-3 rank with fewer rows) runs f on row 0
// and drops the result: the forward's gathers must happen.
template <typename F>
std::vector<torch::Tensor> by_budget(const ModelRole& role, const ops::ForwardBudget& budget,
                                     int64_t rows, int64_t t, F f) {
  const int64_t at_least = forwards_gather(role) && budget.max_rows > 0 ? budget.max_rows : rows;
  std::vector<std::vector<torch::Tensor>> parts;
  for (auto [b0, b1] : engine::budget_ranges(rows, t, budget.max_tokens, at_least)) {
    if (b0 == b1) {
      f(0, std::min<int64_t>(1, rows));
      continue;
    }
    parts.push_back(f(b0, b1));
  }
  std::vector<torch::Tensor> out;
  for (size_t k = 0; k < parts.front().size(); ++k) {
    std::vector<torch::Tensor> column;
    for (const auto& p : parts) column.push_back(p[k]);
    out.push_back(column.size() == 1 ? column.front() : torch::cat(column, 0));
  }
  return out;
}

// The parts of training micro batch rows [b0, b1) under the request's token budget
// (max_tokens, packing): rows of at most max_tokens (rows x padded length), or with packing
// consecutive rows whose tokens fit the budget (forwarded packed into one row). Packed
// parts depend on the data, so at ZeRO 2/3 (a reduce-scatter in every backward) and with
// expert parallelism (all-to-alls in every forward) every rank pads to the group's largest
// count with empty parts (run with weight 0).
std::vector<engine::RowRange> training_parts(const ModelRole& role,
                                             const ops::TrainBatching& batching, const Batch& all,
                                             int64_t b0, int64_t b1) {
  const int64_t max_tokens = batching.max_tokens;
  if (!(batching.packing && max_tokens > 0))
    return engine::budget_ranges(b1 - b0, all.sequences.size(1), max_tokens, 0);
  auto parts = engine::token_groups(all.attention_mask.slice(0, b0, b1), max_tokens);
  if (role.group && role.group->size() > 1 &&
      (role.trainer->config().zero_stage != engine::ZeroStage::kOptimizer || role.ep_group)) {
    auto count = torch::tensor({static_cast<int64_t>(parts.size())}, torch::kLong);
    role.group->all_reduce(count, transport::ReduceOp::kMax);
    while (static_cast<int64_t>(parts.size()) < count.item<int64_t>())
      parts.push_back({b1 - b0, b1 - b0});
  }
  return parts;
}

// Per-action results [n, A] of rows `b` through `f` (hidden [B, T, H] -> next-token results
// [B, T - 1]), forwarded as padded rows or, with `packed`, end to end in one row.
template <typename F>
torch::Tensor per_action(models::CausalLM& model, const Batch& b, const torch::Tensor& action_mask,
                         bool packed, F f) {
  if (!packed) {
    torch::Tensor r = f(model.forward(b.sequences, b.attention_mask), b.sequences);
    return r.slice(1, r.size(1) - b.action_len, r.size(1));
  }
  const auto rows = engine::pack_rows(b.sequences, b.attention_mask, b.action_len);
  return engine::unpack_actions(f(model.forward(rows.ids, rows.segments), rows.ids), rows,
                                action_mask);
}

// One part of a training micro batch (all of it without a token budget).
struct TrainPart {
  int64_t begin = 0, end = 0;  // rows of the request
  Batch batch;                 // those rows
  torch::Tensor action_mask;   // [n, A] on the device
  // Its action tokens (rows) over the micro batch's: a part's loss times its share adds up
  // to the micro batch's loss. 0 for a padding part (row 0 run for the collectives only).
  double token_share = 1.0;
  double row_share = 1.0;
};

// One optimizer step over this rank's rows [begin, end): micro batches of
// batching.micro_batch_size, each in training_parts, trainer.backward(loss_fn(part)) for each.
template <typename F>
engine::StepMetrics train_in_parts(ModelRole& role, const Message& req,
                                   const ops::TrainBatching& batching, const Batch& all,
                                   int64_t begin, int64_t end, F loss_fn) {
  const int64_t micro = batching.micro_batch_size;
  auto& trainer = *role.trainer;
  for (int64_t i = 0; i < trainer.config().grad_accum_steps; ++i) {
    const int64_t b0 = begin + i * micro, b1 = std::min(end, b0 + micro);
    TORCH_CHECK(b0 < b1, req.op, ": micro batch ", i, " is empty: the batch holds ", end - begin,
                " rows for this rank, fewer than grad_accum_steps x micro_batch_size");
    const torch::Tensor mask = rows(req, "action_mask", b0, b1, all.sequences.device());
    const auto parts = training_parts(role, batching, all, b0, b1);
    const double tokens = parts.size() == 1 ? 0.0 : mask.sum().item<double>();
    for (size_t k = 0; k < parts.size(); ++k) {
      const bool empty = parts[k].first == parts[k].second;
      TrainPart part;
      const int64_t p0 = empty ? 0 : parts[k].first, p1 = empty ? 1 : parts[k].second;
      part.begin = b0 + p0;
      part.end = b0 + p1;
      part.batch = slice(all, part.begin, part.end);
      part.action_mask = mask.slice(0, p0, p1);
      if (empty) {
        part.token_share = part.row_share = 0.0;
      } else if (parts.size() > 1) {
        part.row_share = static_cast<double>(p1 - p0) / static_cast<double>(b1 - b0);
        part.token_share =
            tokens == 0 ? part.row_share : part.action_mask.sum().item<double>() / tokens;
      }
      trainer.backward(loss_fn(part), k + 1 == parts.size());
    }
  }
  return trainer.step();
}

// train_actor (ppo/worker_ops.h): one optimizer step of the PPO policy loss (plus the KL
// loss term when asked) over this rank's share of the global batch.
Message train_actor(ModelRole& role, const ops::TrainActor& op, const Message& req,
                    const WorkerIdentity& self) {
  if (!role.trainer) throw RuntimeError("train_actor: this worker's role is not trained");
  Batch all = read_batch(req, op.batching.action_len, role.device);
  auto [begin, end] = rank_rows(all.sequences.size(0), self, req.op);
  const ppo::PolicyLossConfig& pc = op.policy;
  const bool corrected = pc.correction.mode != ppo::RolloutCorrection::kNone;
  const double kl_coef = op.kl_loss_coef;
  const bool kl_loss = kl_coef > 0 && req.has_tensor("log_probs_ref");
  const bool packed = op.batching.packing && op.batching.max_tokens > 0;
  const double temperature = request_temperature(op.temperature, op.kName);
  double clip_sum = 0, kl_sum = 0, ppo_kl_sum = 0;
  // Routing replay: each part's routes stay set through its backward (checkpointed layers
  // route again when they recompute); cleared when the step ends.
  models::RouteReplay replay(*role.model);
  if (op.replay_routes && !all.routes.defined())
    throw InputError("train_actor: replay_routes without the rollout's \"routes\"");
  // Mixtures of experts: the load-balancing loss of each part's forward, its gradient added
  // in the part's backward (models::AuxLoss), weighted as the KL term (token share).
  std::optional<models::AuxLossScope> aux;
  if (op.aux_loss_coef > 0) aux.emplace(*role.model);
  const bool balance = aux && aux->sparse();
  double aux_sum = 0;
  auto metrics =
      train_in_parts(role, req, op.batching, all, begin, end, [&](const TrainPart& part) {
        if (op.replay_routes)
          replay.set(models::forward_routes(part.batch.routes, part.batch.attention_mask, packed));
        if (balance)
          aux->loss().begin(
              packed ? torch::Tensor() : part.batch.attention_mask.reshape({-1}),
              op.aux_loss_coef * part.token_share * role.trainer->backward_multiplier());
        // Each part's loss is its share of the micro batch's: tokens for token means, rows for
        // sequence means and token_sum_norm (a sum over rows x a constant); the KL term and the
        // metrics are token means.
        const double share =
            pc.aggregation == ppo::LossAggregation::kTokenMean ? part.token_share : part.row_share;
        const torch::Tensor& m = part.action_mask;
        torch::Tensor lp = per_action(*role.model, part.batch, m, packed,
                                      [&](const torch::Tensor& hidden, const torch::Tensor& ids) {
                                        return role.model->next_token_log_probs(
                                            at_temperature(hidden, temperature), ids);
                                      });
        auto r = ppo::policy_loss(
            pc, lp, rows(req, "log_probs_old", part.begin, part.end, role.device),
            rows(req, "advantages", part.begin, part.end, role.device), m,
            corrected ? rows(req, "log_probs_behaviour", part.begin, part.end, role.device)
                      : torch::Tensor());
        torch::Tensor loss = share == 1.0 ? r.loss : r.loss * share;
        if (kl_loss) {
          // OpenRLHF use_kl_loss: loss += kl_coef * masked_mean(kl(log_probs, log_probs_ref)).
          torch::Tensor kl = ppo::approx_kl(
              lp, rows(req, "log_probs_ref", part.begin, part.end, role.device), op.kl_estimator);
          torch::Tensor mf = m.to(torch::kFloat32);
          torch::Tensor kl_mean = (kl * mf).sum() / mf.sum().clamp_min(1);
          loss = loss + kl_coef * part.token_share * kl_mean;
          kl_sum += part.token_share * kl_mean.item<double>();
        }
        if (balance) {  // the forward is done: its counts are final before backward
          aux->loss().seal();
          aux_sum += part.token_share * aux->loss().value();
        }
        clip_sum += part.token_share * r.clip_frac.item<double>();
        ppo_kl_sum += part.token_share * r.approx_kl.item<double>();
        return loss;
      });
  const double n = static_cast<double>(role.trainer->config().grad_accum_steps);
  return reply_message(ops::TrainActorReply{ops::step_figures(metrics), clip_sum / n,
                                            ppo_kl_sum / n, kl_sum / n, aux_sum / n});
}

// train_critic: one optimizer step of the clipped value loss on this rank's rows.
Message train_critic(ModelRole& role, const ops::TrainCritic& op, const Message& req,
                     const WorkerIdentity& self) {
  if (!role.trainer) throw RuntimeError("train_critic: this worker's role is not trained");
  Batch all = read_batch(req, op.batching.action_len, role.device);
  auto [begin, end] = rank_rows(all.sequences.size(0), self, req.op);
  const bool packed = op.batching.packing && op.batching.max_tokens > 0;
  auto metrics =
      train_in_parts(role, req, op.batching, all, begin, end, [&](const TrainPart& part) {
        torch::Tensor v = per_action(*role.model, part.batch, part.action_mask, packed,
                                     [&](const torch::Tensor& hidden, const torch::Tensor&) {
                                       torch::Tensor values = role.model->values(hidden);  // [B, T]
                                       return values.narrow(1, 0, values.size(1) - 1);
                                     });
        torch::Tensor loss =
            ppo::value_loss(v, rows(req, "values_old", part.begin, part.end, role.device),
                            rows(req, "returns", part.begin, part.end, role.device),
                            part.action_mask, op.value_clip, op.aggregation, op.norm_len);
        // The part's share of the micro batch: of its tokens for a token mean, else of its rows.
        const double share =
            op.aggregation == ppo::LossAggregation::kTokenMean ? part.token_share : part.row_share;
        return share == 1.0 ? loss : loss * share;
      });
  return reply_message(ops::TrainCriticReply{ops::step_figures(metrics)});
}

// push_weights (rollout/worker_ops.h): the actor's side of the weight sync; rollout rank r
// is rank r + 1 of the sync group, actor rank 0 its rank 0 (the rollout merges a LoRA
// actor's adapters into its base).
Message push_weights(ModelRole& role, const ops::PushWeights& req, const WorkerIdentity& self) {
  if (!role.trainer) throw RuntimeError("push_weights: this worker's role is not trained");
  if (self.rank == 0 && !role.sync_group) {
    transport::CollectiveConfig cc;
    cc.rank = 0;
    cc.size = req.sync_size;
    cc.store_path = req.store_path;
    cc.backend = transport::collective_backend(req.backend);
    role.sync_group = transport::make_collective_group(cc);
  }
  rollout::TrainerWeights trainer_weights(*role.trainer);
  rollout::MergedLoraWeights merged(*role.trainer, role.config.lora.scale());
  rollout::LoraAdapterWeights adapters(*role.trainer, role.config.lora.scale());
  rollout::WeightSource* source = &trainer_weights;
  if (role.config.uses_lora())
    source = rollout::parse_lora_sync(req.lora_sync) == rollout::LoraSync::kAdapters
                 ? static_cast<rollout::WeightSource*>(&adapters)
                 : &merged;
  rollout::SyncOptions options;
  options.wire_dtype = models::dtype_from_name(role.config.dtype);
  options.bucket_bytes = req.bucket_bytes;
  options.path = rollout::parse_sync_path(req.path);
  options.device = role.device;
  options.tensor_parallel_size = req.tensor_parallel_size;
  auto stats = rollout::send_weights(*source, self.rank == 0 ? role.sync_group.get() : nullptr,
                                     ++role.weight_version, options);
  return reply_message(ops::sync_reply(stats));
}

// The optimizer state to host memory (or back): the bytes moved, the time, and the device
// allocator after it.
template <typename Reply>
Message move_optimizer_state(ModelRole& role, const std::string& op, const WorkerIdentity& self,
                             bool offload) {
  if (!role.trainer) throw RuntimeError(op + ": this worker's role is not trained");
  const auto start = std::chrono::steady_clock::now();
  const int64_t moved =
      offload ? role.trainer->offload_optimizer_state() : role.trainer->restore_optimizer_state();
  release_cached_device_memory(self);
  const CudaMemory m = on_cuda(self) ? cuda_memory() : CudaMemory{};
  return reply_message(Reply{moved, seconds_since(start), m.allocated, m.reserved});
}

// log_probs, values, score (engine/worker_ops.h): the scoring forwards, under the
// request's token budget.
void add_forward_operations(OperationRegistry& registry, const std::shared_ptr<ModelRole>& role) {
  registry.add<ops::LogProbs>([role](const ops::LogProbs& op, const Message& req,
                                     const WorkerIdentity&) {
    torch::NoGradGuard no_grad;
    models::CausalLM& model = role->checked_model(req.op);
    Batch b = read_batch(req, op.action_len, role->device);
    if (op.reference && !model.has_adapters())
      throw RuntimeError("log_probs: reference asked of a model without LoRA adapters");
    const double temperature = request_temperature(op.temperature, op.kName);
    auto out = by_budget(
        *role, op.budget, b.sequences.size(0), b.sequences.size(1), [&](int64_t b0, int64_t b1) {
          Batch mb = slice(b, b0, b1);
          std::vector<torch::Tensor> r = policy_log_probs(model, mb, op, temperature);
          if (op.reference) {
            const models::AdaptersOff base_model(model, true);
            r.push_back(action_log_probs(model, model.forward(mb.sequences, mb.attention_mask),
                                         mb.sequences, b.action_len, temperature,
                                         models::Entropy::kSkip)
                            .log_probs);
          }
          return r;
        });
    Message reply = reply_message(ops::LogProbsReply{});
    reply.add("log_probs", out[0].contiguous());
    size_t next = 1;
    if (op.entropy) reply.add("entropy", out[next++].contiguous());
    if (b.routes.defined())
      for (const char* name : {"route_tokens", "route_differ", "router_differ"})
        reply.add(name, out[next++].contiguous());
    if (op.reference) reply.add("ref_log_probs", out[next].contiguous());
    return reply;
  });
  registry.add<ops::Values>([role](const ops::Values& op, const Message& req,
                                   const WorkerIdentity&) {
    torch::NoGradGuard no_grad;
    models::CausalLM& model = role->checked_model(req.op);
    Batch b = read_batch(req, op.action_len, role->device);
    auto out = by_budget(
        *role, op.budget, b.sequences.size(0), b.sequences.size(1), [&](int64_t b0, int64_t b1) {
          return std::vector<torch::Tensor>{action_values(model, slice(b, b0, b1))};
        });
    Message reply = reply_message(ops::ValuesReply{});
    reply.add("values", out[0].contiguous());
    return reply;
  });
  registry.add<ops::Score>([role](const ops::Score& op, const Message& req, const WorkerIdentity&) {
    torch::NoGradGuard no_grad;
    models::CausalLM& model = role->checked_model(req.op);
    torch::Tensor seq = req.tensor("sequences").to(role->device, torch::kLong);
    torch::Tensor mask = req.tensor("attention_mask").to(role->device, torch::kLong);
    auto out = by_budget(*role, op.budget, seq.size(0), seq.size(1), [&](int64_t b0, int64_t b1) {
      auto s = seq.slice(0, b0, b1), m = mask.slice(0, b0, b1);
      return std::vector<torch::Tensor>{
          models::last_token_values(model.values(model.forward(s, m)), m)};
    });
    Message reply = reply_message(ops::ScoreReply{});
    reply.add("scores", out[0].to(torch::kFloat32).contiguous());
    return reply;
  });
}

// save, load, export_hf (engine/worker_ops.h): the trainer's checkpoint and export.
void add_checkpoint_operations(OperationRegistry& registry,
                               const std::shared_ptr<ModelRole>& role) {
  registry.add<ops::Save>([role](const ops::Save& op, const Message&, const WorkerIdentity&) {
    if (!role->trainer) throw RuntimeError("save: this worker's role is not trained");
    engine::CheckpointOptions opts;
    opts.save_only_model = op.save_only_model;
    opts.max_num = op.max_num;
    role->trainer->save_checkpoint(op.dir, opts);
    return reply_message(ops::SaveReply{});
  });
  registry.add<ops::Load>([role](const ops::Load& op, const Message&, const WorkerIdentity&) {
    if (!role->trainer) throw RuntimeError("load: this worker's role is not trained");
    role->trainer->load_checkpoint(op.dir);
    return reply_message(ops::LoadReply{role->trainer->steps_done()});
  });
  registry.add<ops::ExportHf>(
      [role](const ops::ExportHf& op, const Message&, const WorkerIdentity& self) {
        if (!role->trainer) throw RuntimeError("export_hf: this worker's role is not trained");
        if (role->config.uses_lora()) {
          export_lora(*role, op.dir, self);
        } else {
          role->trainer->export_hf(op.dir, role->config_json,
                                   models::dtype_from_name(role->config.dtype));
        }
        return reply_message(ops::ExportHfReply{});
      });
}

}  // namespace

std::shared_ptr<ModelRole> add_model_operations(OperationRegistry& registry) {
  auto role = std::make_shared<ModelRole>();
  const std::vector<std::string> before = registry.names();
  registry.add<ops::Init>([role](const ops::Init& req, const Message&, const WorkerIdentity& self) {
    return init(*role, req, self);
  });
  add_forward_operations(registry, role);
  registry.add<ops::TrainActor>(
      [role](const ops::TrainActor& op, const Message& req, const WorkerIdentity& self) {
        return train_actor(*role, op, req, self);
      });
  registry.add<ops::TrainCritic>(
      [role](const ops::TrainCritic& op, const Message& req, const WorkerIdentity& self) {
        return train_critic(*role, op, req, self);
      });
  add_checkpoint_operations(registry, role);
  registry.add<ops::PushWeights>(
      [role](const ops::PushWeights& op, const Message&, const WorkerIdentity& self) {
        return push_weights(*role, op, self);
      });
  registry.add<ops::OffloadOptimizer>(
      [role](const ops::OffloadOptimizer& op, const Message&, const WorkerIdentity& self) {
        return move_optimizer_state<ops::OffloadReply>(*role, op.kName, self, true);
      });
  registry.add<ops::RestoreOptimizer>(
      [role](const ops::RestoreOptimizer& op, const Message&, const WorkerIdentity& self) {
        return move_optimizer_state<ops::RestoreReply>(*role, op.kName, self, false);
      });
  registry.add<ops::Memory>([role](const ops::Memory&, const Message&, const WorkerIdentity&) {
    return reply_message(memory_reply(*role));
  });
  add_offline_operations(registry, role);  // dpo, sft, rm
  record_tensor_phases(registry, before, role);
  return role;
}

}  // namespace rlhf
