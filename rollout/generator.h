// Batched autoregressive generation over one paged KV pool (paged_generation.cpp, the one
// engine jobs, evaluation, `rlhf generate` and the benches run): left-padded prompts, a
// prompt's samples sharing its prefilled blocks, continuous batching, preemption and
// recompute when the pool runs out; one decode step per token until every row hit a stop
// token or max_new_tokens. Sampling, stop detection and the outputs stay on the model's
// device: the host reads one number every sync_interval steps, never a token. Does not
// tokenize, schedule requests or receive weights (weight_sync.h does that).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "models/causal_lm.h"
#include "rollout/generation_config.h"
#include "rollout/sampling.h"

namespace rlhf::rollout {

class PagedBatcher;
class RouteLog;

class TurnHandler;

// Where a generate call's time went (summed over micro batches), for metrics and benches.
struct GenerationTimings {
  double prefill_seconds = 0.0;        // prompt forwards (and copying caches to the samples)
  double decode_seconds = 0.0;         // every decode step: forward, sampling, compaction
  int64_t decode_steps = 0;            // forwards of one new position
  int64_t decode_tokens = 0;           // tokens sampled from decode-step logits (live rows only)
  int64_t preempted = 0;               // paged: sequences evicted for blocks (and recomputed)
  int64_t recomputed_tokens = 0;       // paged: positions prefilled again after preemption
  int64_t kv_peak_bytes = 0;           // the KV cache's most bytes in use at once (blocks held)
  int64_t kv_pool_bytes = 0;           // bytes allocated for the KV cache
  int64_t cuda_graphs = 0;             // paged decode step shapes captured as CUDA graphs
  double graph_capture_seconds = 0.0;  // capturing them (inside decode_seconds)
  int64_t graph_kernels = 0;           // kernels in the largest decode step's graph
  // Multi-turn (a TurnHandler): answers prefilled over the cache, and time nothing ran
  // because every started row waited for its environment.
  double extend_seconds = 0.0;     // extend forwards (inside decode_seconds)
  int64_t extended_tokens = 0;     // positions they prefilled
  double env_stall_seconds = 0.0;  // polls that blocked with no row decoding
};

// One generate call's result. Row i * n + s is sample s of prompt i (OpenRLHF's order).
struct GenerationOutput {
  torch::Tensor sequences;  // [N, P + R] int64: left-padded prompt, response, pad after its end
  torch::Tensor
      attention_mask;         // [N, P + R] int64: prompt tokens and response tokens up to the end
  torch::Tensor action_mask;  // [N, R] bool: response tokens up to and including the stop token
  torch::Tensor log_probs;    // [N, R] FP32: log-prob of each response token under the
                            // distribution it was sampled from (sampling_log_probs); 0 off the mask
  torch::Tensor response_lengths;  // [N] int64: response tokens (the environment's included)
  // Multi-turn (generate with a TurnHandler): the model's turns per row ([N] int64), and the
  // action mask is 0 on the tokens the handler appended (the environment's turns).
  torch::Tensor turns;
  // [N, R] int64: the weight version that sampled each response token. One version unless
  // the weights were updated in flight (set_between_steps): a row's later tokens then carry
  // the newer version (issue 42.3).
  torch::Tensor token_versions;
  // Routing replay (set_record_routes): [N, P + R, S, k] int16, the experts each of S sparse
  // layers chose for each sequence position (-1: none, the last token and padding); undefined
  // otherwise (rollout/route_log.h).
  torch::Tensor routes;
  int64_t prompt_length = 0;   // P
  int64_t weight_version = 0;  // the newest weights that produced it
  GenerationTimings timings;
  // R is the longest response in the batch (<= max_new_tokens).
};

class Generator {
 public:
  // `model` must have an LM head; it is used in eval mode without gradients and may be
  // updated in place between calls (weight sync), which set_weight_version() records.
  Generator(std::shared_ptr<models::CausalLM> model, GenerationConfig config);
  ~Generator();
  Generator(Generator&&) noexcept;
  Generator& operator=(Generator&&) noexcept;

  const GenerationConfig& config() const { return config_; }
  // Samples per prompt of the calls that follow (held-out evaluation draws one greedy sample
  // per prompt from an engine configured for the step's n). Throws InputError for n < 1.
  void set_samples_per_prompt(int64_t n);
  models::CausalLM& model() { return *model_; }
  int64_t weight_version() const { return weight_version_; }
  void set_weight_version(int64_t version) { weight_version_ = version; }
  // In-flight weight updates (rollout.partial_rollout): called between two decode steps of
  // the calls that follow, it applies the weight updates that came meanwhile (in place, so
  // the KV cache and CUDA graphs stay as they are) and returns weight_version() after them;
  // the rows in flight continue with the new weights. Unset (the default): none.
  void set_between_steps(std::function<int64_t()> hook) { between_steps_ = std::move(hook); }
  // Streaming (issue 42.1; single-turn calls): `done` gets each prompt group as soon as its
  // last row ends, as its own output (rows p * n + s of the call's prompts `prompts`, in
  // that order, R its longest response), during the call; every prompt once. Unset: none.
  using GroupsDone =
      std::function<void(GenerationOutput part, const std::vector<int64_t>& prompts)>;
  void set_on_groups_done(GroupsDone done) { on_groups_done_ = std::move(done); }
  // Routing replay (algo.routing_replay): the calls that follow record every token's routes
  // (GenerationOutput::routes). Throws InputError for a model without sparse layers at the
  // next call, or with padded decode steps (DecodeSteps::kPadded; a MoE's auto is eager).
  void set_record_routes(bool on) { record_routes_ = on; }

