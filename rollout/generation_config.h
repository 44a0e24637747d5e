// GenerationConfig: the settings of one generation engine, where they come from (the job
// spec's rollout section, defaults included) and how they travel to a rollout worker (one
// JSON object, every field required: a field missing or unknown is an error naming it, never
// a second default on the worker's side). Does not generate (generator.h does).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "rollout/sampling.h"

namespace rlhf::rollout {

// How paged generation runs its decode steps.
enum class DecodeSteps {
  kAuto,   // a GPU: padded steps replayed as CUDA graphs (decode_graph.h); the CPU: eager
  kEager,  // every step eagerly at its own shape (rollout.enforce_eager)
  kPadded  // padded steps everywhere: graphs on a GPU, eager on the CPU (tests of padding)
};

// The job spec's rollout.* generation keys. A job's rollout workers and `rlhf generate` both
// build it with generation_config_from_rollout_section (the spec's defaults included), and it
// travels to a worker whole (to_json / generation_config_from_json). The defaults below are
// the spec's (a test holds them to the key table), for code and tests that build one by
// hand.
struct GenerationConfig {
  int64_t max_new_tokens = 1024;     // rollout.max_new_tokens
  int64_t n_samples_per_prompt = 1;  // rollout.n_samples_per_prompt
  int64_t micro_batch_size = 8;      // prompts per KV cache (rollout.micro_batch_size)
  // Bytes the KV pool may hold (rollout.kv_cache_memory_gb; 0: as many blocks as
  // max_num_seqs full-length sequences need).
  int64_t kv_cache_bytes = 0;
  // Tokens per KV block (rollout.kv_block_size, >= 1): the whole request shares one pool of
  // blocks; a prompt's samples share its blocks; new prompts join the decode batch as others
  // finish (continuous batching), and when the pool runs out the latest-admitted sequence is
  // preempted and later recomputed. Outputs do not depend on the schedule (per-row sampling
  // streams).
  int64_t kv_block_size = 16;
  // Sequences decoding at once in paged generation (rollout.max_num_seqs, vLLM's
  // max_num_seqs); 0: micro_batch_size x n_samples_per_prompt.
  int64_t max_num_seqs = 0;
  // How paged decode steps run (see DecodeSteps).
  DecodeSteps decode_steps = DecodeSteps::kAuto;
  // On a GPU, FlashInfer's kernels (kernels/) where they have an instance for the model's
  // shapes: paged decode steps attend in place (no gather of the blocks), RMSNorm in one
  // kernel. false: torch's operators, gather + SDPA (the reference path, and the CPU's).
  bool gpu_kernels = true;
  std::vector<int64_t> stop_token_ids;  // EOS and rollout.stop_token_ids: a row ends after one
  int64_t pad_token_id = 0;             // fills sequences after a row's end
  // Decode steps between the host's reads of the live-row count (to stop and compact); 0:
  // every step on the CPU, every 8 on a GPU (so decoding never waits for each token; at
  // most 7 steps run after the last row finished, on padding).
  int64_t sync_interval = 0;

  void validate() const;  // throws InputError
};

// The engine a job's rollout runs, from the spec's resolved rollout section (JobSpec::json()
// ["rollout"], or default_spec_json()["rollout"] for the defaults alone): max_new_tokens,
// n_samples_per_prompt, micro_batch_size, kv_block_size, max_num_seqs, enforce_eager,
// gpu_kernels, stop_token_ids, and kv_cache_memory_gb when it is a number ("auto": 0, which
// the caller replaces with the plan's pool). Stop and pad tokens of the tokenizer are the
// caller's. Throws InputError naming the key when one is missing or of the wrong type.
GenerationConfig generation_config_from_rollout_section(const nlohmann::json& rollout);
// rollout.temperature, top_p and top_k of the same section (seed 0).
SamplingParams sampling_from_rollout_section(const nlohmann::json& rollout);

// Every field, by its name above; decode_steps as "auto", "eager" or "padded".
nlohmann::json to_json(const GenerationConfig& config);
// The inverse. Throws RuntimeError naming `where` and the field when one is missing, unknown
// or of the wrong type (a request from another build, or a driver's bug), and InputError when
// the values are out of range (validate()).
GenerationConfig generation_config_from_json(const nlohmann::json& j, const std::string& where);

// nlohmann's hooks, so the config travels inside typed requests (rollout/worker_ops.h).
inline void to_json(nlohmann::json& j, const GenerationConfig& c) {
  j = to_json(c);
}
inline void from_json(const nlohmann::json& j, GenerationConfig& c) {
  c = generation_config_from_json(j, "generation");
}

}  // namespace rlhf::rollout
