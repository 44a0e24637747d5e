// load_model, generate, sync_weights on a rollout worker. See rollout_operations.h.
#include "actors/rollout_operations.h"

#include <ATen/ATen.h>

#include <chrono>
#include <memory>
#include <mutex>

#include "actors/device.h"
#include "core/errors.h"
#include "core/timing.h"
#include "engine/host_offload.h"
#include "envs/environment.h"
#include "models/config.h"
#include "models/pretrained.h"
#include "rollout/generator.h"
#include "rollout/trajectory.h"
#include "rollout/weight_sync.h"
#include "tokenizer/prompt_format.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_config.h"
#include "transport/collective_group.h"

namespace rlhf {
namespace {

struct RolloutState {
  std::mutex mutex;  // one operation at a time touches the model
  std::unique_ptr<rollout::Generator> generator;
  std::unique_ptr<transport::CollectiveGroup> sync_group;
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

// load_model's "env" object (the job spec's env.* keys) as make_environment's config.
envs::EnvironmentConfig environment_config(const nlohmann::json& e) {
  envs::EnvironmentConfig c;
  c.builtin = e.value("builtin", c.builtin);
  c.python = e.value("python", c.python);
  c.url = e.value("url", c.url);
  c.timeout_s = e.value("timeout_s", c.timeout_s);
  c.python_workers = e.value("python_workers", c.python_workers);
  c.python_interpreter = e.value("python_interpreter", c.python_interpreter);
  if (e.contains("options")) c.options = e.at("options");
  return c;
}

// Args "env" (an object: builtin / python / url, timeout_s, python_workers,
// python_interpreter, options), "max_turns", "tokenizer" (the model directory whose
// tokenizer and tokenizer_config.json render the environment's turns) and "chat_template"
// (data.chat_template). Without "env" the rollout is single-turn.
void load_environment(RolloutState& state, const nlohmann::json& a,
                      const models::TensorParallel& tp) {
  state.multi_turn = a.contains("env") && !a.at("env").is_null();
  state.max_turns = a.value("max_turns", int64_t{1});
  state.env.reset();
  if (!state.multi_turn) {
    if (state.max_turns > 1)
      throw InputError("load_model: max_turns " + std::to_string(state.max_turns) +
                       " needs an environment (\"env\") to answer the turns");
    return;
  }
  const std::string dir = a.at("tokenizer").get<std::string>();
  state.tokenizer = tokenizer::load_tokenizer(dir);
  tokenizer::PromptFormatConfig fc;
  fc.apply_chat_template = true;
  fc.chat_template = tokenizer::parse_chat_template(a.value("chat_template", std::string("auto")));
  state.formatter =
      std::make_unique<tokenizer::PromptFormatter>(fc, tokenizer::read_tokenizer_config(dir));
  state.formatter->environment_turn("tool", "");  // throws now for a template it cannot render
  // Rank 0 of a TP engine steps the environment and broadcasts its answers.
  if (tp.rank == 0) state.env = envs::make_environment(environment_config(a.at("env")));
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

// The allocator's bytes now, beside an offload's figures (cpu workers: none).
void add_device_bytes(nlohmann::json& args, const WorkerIdentity& self) {
  if (!on_cuda(self)) return;
  const CudaMemory m = cuda_memory();
  args["cuda_allocated_bytes"] = m.allocated;
  args["cuda_reserved_bytes"] = m.reserved;
}

// sleep (vLLM's sleep mode, level 1): the model's parameters and buffers go to host memory
// (pinned on a GPU) and the allocator's cached blocks back to the driver, so a colocated
// trainer has the GPU. Replies "offloaded_bytes", "seconds" and, on a GPU, the allocator's
// "cuda_allocated_bytes" / "cuda_reserved_bytes" after it. Asleep already: nothing moves.
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
  Message reply;
  reply.args = {{"offloaded_bytes", moved}, {"seconds", seconds_since(start)}};
  add_device_bytes(reply.args, self);
  return reply;
}

// wake_up: the weights back where they were, bit for bit. Replies "restored_bytes",
// "seconds" and the allocator's bytes after it.
Message wake_up(RolloutState& state, const WorkerIdentity& self) {
  loaded(state, "wake_up");
  const auto start = std::chrono::steady_clock::now();
  const int64_t moved = state.asleep.restore();
  Message reply;
  reply.args = {{"restored_bytes", moved}, {"seconds", seconds_since(start)}};
  add_device_bytes(reply.args, self);
  return reply;
}

// Tensor parallelism (args "tensor_parallel_size" t > 1, "tp_store_path"): rollout rank k is
// TP rank k % t of engine k / t, whose group meets at tp_store_path + "_engine<k / t>" (NCCL
// between GPUs, Gloo on cpu nodes).
models::TensorParallel join_tensor_parallel(const nlohmann::json& a, const WorkerIdentity& self) {
  models::TensorParallel tp;
  tp.size = a.value("tensor_parallel_size", 1);
  if (tp.size < 1 || self.world_size % tp.size != 0)
    throw InputError("load_model: tensor_parallel_size " + std::to_string(tp.size) +
                     " must divide the rollout's " + std::to_string(self.world_size) + " workers");
  if (tp.size == 1) return tp;
  tp.rank = self.rank % tp.size;
  transport::CollectiveConfig cc;
  cc.rank = tp.rank;
  cc.size = tp.size;
  cc.store_path =
      a.at("tp_store_path").get<std::string>() + "_engine" + std::to_string(self.rank / tp.size);
  cc.backend =
      on_cuda(self) ? transport::CollectiveBackend::kNccl : transport::CollectiveBackend::kGloo;
  tp.group = transport::make_collective_group(cc);
  return tp;
}

// args: "model" (HF directory) or "preset" + "seed"; "dtype"; "tensor_parallel_size" and
// "tp_store_path" (see join_tensor_parallel; a TP rank loads only its slices); "generation",
// the engine's settings whole (rollout::to_json of a GenerationConfig, every field required);
// "fused_projections" (default true: CausalLM::fuse_projections).
Message load_model(RolloutState& state, const Message& request, const WorkerIdentity& self) {
  const auto& a = request.args;
  const torch::Device device = worker_device(self);
  models::TensorParallel tp = join_tensor_parallel(a, self);
  std::shared_ptr<models::CausalLM> model;
  if (a.contains("model")) {
    models::LoadOptions load;
    load.device = device;
    if (a.contains("dtype")) load.dtype = models::dtype_from_name(a.at("dtype").get<std::string>());
    load.head = models::HeadKind::kLanguageModel;
    model = models::load_pretrained(a.at("model").get<std::string>(), load, tp);
  } else if (a.contains("preset")) {
    // Presets are small test models: built whole, then (TP) each rank keeps its slices.
    model = std::make_shared<models::CausalLM>(
        models::preset_config(a.at("preset").get<std::string>()));
    model->init_weights(a.value("seed", uint64_t{0}));
    if (a.contains("dtype")) model->to(models::dtype_from_name(a.at("dtype").get<std::string>()));
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
    throw InputError("load_model: expected arg \"model\" (a directory) or \"preset\"");
  }
  // q/k/v and gate/up as one GEMM each (issue 32.2); weight syncs, LoRA adapters and exports
  // still see HF tensors. "fused_projections": false keeps the separate maps.
  if (a.value("fused_projections", true)) model->fuse_projections();
  // The engine travels whole (rollout/generation_config.h): a field missing or unknown is an
  // error naming it, never a default of this side's.
  if (!a.contains("generation"))
    throw RuntimeError("load_model: missing field \"generation\" (the engine's settings)");
  const rollout::GenerationConfig config =
      rollout::generation_config_from_json(a.at("generation"), "load_model \"generation\"");
  load_environment(state, a, model->tensor_parallel());
  state.generator = std::make_unique<rollout::Generator>(model, config);
  Message reply;
  reply.args = {{"parameters", model->config().num_parameters()},
                {"weight_version", 0},
                {"tensor_parallel_size", tp.size}};
  return reply;
}

// The request's trajectories over the loaded environment: arg "rows" holds every prompt row of
// the whole request (its JSON: label and columns), indexed by prompt_index.
std::unique_ptr<rollout::EnvironmentTurns> environment_turns(RolloutState& state,
                                                             const Message& request,
                                                             int64_t first_prompt, int64_t n) {
  const int64_t B = request.tensor("prompt_ids").size(0);
  const nlohmann::json all = request.args.value("rows", nlohmann::json::array());
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
void add_trajectories(Message& reply, const rollout::GenerationOutput& out,
                      const rollout::TrajectoryStats& stats) {
  reply.add("env_rewards", torch::tensor(stats.reward, torch::kFloat64).to(torch::kFloat32));
  reply.add("turns", out.turns);
  reply.add("tool_calls", torch::tensor(stats.tool_calls, torch::kInt64));
  reply.add("tool_errors", torch::tensor(stats.tool_errors, torch::kInt64));
  reply.add("env_timed_out", torch::tensor(stats.timed_out, torch::kInt64));
  reply.add("env_seconds", torch::tensor(stats.env_seconds, torch::kFloat64).to(torch::kFloat32));
  reply.args["conversations"] = stats.turns;
  reply.args["env_stall_seconds"] = out.timings.env_stall_seconds;
  reply.args["extend_seconds"] = out.timings.extend_seconds;
  reply.args["extended_tokens"] = out.timings.extended_tokens;
}

// Tensors "prompt_ids", "prompt_mask" [B, P] int64 and optional "prompt_index" [B] (the
// prompts' positions in the whole request, consecutive: seeds then follow the prompt, not
// the micro batch). Args "temperature", "top_k", "top_p", "seed", optional
// "n_samples_per_prompt" (this call only; default: load_model's). Replies with
// GenerationOutput's tensors, responses padded to max_new_tokens columns so a scatter's
// micro batches concatenate, and args "weight_version", "prompt_length". With an environment
// (load_model's "env"), arg "rows" and the multi-turn figures (add_trajectories).
Message generate(RolloutState& state, const Message& request) {
  auto& generator = awake(state, "generate");
  rollout::SamplingParams params;
  const auto& a = request.args;
  params.temperature = a.value("temperature", params.temperature);
  params.top_k = a.value("top_k", params.top_k);
  params.top_p = a.value("top_p", params.top_p);
  params.seed = a.value("seed", params.seed);
  int64_t first_prompt = 0;
  if (request.has_tensor("prompt_index")) {
    const auto index = request.tensor("prompt_index").to(torch::kInt64);
    const int64_t B = request.tensor("prompt_ids").size(0);
    if (index.dim() != 1 || index.size(0) != B || B == 0 ||
        !torch::equal(index, torch::arange(B, torch::kInt64) + index[0].item<int64_t>()))
      throw InputError("generate: prompt_index must be [B] consecutive prompt positions");
    first_prompt = index[0].item<int64_t>();
  }
  // "n_samples_per_prompt" overrides the engine's n for this call only (held-out evaluation).
  const int64_t configured_n = generator.config().n_samples_per_prompt;
  const int64_t n = a.value("n_samples_per_prompt", configured_n);
  generator.set_samples_per_prompt(n);
  rollout::GenerationOutput out;
  std::unique_ptr<rollout::EnvironmentTurns> turns;
  try {
    if (state.multi_turn) turns = environment_turns(state, request, first_prompt, n);
    out = generator.generate(request.tensor("prompt_ids"), request.tensor("prompt_mask"), params,
                             first_prompt, turns.get(), state.max_turns);
  } catch (...) {
    generator.set_samples_per_prompt(configured_n);
    throw;
  }
  generator.set_samples_per_prompt(configured_n);
  const auto padded = rollout::concat_outputs({out}, generator.config().max_new_tokens,
                                              generator.config().pad_token_id);
  Message reply;
  reply.add("sequences", padded.sequences);
  reply.add("attention_mask", padded.attention_mask);
  reply.add("action_mask", padded.action_mask);
  reply.add("log_probs", padded.log_probs);
  reply.add("response_lengths", padded.response_lengths);
  reply.args = {{"weight_version", out.weight_version},
                {"prompt_length", out.prompt_length},
                {"preempted", out.timings.preempted},
                {"kv_peak_bytes", out.timings.kv_peak_bytes}};
  if (turns) add_trajectories(reply, out, turns->stats());
  return reply;
}

// Args "store_path" (the group's FileStore rendezvous), "backend" ("nccl" when the actor's
// rank 0 and every rollout rank have a GPU of their own, else "gloo", which stages CUDA
// tensors through the host, or only signals when the buckets come through CUDA IPC),
// optional "sync_rank" / "sync_size" (default: role rank + 1 of role size + 1; the actor is
// rank 0). The first call joins the group; every call receives one sync (bucket size and
// path as the actor's header says; LoRA adapters are merged into the base this worker
// loaded, see rollout::LoraMerge) and replies WeightSyncStats::to_json().
Message sync_weights(RolloutState& state, const Message& request, const WorkerIdentity& self) {
  auto& generator = awake(state, "sync_weights");
  if (!state.sync_group) {
    transport::CollectiveConfig config;
    config.store_path = request.args.at("store_path").get<std::string>();
    config.rank = request.args.value("sync_rank", self.rank + 1);
    config.size = request.args.value("sync_size", self.world_size + 1);
    config.backend =
        transport::collective_backend(request.args.value("backend", std::string("gloo")));
    state.sync_group = transport::make_collective_group(config);
  }
  const auto stats = rollout::receive_weights(generator.model(), *state.sync_group, &state.lora);
  generator.set_weight_version(stats.version);
  Message reply;
  reply.args = stats.to_json();
  return reply;
}

}  // namespace

void add_rollout_operations(OperationRegistry& registry) {
  auto state = std::make_shared<RolloutState>();
  registry.add("load_model", [state](const Message& request, const WorkerIdentity& self) {
    std::lock_guard<std::mutex> lock(state->mutex);
    return load_model(*state, request, self);
  });
  registry.add("generate", [state](const Message& request, const WorkerIdentity&) {
    std::lock_guard<std::mutex> lock(state->mutex);
    return generate(*state, request);
  });
  registry.add("sync_weights", [state](const Message& request, const WorkerIdentity& self) {
    std::lock_guard<std::mutex> lock(state->mutex);
    return sync_weights(*state, request, self);
  });
  registry.add("sleep", [state](const Message&, const WorkerIdentity& self) {
    std::lock_guard<std::mutex> lock(state->mutex);
    return sleep(*state, self);
  });
  registry.add("wake_up", [state](const Message&, const WorkerIdentity& self) {
    std::lock_guard<std::mutex> lock(state->mutex);
    return wake_up(*state, self);
  });
}

}  // namespace rlhf
