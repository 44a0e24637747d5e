// The rollout worker's operations and the actor's side of the weight sync, as typed
// requests and replies (transport/operation.h); the worker side is
// actors/rollout_operations.cpp and actors/model_operations.cpp (push_weights).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "engine/worker_ops.h"
#include "envs/environment.h"
#include "rollout/generation_config.h"
#include "rollout/sampling.h"
#include "rollout/weight_sync.h"
#include "transport/operation.h"

namespace rlhf::rollout {
RLHF_WIRE_STRUCT(SamplingParams, "sampling", temperature, top_k, top_p, seed)
}  // namespace rlhf::rollout

namespace rlhf::ops {

struct LoadModelReply {
  int64_t parameters = 0;
  int64_t weight_version = 0;
  int tensor_parallel_size = 1;
};
RLHF_WIRE_STRUCT(LoadModelReply, "load_model reply", parameters, weight_version,
                 tensor_parallel_size)

// Loads the engine's model: `model` (an HF directory) or, when it is "", `preset` with
// `seed` (a small test model); in `dtype` ("" keeps the checkpoint's). With
// tensor_parallel_size t > 1, rollout rank k is TP rank k % t of engine k / t, whose group
// meets at tp_store_path + "_engine<k / t>", and loads only its slices. `generation` is the
// engine whole. `fused_projections`: q/k/v and gate/up as one GEMM each. With an `env`
// (env.enabled()), multi-turn rollouts of at most max_turns model turns, rendered with the
// tokenizer of the model directory `tokenizer` and `chat_template` (data.chat_template).
struct LoadModel {
  static constexpr const char* kName = "load_model";
  using Reply = LoadModelReply;
  std::string model;
  std::string preset;
  uint64_t seed = 0;
  std::string dtype;
  int tensor_parallel_size = 1;
  std::string tp_store_path;
  bool fused_projections = true;
  rollout::GenerationConfig generation;
  envs::EnvironmentConfig env;
  int64_t max_turns = 1;
  std::string tokenizer;
  std::string chat_template = "auto";
};
RLHF_WIRE_STRUCT(LoadModel, "load_model", model, preset, seed, dtype, tensor_parallel_size,
                 tp_store_path, fused_projections, generation, env, max_turns, tokenizer,
                 chat_template)

// A generate call's figures (each micro batch's, RoleGroup::scatter's "micro_batches").
// Multi-turn figures are 0 and conversations null for single-turn rollouts.
struct GenerateReply {
  int64_t weight_version = 0;  // the weights that generated it
  int64_t prompt_length = 0;
  int64_t preempted = 0;
  int64_t kv_peak_bytes = 0;
  nlohmann::json conversations;  // [N] lists of {"role", "content"} after the prompt
  double env_stall_seconds = 0;
  double extend_seconds = 0;
  int64_t extended_tokens = 0;
};
RLHF_WIRE_STRUCT(GenerateReply, "generate reply", weight_version, prompt_length, preempted,
                 kv_peak_bytes, conversations, env_stall_seconds, extend_seconds, extended_tokens)

// Samples n_samples_per_prompt responses per prompt. Tensors "prompt_ids", "prompt_mask"
// [B, P] int64 and "prompt_index" [B] (the prompts' positions in the whole request,
// consecutive: seeds follow the prompt, not the micro batch). The reply's tensors:
// "sequences", "attention_mask", "action_mask", "log_probs", "response_lengths",
// "weight_versions" (int64, the version that sampled each response token; responses padded
// to max_new_tokens so micro batches concatenate), and with an environment
// "env_rewards", "turns", "tool_calls", "tool_errors", "env_timed_out", "env_seconds".
// `rows`: with an environment, every prompt row of the whole request (label and columns)
// by prompt index, for its reset; [] otherwise. `in_flight_updates` (rollout.partial_rollout):
// a sync_weights that reaches the worker meanwhile is applied between two decode steps, and
// the rows in flight continue with the new weights and their KV cache as it is (not under
// tensor parallelism: its ranks would have to agree on the step). `stream_groups`
// (single-turn; rollout.streaming): each prompt's n samples go to the driver as a partial
// reply (worker.h send_partial) as soon as the last of them ends, with the tensors above but
// the environment's and "prompt_index" [g] (their prompts' positions in the whole request);
// the reply then carries its figures only, no tensors.
struct Generate {
  static constexpr const char* kName = "generate";
  using Reply = GenerateReply;
  rollout::SamplingParams sampling;
  int64_t n_samples_per_prompt = 1;
  nlohmann::json rows = nlohmann::json::array();
  bool in_flight_updates = false;
  bool stream_groups = false;
  bool record_routes = false;  // algo.routing_replay: the reply carries "routes"
};
RLHF_WIRE_STRUCT(Generate, "generate", sampling, n_samples_per_prompt, rows, in_flight_updates,
                 stream_groups, record_routes)

// One weight sync's figures (rollout::WeightSyncStats).
struct SyncReply {
  int64_t weight_version = 0;
  int64_t bytes = 0;
  int64_t buckets = 0;
  int64_t tensors = 0;
  double seconds = 0;
  std::string path;  // "gloo", "nccl" or "cuda_ipc"
};
RLHF_WIRE_STRUCT(SyncReply, "sync reply", weight_version, bytes, buckets, tensors, seconds, path)

// Rollout side: the first call with a store_path joins the sync group there over `backend`
// ("nccl" when the actor's rank 0 and every rollout rank have a GPU of their own, else
// "gloo"): rollout rank r is rank r + 1 of the rollout's size + 1 (the actor's rank 0 is rank
// 0); another store_path forms the group again (after a worker was relaunched). `alone`: a
// group of the actor's rank 0 and this rank only (a relaunched engine catching up). Every
// call receives one sync.
struct SyncWeights {
  static constexpr const char* kName = "sync_weights";
  using Reply = SyncReply;
  std::string store_path;
  std::string backend;
  bool alone = false;
};
RLHF_WIRE_STRUCT(SyncWeights, "sync_weights", store_path, backend, alone)

// Actor side: every actor rank calls it (ZeRO-3 gathers one unit at a time); actor rank 0
// also joins the sync group of sync_size ranks at store_path (again when the path changes)
// over `backend` and sends
// the buckets of bucket_bytes by `path` ("gloo", "nccl" or "cuda_ipc"). The rollout's
// tensor_parallel_size > 1 scatters each rollout rank only its slices. A LoRA actor sends
// its merged weights or, with lora_sync "adapters", only its adapters.
struct PushWeights {
  static constexpr const char* kName = "push_weights";
  using Reply = SyncReply;
  std::string store_path;
  int sync_size = 0;
  std::string backend;
  std::string path;
  int64_t bucket_bytes = 0;
  int tensor_parallel_size = 1;
  std::string lora_sync;  // "merged" or "adapters"
  // The weights the rollout holds already, under the same version (a relaunched engine
  // catching up), not a new version.
  bool again = false;
};
RLHF_WIRE_STRUCT(PushWeights, "push_weights", store_path, sync_size, backend, path, bucket_bytes,
                 tensor_parallel_size, lora_sync, again)

SyncReply sync_reply(const rollout::WeightSyncStats& stats);

// The rollout's weights to host memory while the colocated actor trains, and back.
struct Sleep {
  static constexpr const char* kName = "sleep";
  using Reply = OffloadReply;
};
RLHF_WIRE_EMPTY(Sleep, "sleep")

struct WakeUp {
  static constexpr const char* kName = "wake_up";
  using Reply = RestoreReply;
};
RLHF_WIRE_EMPTY(WakeUp, "wake_up")

}  // namespace rlhf::ops
