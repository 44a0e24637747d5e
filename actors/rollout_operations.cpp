// load_model, generate, sync_weights on a rollout worker. See rollout_operations.h.
#include "actors/rollout_operations.h"

#include <ATen/ATen.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "actors/device.h"
#include "actors/worker.h"
#include "core/errors.h"
#include "core/timing.h"
#include "engine/host_offload.h"
#include "envs/environment.h"
#include "models/config.h"
#include "models/pretrained.h"
#include "pyhost/python_process.h"
#include "rollout/generator.h"
#include "rollout/trajectory.h"
#include "rollout/weight_sync.h"
#include "rollout/worker_ops.h"
#include "tokenizer/prompt_format.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_config.h"
#include "transport/collective_group.h"
#include "transport/worker_ops.h"

namespace rlhf {
namespace {

struct RolloutState {
  // One operation at a time touches the model; a sync_weights served in flight inside a
  // generate call (BetweenDecodeSteps) takes it again on the same thread.
  std::recursive_mutex mutex;
  std::unique_ptr<rollout::Generator> generator;
  std::unique_ptr<transport::CollectiveGroup> sync_group;
  std::string sync_store;      // where sync_group met
  engine::HostOffload asleep;  // the model's weights while in host memory (sleep)
  rollout::LoraMerge lora;     // the base copies when a LoRA actor sends only its adapters
  // Multi-turn rollouts (load_model's "env"): the environment (TP rank 0 only), the tokenizer
  // and chat template that render its turns, and the turns a trajectory may take.
  bool multi_turn = false;
  int64_t max_turns = 1;
  std::unique_ptr<envs::Environment> env;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;
  std::unique_ptr<tokenizer::PromptFormatter> formatter;
};

// load_model's env, max_turns, tokenizer (the model directory whose tokenizer and
// tokenizer_config.json render the environment's turns) and chat_template. Without an
// environment (env.enabled() false) the rollout is single-turn.
void load_environment(RolloutState& state, const ops::LoadModel& a,
                      const models::TensorParallel& tp) {
  state.multi_turn = a.env.enabled();
  state.max_turns = a.max_turns;
  state.env.reset();
  if (!state.multi_turn) {
    if (state.max_turns > 1)
      throw InputError("load_model: max_turns " + std::to_string(state.max_turns) +
                       " needs an environment (\"env\") to answer the turns");
    return;
  }
  const std::string& dir = a.tokenizer;
  state.tokenizer = tokenizer::load_tokenizer(dir);
  tokenizer::PromptFormatConfig fc;
  fc.apply_chat_template = true;
  fc.chat_template = tokenizer::parse_chat_template(a.chat_template);
  state.formatter =
      std::make_unique<tokenizer::PromptFormatter>(fc, tokenizer::read_tokenizer_config(dir));
  state.formatter->environment_turn("tool", "");  // throws now for a template it cannot render
  // Rank 0 of a TP engine steps the environment and broadcasts its answers.
  if (tp.rank == 0) state.env = envs::make_environment(a.env);
}

rollout::Generator& loaded(RolloutState& state, const std::string& op) {
  if (!state.generator)
    throw InputError(op + ": no model on this rollout worker; call load_model first");
  return *state.generator;
}

// A generate or sync on offloaded weights would read freed memory: the driver wakes first.
rollout::Generator& awake(RolloutState& state, const std::string& op) {
  auto& generator = loaded(state, op);
  if (state.asleep.offloaded())
    throw RuntimeError(op +
                       ": the rollout's weights are in host memory (sleep); call wake_up "
                       "first");
  return generator;
}

// The allocator's bytes now, beside an offload's figures (cpu workers: 0).
CudaMemory device_bytes(const WorkerIdentity& self) {
  return on_cuda(self) ? cuda_memory() : CudaMemory{};
}

// sleep (vLLM's sleep mode, level 1): the model's parameters and buffers go to host memory
// (pinned on a GPU) and the allocator's cached blocks back to the driver, so a colocated
// trainer has the GPU. Asleep already: nothing moves.
Message sleep(RolloutState& state, const WorkerIdentity& self) {
  auto& model = loaded(state, "sleep").model();
  const auto start = std::chrono::steady_clock::now();
  int64_t moved = 0;
  if (!state.asleep.offloaded()) {
    // The KV pool and decode graphs kept between calls: the pool's memory goes back too, and
    // the graphs read the weights' old addresses (wake_up allocates new ones).
    state.generator->release_paged_engine();
    std::vector<torch::Tensor> tensors = model.parameters(true);
    for (const auto& b : model.buffers(true)) tensors.push_back(b);
    moved = state.asleep.offload(tensors);
  }
  release_cached_device_memory(self);
  const CudaMemory m = device_bytes(self);
  return reply_message(ops::OffloadReply{moved, seconds_since(start), m.allocated, m.reserved});
}

// wake_up: the weights back where they were, bit for bit.
Message wake_up(RolloutState& state, const WorkerIdentity& self) {
  loaded(state, "wake_up");
  const auto start = std::chrono::steady_clock::now();
  const int64_t moved = state.asleep.restore();
  const CudaMemory m = device_bytes(self);
  return reply_message(ops::RestoreReply{moved, seconds_since(start), m.allocated, m.reserved});
}

// Tensor parallelism (tensor_parallel_size t > 1, tp_store_path): rollout rank k is TP rank
// k % t of engine k / t, whose group meets at tp_store_path + "_engine<k / t>" (NCCL between
// GPUs, Gloo on cpu nodes).
models::TensorParallel join_tensor_parallel(const ops::LoadModel& a, const WorkerIdentity& self) {
  models::TensorParallel tp;
  tp.size = a.tensor_parallel_size;
  if (tp.size < 1 || self.world_size % tp.size != 0)
    throw InputError("load_model: tensor_parallel_size " + std::to_string(tp.size) +
                     " must divide the rollout's " + std::to_string(self.world_size) + " workers");
  if (tp.size == 1) return tp;
  tp.rank = self.rank % tp.size;
  transport::CollectiveConfig cc;
  cc.rank = tp.rank;
  cc.size = tp.size;
  cc.store_path = a.tp_store_path + "_engine" + std::to_string(self.rank / tp.size);
  cc.backend =
      on_cuda(self) ? transport::CollectiveBackend::kNccl : transport::CollectiveBackend::kGloo;
  tp.group = transport::make_collective_group(cc);
  return tp;
}

// load_model (rollout/worker_ops.h): a TP rank loads only its slices; the engine's settings
// come whole (a field missing or unknown is an error naming it, never a default of this side's).
Message load_model(RolloutState& state, const ops::LoadModel& a, const WorkerIdentity& self) {
  const torch::Device device = worker_device(self);
  check_dtype_on_device(self, a.dtype);
  models::TensorParallel tp = join_tensor_parallel(a, self);
  std::shared_ptr<models::CausalLM> model;
  if (!a.model.empty()) {
    models::LoadOptions load;
    load.device = device;
    if (!a.dtype.empty()) load.dtype = models::dtype_from_name(a.dtype);
    load.head = models::HeadKind::kLanguageModel;
    model = models::load_pretrained(a.model, load, tp);
  } else if (!a.preset.empty()) {
    // Presets are small test models: built whole, then (TP) each rank keeps its slices.
    model = std::make_shared<models::CausalLM>(models::preset_config(a.preset));
    model->init_weights(a.seed);
    if (!a.dtype.empty()) model->to(models::dtype_from_name(a.dtype));
    if (tp.enabled()) {
      auto whole = model;
      model =
          std::make_shared<models::CausalLM>(whole->config(), models::Materialize::kDeferred, tp);
      models::load_whole(*model, models::TensorsSource(whole->state_tensors()), whole->dtype(),
                         device);
    } else {
      model->to(device);
    }
  } else {
    throw InputError("load_model: expected \"model\" (a directory) or \"preset\"");
  }
  // q/k/v and gate/up as one GEMM each (issue 32.2); weight syncs, LoRA adapters and exports
  // still see HF tensors. fused_projections false keeps the separate maps.
  if (a.fused_projections) model->fuse_projections();
  load_environment(state, a, model->tensor_parallel());
  state.generator = std::make_unique<rollout::Generator>(model, a.generation);
  return reply_message(ops::LoadModelReply{model->config().num_parameters(), 0, tp.size});
}

// The request's trajectories over the loaded environment: `rows` holds every prompt row of
// the whole request (its JSON: label and columns), indexed by prompt_index.
std::unique_ptr<rollout::EnvironmentTurns> environment_turns(RolloutState& state,
                                                             const Message& request,
                                                             const nlohmann::json& all,
                                                             int64_t first_prompt, int64_t n) {
  const int64_t B = request.tensor("prompt_ids").size(0);
  std::vector<nlohmann::json> rows;
  for (int64_t i = 0; i < B; ++i) {
    const auto at = static_cast<size_t>(first_prompt + i);
    rows.push_back(at < all.size() ? all[at] : nlohmann::json::object());
  }
  auto& model = state.generator->model();
  return std::make_unique<rollout::EnvironmentTurns>(
      state.env.get(), *state.tokenizer, *state.formatter, model.tensor_parallel().group.get(),
      model.device(), first_prompt * n, B * n, n, rows);
}

// Multi-turn figures per row: tensors "env_rewards" [N] FP32 (summed), "turns",
// "tool_calls", "tool_errors", "env_timed_out" [N] int64, "env_seconds" [N] FP32; args
// "conversations" ([N] lists of {"role", "content"} after the prompt), "env_stall_seconds",
// "extend_seconds", "extended_tokens".
void add_trajectories(Message& reply, ops::GenerateReply& figures,
                      const rollout::GenerationOutput& out, const rollout::TrajectoryStats& stats) {
  reply.add("env_rewards", torch::tensor(stats.reward, torch::kFloat64).to(torch::kFloat32));
  reply.add("turns", out.turns);
  reply.add("tool_calls", torch::tensor(stats.tool_calls, torch::kInt64));
  reply.add("tool_errors", torch::tensor(stats.tool_errors, torch::kInt64));
  reply.add("env_timed_out", torch::tensor(stats.timed_out, torch::kInt64));
  reply.add("env_seconds", torch::tensor(stats.env_seconds, torch::kFloat64).to(torch::kFloat32));
  figures.conversations = stats.turns;
  figures.env_stall_seconds = out.timings.env_stall_seconds;
  figures.extend_seconds = out.timings.extend_seconds;
  figures.extended_tokens = out.timings.extended_tokens;
}

// Between two decode steps of a generate call, the requests that should not wait for its end
// (worker.h serve_in_flight): the memory queries of a step's metrics record ("info") and,
// with in-flight weight updates (Generate::in_flight_updates), every sync_weights that came:
// received in place (the KV cache and decode graphs stay valid) by the registered handler,
// which takes the state's lock re-entrantly on this thread.
class BetweenDecodeSteps {
 public:
  BetweenDecodeSteps(rollout::Generator& generator, bool in_flight_updates)
      : generator_(generator) {
    if (in_flight_updates && generator.model().tensor_parallel().enabled())
      throw InputError(
          "generate: in-flight weight updates (rollout.partial_rollout) are not supported with "
          "tensor parallelism");
    ops_ = {ops::Info::kName};
    if (in_flight_updates) ops_.push_back(ops::SyncWeights::kName);
    generator.set_between_steps([this] {
      serve_in_flight(ops_);
      return generator_.weight_version();
    });
  }
  ~BetweenDecodeSteps() { generator_.set_between_steps({}); }
  BetweenDecodeSteps(const BetweenDecodeSteps&) = delete;
  BetweenDecodeSteps& operator=(const BetweenDecodeSteps&) = delete;

