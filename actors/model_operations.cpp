#include "actors/model_operations.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "actors/device.h"
#include "actors/model_batch.h"
#include "actors/offline_operations.h"
#include "actors/train_operations.h"
#include "core/errors.h"
#include "core/timing.h"
#include "engine/token_budget.h"
#include "models/lora.h"
#include "models/pretrained.h"
#include "models/routes.h"
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

using model_ops::at_temperature;
using model_ops::Batch;
using model_ops::read_batch;
using model_ops::request_temperature;
using model_ops::slice;

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
// asked, its top_k tokens' log-probs and ids when asked, and with the rollout's routes the
// counts LogProbsReply names ([n] int64 each), replaying the routes when asked.
std::vector<torch::Tensor> policy_log_probs(models::CausalLM& model, const Batch& mb,
                                            const ops::LogProbs& op, double temperature) {
  std::optional<models::RouteRecorder> recorder;
  models::RouteReplay replay(model);
  if (mb.routes.defined()) {
    recorder.emplace(model);
    if (op.replay_routes) replay.set(models::forward_routes(mb.routes, mb.attention_mask, false));
  }
  const torch::Tensor hidden = model.forward(mb.sequences, mb.attention_mask);
  auto head = action_log_probs(model, hidden, mb.sequences, mb.action_len, temperature,
                               op.entropy ? models::Entropy::kCompute : models::Entropy::kSkip);
  std::vector<torch::Tensor> r = {head.log_probs};
  if (op.entropy) r.push_back(head.entropy);
  if (op.top_k > 0) {  // a GKD teacher: the same states' k most likely tokens
    const int64_t t = hidden.size(1), a = mb.action_len;
    auto top =
        model.head_top_k(at_temperature(hidden.narrow(1, t - 1 - a, a), temperature), op.top_k);
    r.push_back(top.log_probs);
    r.push_back(top.ids);
    r.push_back(top.rest);
  }
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
// push_weights (rollout/worker_ops.h): the actor's side of the weight sync; rollout rank r
// is rank r + 1 of the sync group, actor rank 0 its rank 0 (the rollout merges a LoRA
// actor's adapters into its base).
Message push_weights(ModelRole& role, const ops::PushWeights& req, const WorkerIdentity& self) {
  if (!role.trainer) throw RuntimeError("push_weights: this worker's role is not trained");
  if (self.rank == 0 && (!role.sync_group || role.sync_store != req.store_path)) {
    role.sync_group.reset();
    role.sync_store = req.store_path;
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
  if (!req.again) ++role.weight_version;
  auto stats = rollout::send_weights(*source, self.rank == 0 ? role.sync_group.get() : nullptr,
                                     role.weight_version, options);
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
    if (op.top_k > 0) {
      reply.add("top_log_probs", out[next++].contiguous());
      reply.add("top_ids", out[next++].contiguous());
      reply.add("top_rest", out[next++].contiguous());
    }
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
  add_train_operations(registry, role);
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
