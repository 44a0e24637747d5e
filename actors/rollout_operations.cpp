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
#include "models/config.h"
#include "models/pretrained.h"
#include "rollout/generator.h"
#include "rollout/weight_sync.h"
#include "transport/collective_group.h"

namespace rlhf {
namespace {

struct RolloutState {
  std::mutex mutex;  // one operation at a time touches the model
  std::unique_ptr<rollout::Generator> generator;
  std::unique_ptr<transport::CollectiveGroup> sync_group;
  engine::HostOffload asleep;  // the model's weights while in host memory (sleep)
};

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
// "tp_store_path" (see join_tensor_parallel; a TP rank loads only its slices); the
// generation settings "max_new_tokens", "n_samples_per_prompt", "micro_batch_size",
// "stop_token_ids", "pad_token_id" (defaults: GenerationConfig's; stop tokens default to the
// model's EOS); "fused_projections" (default true: CausalLM::fuse_projections).
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
  rollout::GenerationConfig config;
  config.max_new_tokens = a.value("max_new_tokens", config.max_new_tokens);
  config.n_samples_per_prompt = a.value("n_samples_per_prompt", config.n_samples_per_prompt);
  config.micro_batch_size = a.value("micro_batch_size", config.micro_batch_size);
  config.kv_cache_bytes =
      static_cast<int64_t>(a.value("kv_cache_memory_gb", 0.0) * static_cast<double>(1ll << 30));
  config.kv_block_size = a.value("kv_block_size", config.kv_block_size);
  config.max_num_seqs = a.value("max_num_seqs", config.max_num_seqs);
  if (a.value("enforce_eager", false)) config.decode_steps = rollout::DecodeSteps::kEager;
  config.pad_token_id = a.value("pad_token_id", config.pad_token_id);
  if (a.contains("stop_token_ids"))
    config.stop_token_ids = a.at("stop_token_ids").get<std::vector<int64_t>>();
  else if (model->config().eos_token_id >= 0)
    config.stop_token_ids = {model->config().eos_token_id};
  state.generator = std::make_unique<rollout::Generator>(model, config);
  Message reply;
  reply.args = {{"parameters", model->config().num_parameters()},
                {"weight_version", 0},
                {"tensor_parallel_size", tp.size}};
  return reply;
}

// Tensors "prompt_ids", "prompt_mask" [B, P] int64 and optional "prompt_index" [B] (the
// prompts' positions in the whole request, consecutive: seeds then follow the prompt, not
// the micro batch). Args "temperature", "top_k", "top_p", "seed", optional
// "n_samples_per_prompt" (this call only; default: load_model's). Replies with
// GenerationOutput's tensors, responses padded to max_new_tokens columns so a scatter's
// micro batches concatenate, and args "weight_version", "prompt_length".
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
  generator.set_samples_per_prompt(a.value("n_samples_per_prompt", configured_n));
  rollout::GenerationOutput out;
  try {
    out = generator.generate(request.tensor("prompt_ids"), request.tensor("prompt_mask"), params,
                             first_prompt);
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
  return reply;
}

// Args "store_path" (the group's FileStore rendezvous), "backend" ("nccl" when the actor's
// rank 0 and every rollout rank have a GPU of their own, else "gloo", which stages CUDA
// tensors through the host, or only signals when the buckets come through CUDA IPC),
// optional "sync_rank" / "sync_size" (default: role rank + 1 of role size + 1; the actor is
// rank 0). The first call joins the group; every call receives one sync (bucket size and
// path as the actor's header says) and replies WeightSyncStats::to_json().
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
  const auto stats = rollout::receive_weights(generator.model(), *state.sync_group);
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