  // prompt_ids, prompt_mask: [B, P] int64, left-padded (every row has >= 1 token). Returns
  // B * n_samples_per_prompt rows. These prompts are prompts [first_prompt, first_prompt + B)
  // of a request: sample s of prompt i draws from stream (params.seed, i * n + s), so the
  // same request and seed give the same output however it is split. Throws InputError for
  // bad parameters.
  // With `turns` (multi-turn rollouts, rollout/trajectory.h), each
  // row is a trajectory of up to max_turns model turns within max_new_tokens tokens.
  GenerationOutput generate(const torch::Tensor& prompt_ids, const torch::Tensor& prompt_mask,
                            const SamplingParams& params, int64_t first_prompt = 0,
                            TurnHandler* turns = nullptr, int64_t max_turns = 1);

  // Paged generation with CUDA graphs keeps its KV pool and decode graphs between calls: each
  // shape is captured once and replayed by every later call, across weight syncs (which copy
  // into the parameters in place). This drops them (the next call allocates and captures
  // again): call it when the weights move to new memory (sleep and wake_up) or the model's
  // modules change, and to give the pool's memory back.
  void release_paged_engine();

  // What the decode loop writes on the model's device for rows [first_row, first_row + N)
  // of the request: their uniforms (undefined when greedy), the stop ids, and outputs [N, R]
  // (tokens padded, log-probs 0) and lengths [N] to fill.
  struct DecodeState {
    torch::Tensor uniforms;   // [N, R] FP64
    torch::Tensor stop_ids;   // [S] int64
    torch::Tensor tokens;     // [N, R] int64, pad_token_id
    torch::Tensor log_probs;  // [N, R] FP32, 0
    torch::Tensor lengths;    // [N] int64, 0
    torch::Tensor pad;        // [] int64, pad_token_id
  };

 private:
  DecodeState decode_state(Sampler& sampler, int64_t first_row, int64_t N,
                           torch::Device device) const;

  // The whole request through one paged KV pool with continuous batching
  // (paged_generate.cpp); rows first_row.. of the request.
  GenerationOutput generate_paged(const torch::Tensor& prompt_ids, const torch::Tensor& prompt_mask,
                                  Sampler& sampler, int64_t first_row, TurnHandler* turns,
                                  int64_t max_turns);

  // The in-flight version poll and (single-turn) the streaming of finished groups of a call,
  // on its batcher.
  void hook(PagedBatcher& batcher, const torch::Tensor& prompt_ids,
            const torch::Tensor& prompt_mask, const DecodeState& d, bool single_turn,
            const RouteLog* routes);

  // The pool and graphs kept between calls (paged_generate.cpp).
  struct PagedEngine;
  // The kept engine when it has at least these sizes, else a new one in its place.
  PagedEngine& paged_engine(int64_t num_blocks, int64_t max_batch, int64_t max_blocks);

  std::shared_ptr<models::CausalLM> model_;
  GenerationConfig config_;
  int64_t weight_version_ = 0;
  std::function<int64_t()> between_steps_;
  GroupsDone on_groups_done_;
  bool record_routes_ = false;
  std::unique_ptr<PagedEngine> paged_engine_;
};

// The output of a generation: prompts [b, P] (CPU) repeated n times each, responses from
// tokens/log_probs [b * n, >= R] and lengths [b * n] (any device), R = longest length.
GenerationOutput assemble_output(const torch::Tensor& prompt_ids, const torch::Tensor& prompt_mask,
                                 int64_t n, const torch::Tensor& tokens,
                                 const torch::Tensor& log_probs, const torch::Tensor& lengths);

// Streaming: prompts `prompts` of a call in progress (rows p * n + s, in that order) as their
// own output, from its prompts [B, P], decode state and token versions [N, max_new_tokens];
// its weight_version is the newest of its tokens' (`fallback` when it has none).
GenerationOutput select_groups(const torch::Tensor& prompt_ids, const torch::Tensor& prompt_mask,
                               int64_t n, const Generator::DecodeState& d,
                               const torch::Tensor& token_versions,
                               const std::vector<int64_t>& prompts, int64_t fallback);
// The newest version that sampled one of out's tokens, `fallback` when none did.
int64_t newest_version(const GenerationOutput& out, int64_t fallback);

// Pads every output to `response_length` response columns (>= each R) and concatenates
// along rows, in order. Used to join micro batches, and by callers that need a fixed R.
GenerationOutput concat_outputs(const std::vector<GenerationOutput>& parts, int64_t response_length,
                                int64_t pad_token_id);

}  // namespace rlhf::rollout