 private:
  rollout::Generator& generator_;
  std::vector<std::string> ops_;
};

// The tensors of a generate reply (or of one streamed part): responses padded to the
// engine's max_new_tokens so micro batches and parts concatenate.
void add_outputs(Message& m, const rollout::GenerationOutput& out, const rollout::Generator& g) {
  const auto padded =
      rollout::concat_outputs({out}, g.config().max_new_tokens, g.config().pad_token_id);
  m.add("sequences", padded.sequences);
  m.add("attention_mask", padded.attention_mask);
  m.add("action_mask", padded.action_mask);
  m.add("log_probs", padded.log_probs);
  m.add("response_lengths", padded.response_lengths);
  m.add("weight_versions", padded.token_versions);
  if (padded.routes.defined()) m.add("routes", padded.routes);
}

// Streaming (Generate::stream_groups): each finished prompt group goes out as a partial reply
// with its prompts' positions in the whole request.
class StreamedGroups {
 public:
  StreamedGroups(rollout::Generator& generator, bool on, int64_t first_prompt)
      : generator_(generator) {
    if (!on) return;
    generator.set_on_groups_done(
        [this, first_prompt](rollout::GenerationOutput part, const std::vector<int64_t>& prompts) {
          Message m;
          add_outputs(m, part, generator_);
          m.add("prompt_index", torch::tensor(prompts, torch::kInt64) + first_prompt);
          m.args = nlohmann::json::object();
          send_partial(std::move(m));
        });
  }
  ~StreamedGroups() { generator_.set_on_groups_done({}); }
  StreamedGroups(const StreamedGroups&) = delete;
  StreamedGroups& operator=(const StreamedGroups&) = delete;

 private:
  rollout::Generator& generator_;
};

// generate (rollout/worker_ops.h). "prompt_index" is optional here (tests send one micro
// batch without it). n_samples_per_prompt is this call's (held-out evaluation samples its own).
Message generate(RolloutState& state, const ops::Generate& a, const Message& request) {
  auto& generator = awake(state, "generate");
  const BetweenDecodeSteps between(generator, a.in_flight_updates);
  const rollout::SamplingParams& params = a.sampling;
  int64_t first_prompt = 0;
  if (request.has_tensor("prompt_index")) {
    const auto index = request.tensor("prompt_index").to(torch::kInt64);
    const int64_t B = request.tensor("prompt_ids").size(0);
    if (index.dim() != 1 || index.size(0) != B || B == 0 ||
        !torch::equal(index, torch::arange(B, torch::kInt64) + index[0].item<int64_t>()))
      throw InputError("generate: prompt_index must be [B] consecutive prompt positions");
    first_prompt = index[0].item<int64_t>();
  }
  const int64_t configured_n = generator.config().n_samples_per_prompt;
  const int64_t n = a.n_samples_per_prompt;
  generator.set_samples_per_prompt(n);
  generator.set_record_routes(a.record_routes);
  if (a.stream_groups && state.multi_turn)
    throw InputError("generate: stream_groups is for single-turn rollouts");
  const StreamedGroups streamed(generator, a.stream_groups, first_prompt);
  rollout::GenerationOutput out;
  std::unique_ptr<rollout::EnvironmentTurns> turns;
  try {
    if (state.multi_turn) turns = environment_turns(state, request, a.rows, first_prompt, n);
    out = generator.generate(request.tensor("prompt_ids"), request.tensor("prompt_mask"), params,
                             first_prompt, turns.get(), state.max_turns);
  } catch (...) {
    generator.set_samples_per_prompt(configured_n);
    throw;
  }
  generator.set_samples_per_prompt(configured_n);
  ops::GenerateReply figures;
  figures.weight_version = out.weight_version;
  figures.prompt_length = out.prompt_length;
  figures.preempted = out.timings.preempted;
  figures.kv_peak_bytes = out.timings.kv_peak_bytes;
  Message reply;
  if (!a.stream_groups) add_outputs(reply, out, generator);  // streamed: every row went ahead
  if (turns) add_trajectories(reply, figures, out, turns->stats());
  reply.args = nlohmann::json(figures);
  return reply;
}

// sync_weights (rollout/worker_ops.h): the first call joins the group; every call receives
// one sync (bucket size and path as the actor's header says; LoRA adapters are merged into
// the base this worker loaded, see rollout::LoraMerge). Gloo stages CUDA tensors through
// the host, or only signals when the buckets come through CUDA IPC.
Message sync_weights(RolloutState& state, const ops::SyncWeights& request,
                     const WorkerIdentity& self) {
  auto& generator = awake(state, "sync_weights");
  if (!state.sync_group || state.sync_store != request.store_path) {
    state.sync_group.reset();
    transport::CollectiveConfig config;
    config.store_path = request.store_path;
    config.rank = request.alone ? 1 : self.rank + 1;
    config.size = request.alone ? 2 : self.world_size + 1;
    config.backend = transport::collective_backend(request.backend);
    state.sync_group = transport::make_collective_group(config);
    state.sync_store = request.store_path;
  }
  const auto stats = rollout::receive_weights(generator.model(), *state.sync_group, &state.lora);
  generator.set_weight_version(stats.version);
  return reply_message(ops::sync_reply(stats));
}

}  // namespace

void add_rollout_operations(OperationRegistry& registry) {
  auto state = std::make_shared<RolloutState>();
  // One operation at a time touches the model.
  registry.add<ops::LoadModel>(
      [state](const ops::LoadModel& request, const Message&, const WorkerIdentity& self) {
        std::lock_guard<std::recursive_mutex> lock(state->mutex);
        return load_model(*state, request, self);
      });
  registry.add<ops::Generate>([state](const ops::Generate& request, const Message& message,
                                      const WorkerIdentity& self) {
    std::lock_guard<std::recursive_mutex> lock(state->mutex);
    try {
      return generate(*state, request, message);
    } catch (const pyhost::WorkerDied& e) {
      // The environment's interpreter died with its episodes: this worker ends, as if it
      // had died itself, so the job starts it again with a fresh environment and runs the
      // micro batch again (fault.max_restarts), or stops naming it.
      std::cerr << "[rollout " << self.rank << "] " << e.what()
                << "; ending this worker (exit code " << kEnvironmentLostExit << ")" << std::endl;
      std::_Exit(kEnvironmentLostExit);
    }
  });
  registry.add<ops::SyncWeights>(
      [state](const ops::SyncWeights& request, const Message&, const WorkerIdentity& self) {
        std::lock_guard<std::recursive_mutex> lock(state->mutex);
        return sync_weights(*state, request, self);
      });
  registry.add<ops::Sleep>([state](const ops::Sleep&, const Message&, const WorkerIdentity& self) {
    std::lock_guard<std::recursive_mutex> lock(state->mutex);
    return sleep(*state, self);
  });
  registry.add<ops::WakeUp>(
      [state](const ops::WakeUp&, const Message&, const WorkerIdentity& self) {
        std::lock_guard<std::recursive_mutex> lock(state->mutex);
        return wake_up(*state, self);
      });
}

}  // namespace rlhf
