// Memory planner: the engine's model states replayed exactly (unit by unit, as ShardedUnit
// and Trainer allocate and free them), activations and log-prob buffers counted from the
// tensors the model code saves for backward, and the search for a change that fits.
#include "engine/memory_plan.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "core/errors.h"
#include "core/text.h"
#include "models/decoder_layer.h"
#include "models/lora.h"
#include "models/tensor_parallel.h"

namespace rlhf::engine {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Fixed bytes per worker process beside its tensors. CPU: the peak RSS of a worker whose
// tensors are a few hundred KiB (LibTorch 2.11's CPU libraries, oneDNN, ZeroMQ, Arrow),
// measured 391-410 MiB on grpo_tiny's ref and rollout workers (2026-11-25; it was 176-185 MiB
// with LibTorch 1.13, bench/RESULTS.md, memory planner). CUDA, measured on an H100 with
// torch 2.11.0+cu130 (bench/RESULTS.md, GPU path):
//   - the context, outside the caching allocator: four workers with at most 4 MiB allocated
//     each left 75.98 of 79.18 GiB free, so <= 0.80 GiB per process (with the driver's own
//     share); 768 MiB;
//   - cuBLAS workspaces, inside the allocator: 32 MiB per stream that runs a matmul (Hopper's
//     default); the allocator's resident floor was 32 MiB on ref and rollout workers and
//     64 MiB on trained ones (forward on the worker's thread, backward on autograd's).
constexpr int64_t kCpuOverhead = 390ll << 20;
constexpr int64_t kCudaContext = 768ll << 20;
constexpr int64_t kCublasWorkspace = 32ll << 20;
// NCCL's buffers per communicator and rank, outside the caching allocator: per channel, a
// receive buffer of NCCL_BUFFSIZE (4 MiB, Simple protocol) plus LL128's (~4.5 MiB) and LL's
// (~0.25 MiB) from each ring neighbour, with up to 32 channels on NVLink: ~280 MiB. Assumed
// from NCCL's defaults, not yet measured here (no GPU has run a multi-rank NCCL group for
// this figure); set NCCL_BUFFSIZE / NCCL_MAX_NCHANNELS lower to shrink it.
constexpr int64_t kNcclCommBytes = 280ll << 20;

std::string format_gib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f",
                static_cast<double>(bytes) / static_cast<double>(1ll << 30));
  return buf;
}

int64_t div_up(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

int64_t layer_numel(const models::ModelConfig& c) {
  const int64_t H = c.hidden_size, I = c.intermediate_size, q = c.num_attention_heads * c.head_dim,
                kv = c.num_key_value_heads * c.head_dim;
  int64_t n = H * q + 2 * H * kv + q * H + 3 * H * I + 2 * H;
  if (c.qkv_bias) n += q + 2 * kv;
  if (c.o_proj_bias) n += H;
  if (c.mlp_bias) n += 2 * I + H;
  if (c.qk_norm) n += 2 * c.head_dim;  // Qwen3 q_norm, k_norm
  return n;
}

// Bytes autograd keeps for backward in one decoder layer (models/decoder_layer.cpp), for
// B sequences of T tokens with e-byte activations:
//   two RMSNorms: the FP32 copy of x and the e-dtype normalized output (4H + eH each);
//   attention: q, rotate_half(q), rotated q, k, rotate_half(k), the K^T copy matmul makes,
//     V (repeated to the query heads), the attention output before o_proj: 6 q + 2 kv;
//   softmax: its FP32 output and the e-dtype probs PV reads: (4 + e) x heads x T x T;
//   MLP: gate, silu(gate), up, and their product: 4 I.
int64_t layer_saved_bytes(const models::ModelConfig& c, int64_t B, int64_t T, int64_t e) {
  const int64_t H = c.hidden_size, I = c.intermediate_size, q = c.num_attention_heads * c.head_dim,
                kv = c.num_key_value_heads * c.head_dim;
  const int64_t per_token = 2 * (4 * H + e * H) + e * (6 * q + 2 * kv) + e * 4 * I;
  return B * T * per_token + B * c.num_attention_heads * T * T * (4 + e);
}

// Tensors every layer shares in one forward: the FP32 additive mask [B, 1, T, T] and the
// rotary tables cos, sin [B, T, D].
int64_t shared_forward_bytes(const models::ModelConfig& c, int64_t B, int64_t T, int64_t e) {
  return 4 * B * T * T + 2 * B * T * c.head_dim * e;
}

// On a GPU the layers of a forward without a cache share what selects the attended keys: a
// bool mask [B, 1, T, T], or, where models::CausalLM takes flash attention's varlen path (a
// 16-bit compute dtype, head_dim a multiple of 8 up to 256, no sliding window shorter than T:
// CausalLM::uses_varlen_attention), the real tokens' int64 index [B * T] instead. A forward
// over a KV cache (the rollout's prefill) always has the mask. (From the code; not yet
// checked against the allocator on a GPU.)
int64_t gpu_mask_bytes(const models::ModelConfig& c, int64_t B, int64_t T, int64_t e, bool cached) {
  const bool varlen = !cached && e == 2 && c.head_dim % 8 == 0 && c.head_dim <= 256 &&
                      (c.sliding_window <= 0 || c.sliding_window >= T);
  return varlen ? 8 * B * T : B * T * T;
}

// A forward without autograd: the largest live set is one layer's attention (scores in e,
// their FP32 copy + mask, softmax FP32, probs in e) and its MLP intermediates. On a GPU,
// SDPA's fused kernels (flash / memory-efficient) never hold the [B, heads, T, T] scores:
// a bool mask [B, 1, T, T] (padded batches) and the rotary tables are what remains shared.
//
// The MLP's gate, up and product [tokens, I] exist for one chunk of at most
// models::kInferenceMlpChunkTokens tokens at a time (models/decoder_layer.cpp).
int64_t inference_bytes(const models::ModelConfig& c, int64_t B, int64_t T, int64_t e,
                        DeviceKind kind = DeviceKind::kCpu, bool cached = false) {
  const int64_t mlp_tokens = std::min(B * T, models::kInferenceMlpChunkTokens);
  const int64_t hidden = (B * T * 4 * c.hidden_size + mlp_tokens * 3 * c.intermediate_size) * e;
  if (kind == DeviceKind::kCuda)
    return gpu_mask_bytes(c, B, T, e, cached) + 2 * B * T * c.head_dim * e + hidden;
  const int64_t attention = B * c.num_attention_heads * T * T * (2 * e + 8);
  return shared_forward_bytes(c, B, T, e) + attention + hidden;
}

// Training forward + backward of one micro batch (what the autograd graph holds at its
// peak, in backward). Without checkpointing every layer's saved tensors are alive when
// backward starts; with checkpointing each layer keeps only its input [B, T, H] and backward
// recomputes one layer at a time (its saved tensors). Either way one layer's backward is in
// flight: gradients as large as its saved tensors, plus the softmax backward's FP32 buffers
// and e-dtype score gradients, (8 + 2e) x heads x T x T (bench_memory_plan measures the
// whole: within 10% at T = 128..512 on the 100m preset).
//
// On a GPU, SDPA runs the fused kernels (flash, or memory-efficient with a mask): no
// [heads, T, T] scores are saved or built in backward; each layer saves its FP32 log-sum-exp
// [B, heads, T] instead, and the layers share the mask (gpu_mask_bytes) and the rotary tables.
// (Planned from the kernels' definitions; not yet checked against the allocator on a GPU.)
int64_t training_bytes(const models::ModelConfig& c, int64_t B, int64_t T, int64_t e,
                       bool checkpointing, DeviceKind kind = DeviceKind::kCpu) {
  const int64_t scores = B * c.num_attention_heads * T * T;
  const bool fused = kind == DeviceKind::kCuda;
  const int64_t layer = layer_saved_bytes(c, B, T, e) -
                        (fused ? scores * (4 + e) - 4 * B * c.num_attention_heads * T : 0);
  const int64_t in_flight = layer + (fused ? 0 : scores * (8 + 2 * e));
  const int64_t head_norm = B * T * (4 + e) * c.hidden_size;
  const int64_t shared = (fused ? gpu_mask_bytes(c, B, T, e, false) + 2 * B * T * c.head_dim * e
                                : shared_forward_bytes(c, B, T, e)) +
                         head_norm;
  if (!checkpointing) return c.num_hidden_layers * layer + in_flight + shared;
  return c.num_hidden_layers * B * T * c.hidden_size * e + layer + in_flight + shared;
}

// models/log_probs.cpp: the LM head's log-probs of B x `positions` tokens.
// train.logits_chunk_tokens c > 0 (the default): the tokens flattened and split into k =
// ceil(N / c) balanced chunks of n = ceil(N / k); per chunk the logits [n, V] in e and their
// FP32 log-sum-exp / softmax: n V (4 + e') bytes, e' = 0 in FP32 (no copy) or 2 in BF16.
// Backward recomputes each chunk's logits and adds the head's [V, H] gradient into an FP32
// sum when there are several chunks (V H (4 + e')), else builds it once in e (V H e).
// c = 0: the older path, chunks of `chunk_positions` positions over all B rows at once: 8
// bytes per [B, n, V] element at the peak, the head's gradient in e and, with several
// chunks, an FP32 [V, H] buffer.
int64_t log_prob_bytes(const models::ModelConfig& c, int64_t B, int64_t positions,
                       int64_t chunk_positions, int64_t chunk_tokens, int64_t e, bool backward) {
  positions = std::max<int64_t>(1, positions);
  const int64_t V = c.vocab_size, H = c.hidden_size;
  if (chunk_tokens > 0) {
    const int64_t N = B * positions, k = div_up(N, chunk_tokens), n = div_up(N, k);
    const int64_t wide = 4 + (e == 4 ? 0 : 2);
    const int64_t forward = n * V * wide;
    if (!backward) return forward;
    return forward + (k > 1 ? V * H * wide : V * H * e);
  }
  const int64_t n = std::min(chunk_positions, positions);
  int64_t bytes = B * n * V * 8;
  if (!backward) return bytes;
  bytes += V * H * e;
  if (positions > chunk_positions) bytes += V * H * 4;
  return bytes;
}

// The engine's peak, replayed from ShardedUnit/Trainer: model states always, plus the
// largest transient set of gathered units (stage 3) and collective buffers.
struct EnginePeak {
  int64_t weights = 0, master = 0, optimizer = 0, grads = 0, gathered = 0, buffers = 0;
};

// Tied embeddings need nothing extra: the head gathers unit 0, which training keeps
// gathered anyway.
EnginePeak engine_peak(const std::vector<int64_t>& units, int world, int stage, int64_t e,
                       bool state_off_device, bool checkpointing) {
  EnginePeak p;
  std::vector<int64_t> shard, padded, gathered;
  for (int64_t n : units) {
    const int64_t s = div_up(n, world);
    shard.push_back(s);
    padded.push_back(s * world);
    gathered.push_back(s * world * e);
  }
  for (size_t u = 0; u < units.size(); ++u) {
    p.master += 4 * shard[u];
    p.optimizer += 8 * shard[u];
    p.grads += 4 * (stage == 1 ? padded[u] : shard[u]);
    if (stage < 3)
      p.weights += e * units[u];  // the model's own parameters, unpadded
    else if (state_off_device)
      p.weights += e * shard[u];  // cached compute shard
  }
  // Transient sets: {gathered, buffers}; the peak is the largest sum.
  std::vector<std::pair<int64_t, int64_t>> sets;
  const size_t head = units.size() - 1;
  auto reduce_buffer = [&](size_t u) { return 4 * (padded[u] + shard[u]); };  // flat FP32 + shard
  if (stage < 3) {
    for (size_t u = 0; u < units.size(); ++u) {
      sets.push_back({0, e * padded[u]});                     // refresh_params all-gather
      if (stage == 2) sets.push_back({0, reduce_buffer(u)});  // reduce-scatter in backward
    }
  } else if (checkpointing) {
    // Embeddings and head stay gathered from forward to the end of backward (autograd holds
    // them); each layer is gathered for its recompute, released when the recompute's graph
    // is gone (CheckpointedLayer calls after_forward first), then reduce-scattered.
    const int64_t ends = gathered[0] + gathered[head];
    for (size_t u = 1; u < head; ++u) {
      sets.push_back({ends + gathered[u], 0});
      sets.push_back({ends, reduce_buffer(u)});
    }
    sets.push_back({ends, reduce_buffer(0)});
    sets.push_back({gathered[head], reduce_buffer(head)});
  } else {
    // Every unit stays gathered through backward; the trainer then reduces them in order,
    // releasing each after its reduce-scatter.
    int64_t alive = 0;
    for (int64_t g : gathered) alive += g;
    for (size_t u = 0; u < units.size(); ++u) {
      sets.push_back({alive, reduce_buffer(u)});
      alive -= gathered[u];
    }
  }
  for (const auto& [g, b] : sets) {
    if (g + b > p.gathered + p.buffers) {
      p.gathered = g;
      p.buffers = b;
    }
  }
  return p;
}

}  // namespace

int64_t MemoryTerms::device_total() const {
  int64_t most = 0;
  for (const auto& [phase, bytes] : phases) most = std::max(most, bytes);
  if (!phases.empty()) return most;
  return overhead + nccl + weights + master + optimizer + grads + std::max(load, step_peak);
}

std::string MemoryTerms::peak_phase() const {
  std::string best;
  int64_t most = -1;
  for (const auto& phase : step_phases(true)) {
    auto it = phases.find(phase);
    if (it != phases.end() && it->second > most) {
      most = it->second;
      best = phase;
    }
  }
  return best;
}

int64_t MemoryTerms::cuda_allocated() const {
  if (cuda_workspace == 0) return 0;
  // The CUDA context, NCCL's buffers and a CUDA IPC bucket are outside the allocator.
  const int64_t outside =
      overhead - cuda_workspace + nccl + (peak_phase() == "sync" ? sync_outside : 0);
  return device_total() - outside;
}

std::vector<std::string> step_phases(bool ppo) {
  if (ppo) return {"load", "generate", "score", "train", "sync", "save"};
  return {"load", "score", "train", "save"};
}

std::pair<std::string, int64_t> MemoryTerms::dominant() const {
  const std::pair<std::string, int64_t> terms[] = {
      {"weights", weights},         {"master", master},
      {"optimizer", optimizer},     {"grads", grads},
      {"gathered", gathered},       {"buffers", buffers},
      {"param_grads", param_grads}, {"activations", activations},
      {"log_probs", log_probs},     {"kv_cache", kv_cache},
      {"overhead", overhead},       {"load", load}};
  auto best = terms[0];
  for (const auto& t : terms)
    if (t.second > best.second) best = t;
  return best;
}

json MemoryTerms::to_json() const {
  return {{"weights", weights},
          {"master", master},
          {"optimizer", optimizer},
          {"grads", grads},
          {"gathered", gathered},
          {"buffers", buffers},
          {"param_grads", param_grads},
          {"activations", activations},
          {"log_probs", log_probs},
          {"kv_cache", kv_cache},
          {"overhead", overhead},
          {"load", load},
          {"host", host},
          {"step_peak", step_peak},
          {"engine_peak", engine_peak},
          {"device_total", device_total()},
          {"cuda_workspace", cuda_workspace},
          {"cuda_allocated", cuda_allocated()},
          {"nccl", nccl},
          {"sync", sync},
          {"sync_outside", sync_outside},
          {"train_peak", train_peak},
          {"score_peak", score_peak},
          {"save_peak", save_peak},
          {"kv_sequences", kv_sequences},
          {"phases", phases},
          {"engine_phases", engine_phases},
          {"engine_operations", engine_operations},
          {"peak_phase", peak_phase()}};
}

std::vector<int64_t> unit_numels(const models::ModelConfig& c) {
  std::vector<int64_t> units = {c.vocab_size * c.hidden_size};
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) units.push_back(layer_numel(c));
  int64_t head = c.hidden_size;  // final norm
  if (c.head == models::HeadKind::kValue)
    head += c.hidden_size;
  else if (!c.tie_word_embeddings)
    head += c.vocab_size * c.hidden_size;
  units.push_back(head);
  return units;
}

std::vector<int64_t> largest_param_numels(const models::ModelConfig& c) {
  const int64_t H = c.hidden_size, q = c.num_attention_heads * c.head_dim;
  std::vector<int64_t> out = {c.vocab_size * H};
  const int64_t layer = std::max({H * q, q * H, H * c.intermediate_size});
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) out.push_back(layer);
  const bool lm_head = c.head == models::HeadKind::kLanguageModel && !c.tie_word_embeddings;
  out.push_back(lm_head ? c.vocab_size * H : H);
  return out;
}

namespace {

const char* const kLoraLinears[] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                    "gate_proj", "up_proj", "down_proj"};

// Whether a target_modules list adapts the decoder linear `name` (models/lora.cpp: PEFT's
// match, a module name equal to or ending in ".<target>"; the short name is the module's tail).
bool lora_adapts(const std::vector<std::string>& targets, const std::string& name) {
  return std::any_of(targets.begin(), targets.end(), [&](const std::string& t) {
    return t == "all-linear" || t == name || ends_with(t, "." + name);
  });
}

}  // namespace

std::vector<int64_t> lora_unit_numels(const models::ModelConfig& c, int64_t r,
                                      const std::vector<std::string>& targets) {
  const int64_t H = c.hidden_size, I = c.intermediate_size, q = c.num_attention_heads * c.head_dim,
                kv = c.num_key_value_heads * c.head_dim;
  // {name, in, out} of each decoder linear (models/lora.cpp: lora_module_names).
  const std::vector<std::tuple<std::string, int64_t, int64_t>> linears = {
      {"q_proj", H, q},    {"k_proj", H, kv}, {"v_proj", H, kv},  {"o_proj", q, H},
      {"gate_proj", H, I}, {"up_proj", H, I}, {"down_proj", I, H}};
  int64_t layer = 0;
  for (const auto& [name, in, out] : linears) {
    if (lora_adapts(targets, name)) layer += r * (in + out);
  }
  std::vector<int64_t> units = {0};
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) units.push_back(layer);
  units.push_back(c.head == models::HeadKind::kValue ? H : 0);
  return units;
}

namespace {

// A forward without grad over ZeRO-3 shards (ShardedInference, or a stage-3 trainer's
// scoring): one unit gathered at a time, padded to N ranks, in the compute dtype; the head
// with unit 0 beside it when the embeddings are tied.
int64_t inference_gathered(const std::vector<int64_t>& units, int64_t N, int64_t e, bool tied) {
  int64_t most = 0;
  for (size_t u = 0; u < units.size(); ++u) {
    int64_t set = e * div_up(units[u], N) * N;
    if (u + 1 == units.size() && tied) set += e * div_up(units[0], N) * N;
    most = std::max(most, set);
  }
  return most;
}

// Positions a scoring forward runs the LM head on: PPO scores the response's positions only
// (actors/model_operations.cpp), other jobs every position but the last.
int64_t scored_positions(const RoleMemoryInput& in) {
  return in.ppo ? std::min(in.max_new_tokens, in.seq_len - 1) : in.seq_len - 1;
}

// A rollout rank's weight-sync buckets (rollout/weight_sync.cpp): at TP size 1 one bucket
// of min(rollout.sync_bucket_mb, the model) in the wire (compute) dtype, none beside the
// actor's CUDA IPC bucket when the two share a GPU; at TP size t the root fills one bucket of
// bucket / t per rank plus a scratch one, (t + 1) / t buckets (the plan shows the root).
int64_t sync_receive_bytes(const RoleMemoryInput& in, int64_t held_numel) {
  const int64_t e = in.compute_bytes, tp = in.tensor_parallel;
  if (tp == 1 && in.sync_over_ipc) return 0;
  return (tp + 1 > 2 ? tp + 1 : 1) * std::min(in.sync_bucket_bytes / tp, e * held_numel);
}

// The smallest KV budget a rollout rank can generate with: one full-length sequence's blocks.
int64_t one_sequence_kv_bytes(const RoleMemoryInput& in) {
  const int tp = in.tensor_parallel;
  const models::ModelConfig lc =
      tp > 1 ? models::tensor_parallel_shard_config(in.model, tp) : in.model;
  const int64_t capacity = in.prompt_len + in.max_new_tokens;
  const int64_t per_token =
      2 * lc.num_hidden_layers * lc.num_key_value_heads * lc.head_dim * in.compute_bytes;
  return per_token * in.kv_block_size * div_up(capacity, in.kv_block_size);
}

void plan_generation(const RoleMemoryInput& in, int64_t numel, MemoryTerms& t);

// Weights, one inference micro batch (ref, reward) or the KV cache and decode buffers
// (rollout), for a role that does not train.
void plan_untrained(const RoleMemoryInput& in, int64_t numel, MemoryTerms& t) {
  const models::ModelConfig& c = in.model;
  const int64_t e = in.compute_bytes;
  const bool lm = c.head == models::HeadKind::kLanguageModel && in.lm_head_log_probs;
  t.weights = e * numel;
  // models::load_whole reads each tensor straight into its place: no transient (load = 0).
  t.engine_peak = t.weights;  // what an untrained role reports as peak_tensor_bytes
  if (in.work == RoleWork::kInfer) {
    int64_t gathered = 0;
    if (in.shard_weights && in.group_size > 1) {
      // engine/sharded_inference.cpp: 1/N of every unit (padded to N) is resident; a forward
      // gathers one unit at a time, the head with unit 0 beside it when tied.
      const std::vector<int64_t> units = unit_numels(c);
      const int64_t N = in.group_size;
      int64_t largest_shard = 0;
      t.weights = 0;
      for (int64_t n : units) {
        t.weights += e * div_up(n, N);
        largest_shard = std::max(largest_shard, div_up(n, N));
      }
      gathered = inference_gathered(units, N, e, c.tie_word_embeddings);
      t.gathered = gathered;
      t.load = e * largest_shard;  // one slice in flight beside the shards
      t.engine_peak = t.weights + gathered;
    }
    t.activations = inference_bytes(c, in.micro_batch, in.seq_len, e, in.device_kind);
    if (lm)
      t.log_probs = log_prob_bytes(c, in.micro_batch, scored_positions(in), in.logprob_chunk,
                                   in.logits_chunk_tokens, e, false);
    t.step_peak = gathered + t.activations + t.log_probs;
    t.score_peak = t.step_peak;
    // The tracker (ShardedInference) counts the shards, and a unit gathered while scoring;
    // its load slice goes before the unit's shard is counted, so the load adds nothing.
    for (const auto& phase : step_phases(in.ppo))
      t.engine_phases[phase] = t.weights + (phase == "score" ? gathered : 0);
    return;
  }
  plan_generation(in, numel, t);
}

// The rollout's KV cache, decode buffers and sync bucket (weights set by plan_untrained).
void plan_generation(const RoleMemoryInput& in, int64_t numel, MemoryTerms& t) {
  const models::ModelConfig& c = in.model;
  const int64_t e = in.compute_bytes;
  // Generation. A tensor-parallel rank's layers (and so its KV cache and one layer's working
  // set) are those of the shard config; its logits are gathered to the whole vocabulary.
  const int tp = in.tensor_parallel;
  const models::ModelConfig lc = tp > 1 ? models::tensor_parallel_shard_config(c, tp) : c;
  // Beside the FP32 [rows, V] logits, softmax and sampling copy: with TP, the rank's own
  // [rows, V / t] logits and the all-gather's [t, rows, V / t] buffer they are laid out from
  // (models::tensor_parallel_gather_vocab), in the compute dtype.
  const auto logits_bytes = [&](int64_t rows) {
    int64_t bytes = rows * c.vocab_size * 4 * 3;
    if (tp > 1) bytes += rows * (c.vocab_size / tp + c.vocab_size) * e;
    return bytes;
  };
  const int64_t capacity = in.prompt_len + in.max_new_tokens;
  auto gib = [](int64_t b) { return std::to_string(static_cast<double>(b) / (1ll << 30)); };
  // Paged (rollout/paged_generation.cpp): one pool of blocks, the budget's or what
  // max_num_seqs full-length sequences fill; a prefill forward of at most mb prompts;
  // decode logits for max_num_seqs rows.
  const int64_t bs = in.kv_block_size;
  if (bs < 1) throw InputError("rollout.kv_block_size must be >= 1, got " + std::to_string(bs));
  const int64_t block = 2 * lc.num_hidden_layers * lc.num_key_value_heads * lc.head_dim * bs * e;
  const int64_t per_seq = div_up(capacity, bs);
  const int64_t seqs =
      in.max_num_seqs > 0 ? in.max_num_seqs : in.rollout_micro_batch * in.n_samples;
  int64_t blocks = seqs * per_seq;
  if (in.kv_cache_budget > 0) {
    blocks = std::min(blocks, in.kv_cache_budget / block);
    if (blocks < per_seq)
      throw InputError("rollout.kv_cache_memory_gb: " + gib(in.kv_cache_budget) +
                       " GiB holds less than one sequence: " + std::to_string(in.prompt_len) +
                       " prompt + " + std::to_string(in.max_new_tokens) +
                       " new tokens in blocks of " + std::to_string(bs) + " need " +
                       gib(per_seq * block) + " GiB");
  }
  t.kv_cache = blocks * block;
  // A decode step gathers one layer's keys and values of every running sequence from
  // their blocks ([seqs, kv_heads, S, head_dim] each, S up to the padded capacity) before
  // attending; prefill and decode run one after the other, so the larger of the two is
  // the transient. (With CUDA graphs the gather lives in the graphs' pool for the whole
  // generate call.)
  const int64_t gather = 2 * seqs * per_seq * bs * lc.num_key_value_heads * lc.head_dim * e;
  t.activations = std::max(
      inference_bytes(lc, in.rollout_micro_batch, in.prompt_len, e, in.device_kind, true), gather);
  t.log_probs = logits_bytes(seqs);
  // With CUDA graphs every captured shape writes its logits into one [seqs, 1, V] buffer in
  // the compute dtype, held for the engine's life (rollout/decode_graph.h: PagedDecoder).
  if (in.decode_graphs) t.log_probs += seqs * c.vocab_size * e;
  t.step_peak = t.kv_cache + t.activations + t.log_probs;
  t.kv_sequences = blocks / per_seq;
  t.sync = sync_receive_bytes(in, numel);
}

void plan_sync_and_save(const RoleMemoryInput& in, const std::vector<int64_t>& units, int64_t numel,
                        int64_t frozen, int64_t score_gathered, MemoryTerms& t);

// What LoRA adds to a training step's saved activations (models/linear.cpp): per adapted
// linear the [B T, r] product x A^T in e that B's backward reads and, with lora.dropout > 0,
// the dropped input [B T, in] in e that A's backward reads plus what dropout keeps for its
// own backward (CPU: at::dropout's scaled noise, [B T, in] in e; CUDA: native_dropout's
// bool mask, 1 byte each). Kept for every layer without checkpointing, for the one
// recomputed layer with it.
int64_t lora_activation_bytes(const RoleMemoryInput& in, int64_t e) {
  if (in.lora_rank <= 0) return 0;
  const models::ModelConfig& c = in.model;
  const int64_t H = c.hidden_size, q = c.num_attention_heads * c.head_dim;
  const std::map<std::string, int64_t> input_of = {{"q_proj", H},
                                                   {"k_proj", H},
                                                   {"v_proj", H},
                                                   {"o_proj", q},
                                                   {"gate_proj", H},
                                                   {"up_proj", H},
                                                   {"down_proj", c.intermediate_size}};
  const int64_t mask_bytes = in.device_kind == DeviceKind::kCuda ? 1 : e;
  int64_t per_token = 0;  // bytes per token and layer
  for (const char* name : kLoraLinears) {
    if (!lora_adapts(in.lora_targets, name)) continue;
    per_token += in.lora_rank * e;
    if (in.lora_dropout > 0) per_token += input_of.at(name) * (e + mask_bytes);
  }
  const int64_t layers = in.checkpointing ? 1 : c.num_hidden_layers;
  return layers * in.micro_batch * in.seq_len * per_token;
}

// Model states, engine transients, activations and the phases of a training step. `units`
// and `numel` are the trained parameters (under LoRA the adapters); `frozen` the elements
// of a frozen base, kept whole in the compute dtype on every rank (ShardedUnit::frozen).
void plan_trainer(const RoleMemoryInput& in, const std::vector<int64_t>& units, int64_t numel,
                  int64_t frozen, MemoryTerms& t) {
  const models::ModelConfig& c = in.model;
  const int64_t e = in.compute_bytes;
  const bool lm = c.head == models::HeadKind::kLanguageModel && in.lm_head_log_probs;
  const int stage = std::clamp(in.zero_stage, 1, 3);
  const bool off_device = in.adam_offload && in.device_kind == DeviceKind::kCuda;
  const EnginePeak p = engine_peak(units, in.group_size, stage, e, off_device, in.checkpointing);
  t.weights = p.weights + e * frozen;
  t.master = p.master;
  t.optimizer = p.optimizer;
  t.grads = p.grads;
  t.gathered = p.gathered;
  t.buffers = p.buffers;
  t.engine_peak = t.weights + p.master + p.optimizer + p.grads + p.gathered + p.buffers;
  // The sharded load (ShardedUnit with a WeightSource): beside the states as they will
  // stay, one FP32 slice of one unit's shard read from the checkpoint.
  int64_t largest_shard = 0;
  for (int64_t n : units) largest_shard = std::max(largest_shard, div_up(n, in.group_size));
  t.load = 4 * largest_shard;
  if (off_device) {
    t.host = t.master + t.optimizer;
    t.master = t.optimizer = 0;
  }
  // Compute-dtype .grad before the engine takes it: one layer at a time with checkpointing
  // (plus embeddings and head, reduced after backward), every parameter without.
  const int64_t largest_layer =
      units.size() > 2 ? *std::max_element(units.begin() + 1, units.end() - 1) : 0;
  const int64_t grads_in_flight = e * (units.front() + units.back() + largest_layer);
  t.param_grads = in.checkpointing ? grads_in_flight : e * numel;
  t.activations =
      training_bytes(c, in.micro_batch, in.seq_len, e, in.checkpointing, in.device_kind) +
      lora_activation_bytes(in, e);
  if (lm)
    t.log_probs = log_prob_bytes(c, in.micro_batch, in.seq_len - 1, in.logprob_chunk,
                                 in.logits_chunk_tokens, e, true);
  // The embedding's backward (the last op of backward, when the activations are gone)
  // builds its [V, H] gradient through an FP32 buffer: measured ~141 MiB on the 100m
  // preset whatever the length (bench_memory_plan). When that phase is the larger, the
  // vocabulary-sized term carries the difference so that the sum is the phase's peak.
  const int64_t embed_backward = frozen > 0 ? 0 : c.vocab_size * c.hidden_size * (4 + e);
  t.log_probs = std::max(t.activations + t.log_probs, embed_backward) - t.activations;
  // Phases of a step (see MemoryTerms). Activation phase: the graph, the head's buffers, the
  // .grad in flight and what ZeRO-3 keeps gathered then (embeddings + head + the recomputed
  // layer, or every unit without checkpointing). Reduction phase: the .grad not yet reduced
  // (all of them without checkpointing) beside the engine's largest transient set.
  int64_t gathered_then = 0;
  if (stage == 3) {
    const int64_t g_embed = e * div_up(units.front(), in.group_size) * in.group_size;
    const int64_t g_head = e * div_up(units.back(), in.group_size) * in.group_size;
    gathered_then = in.checkpointing ? g_embed + g_head +
                                           e * div_up(largest_layer, in.group_size) * in.group_size
                                     : e * numel;
  }
  const int64_t activation_phase = t.activations + t.log_probs + grads_in_flight + gathered_then;
  const int64_t unreduced = in.checkpointing ? e * (units.front() + units.back()) : e * numel;
  const int64_t reduction_phase = unreduced + t.gathered + t.buffers;
  // A scoring forward (no grad) at stage 3 gathers one unit at a time (Trainer::before_unit,
  // released by after_unit: no graph holds it).
  const int64_t score_gathered =
      stage == 3 ? inference_gathered(units, in.group_size, e, c.tie_word_embeddings) : 0;
  int64_t scoring_phase = 0;  // PPO: the trained roles also score experience without grad
  if (in.infer_micro_batch > 0) {
    scoring_phase = inference_bytes(c, in.infer_micro_batch, in.seq_len, e, in.device_kind) +
                    (lm ? log_prob_bytes(c, in.infer_micro_batch, scored_positions(in),
                                         in.logprob_chunk, in.logits_chunk_tokens, e, false)
                        : 0) +
                    score_gathered;
  }
  t.step_peak = std::max({activation_phase, reduction_phase, scoring_phase});
  t.train_peak = std::max(activation_phase, reduction_phase);
  t.score_peak = scoring_phase;
  plan_sync_and_save(in, units, numel, frozen, score_gathered, t);
}

// A trained role's weight sync and save transients, and what its tracker counts per phase.
void plan_sync_and_save(const RoleMemoryInput& in, const std::vector<int64_t>& units, int64_t numel,
                        int64_t frozen, int64_t score_gathered, MemoryTerms& t) {
  const models::ModelConfig& c = in.model;
  const int64_t e = in.compute_bytes;
  const int stage = std::clamp(in.zero_stage, 1, 3);
  // The weight sync: ZeRO-3 gathers one unit at a time, whole, in the compute dtype; ZeRO 1/2
  // ranks hold the weights whole already.
  const int64_t largest_unit = *std::max_element(units.begin(), units.end());
  const int64_t unit_gathered =
      stage == 3 ? e * div_up(largest_unit, in.group_size) * in.group_size : 0;
  // Saving: a checkpoint writes each rank's shards as they are; export_hf (Trainer::export_hf)
  // all-gathers one unit's FP32 master [padded] on the device at every stage and converts one
  // parameter at a time to the compute dtype in host memory (a GPU does not hold it; in FP32
  // on a CPU it is a view, no copy), which the tracker counts either way.
  const std::vector<int64_t> params = largest_param_numels(c);
  const bool copies = in.device_kind == DeviceKind::kCpu && e != 4;
  int64_t export_device = 0, export_tracked = 0;
  for (size_t u = 0; u < units.size(); ++u) {
    const int64_t full = 4 * div_up(units[u], in.group_size) * in.group_size;
    export_device = std::max(export_device, full + (copies ? e * params[u] : 0));
    export_tracked = std::max(export_tracked, full + e * params[u]);
  }
  if (frozen > 0) {
    // LoRA exports the adapters (actors/model_operations.cpp: export_lora): every unit's FP32
    // master gathered at once by Trainer::gather_trainable, which the tracker does not count.
    export_device = export_tracked = 0;
    for (int64_t n : units) export_device += 4 * div_up(n, in.group_size) * in.group_size;
  }
  t.save_peak = export_device;
  if (in.sends_weights) {
    // LoRA sends the merged base (rollout::MergedLoraWeights): one unit's merged tensors in
    // e beside its gathered adapters, untracked.
    const std::vector<int64_t> base = frozen > 0 ? unit_numels(c) : std::vector<int64_t>{};
    const int64_t merged = base.empty() ? 0 : e * *std::max_element(base.begin(), base.end());
    const int64_t bucket = std::min(in.sync_bucket_bytes, e * (frozen > 0 ? frozen : numel));
    t.sync = unit_gathered + bucket + merged;
    t.sync_outside = in.sync_over_ipc && in.device_kind == DeviceKind::kCuda ? bucket : 0;
  }
  // What the trainer's MemoryTracker counts in each phase: the states (host ones too) in
  // every phase (a unit's load slice goes before its states are counted, so load adds
  // nothing); a gathered unit while scoring and sending weights (ZeRO-3); the engine's
  // replayed peak in training; the export's unit and conversion buffer in saving.
  const int64_t states = t.weights + t.master + t.optimizer + t.grads + t.host;
  for (const auto& phase : step_phases(in.ppo)) {
    int64_t bytes = states;
    if (phase == "score") bytes += score_gathered;
    if (phase == "train") bytes = t.engine_peak;
    if (phase == "sync" && in.sends_weights) bytes += unit_gathered;
    if (phase == "save") bytes += export_tracked;
    t.engine_phases[phase] = bytes;
  }
  t.engine_operations = {{"save", states}, {"export_hf", states + export_tracked}};
}

// What one rank holds in each phase of the step: what stays on the device (overhead, NCCL,
// states or weights, less what sleep mode moves to the host in that phase) plus the phase's
// transient (RoleMemoryInput's phase flags say which apply).
void fill_phases(const RoleMemoryInput& in, MemoryTerms& t) {
  const int64_t stays = t.overhead + t.nccl + t.weights + t.master + t.optimizer + t.grads;
  const int64_t moved = in.offloads_states_while_generating ? t.master + t.optimizer + t.grads : 0;
  for (const auto& phase : step_phases(in.ppo)) {
    int64_t bytes = stays;
    if (phase == "load") {
      bytes += t.load;
    } else if (in.work == RoleWork::kGenerate) {
      const bool generating =
          phase == "generate" || (in.generates_while_training && phase != "sync");
      if (generating)
        bytes += t.step_peak;
      else if (phase == "sync")
        bytes += t.sync;
      else if (in.sleeps_outside_generate)
        bytes = t.overhead + t.nccl;  // weights in host memory, KV cache freed
    } else if (phase == "generate" || phase == "sync") {
      bytes -= moved;
      if (phase == "sync") bytes += t.sync;
    } else if (phase == "score") {
      bytes += t.score_peak;
    } else if (phase == "train") {
      bytes += t.train_peak;
    } else if (phase == "save") {
      bytes += t.save_peak;
    }
    t.phases[phase] = bytes;
  }
}

}  // namespace

MemoryTerms plan_role(const RoleMemoryInput& in) {
  if (in.group_size < 1 || in.micro_batch < 1 || in.seq_len < 1 || in.compute_bytes < 1)
    throw InputError("memory plan for " + in.role +
                     ": group size, micro batch, length and dtype must be positive");
  const models::ModelConfig& c = in.model;
  MemoryTerms t;
  if (in.device_kind == DeviceKind::kCuda) {
    t.cuda_workspace = kCublasWorkspace * (in.work == RoleWork::kTrain ? 2 : 1);
    t.overhead = kCudaContext + t.cuda_workspace;
  } else {
    t.overhead = kCpuOverhead;
  }
  // A tensor-parallel rollout rank holds the shard config's layers and V / t rows of the
  // embedding and head (norms and row-parallel biases whole).
  models::ModelConfig held = c;
  if (in.work == RoleWork::kGenerate && in.tensor_parallel > 1) {
    models::check_tensor_parallel(c, in.tensor_parallel, "rollout.tensor_parallel_size");
    held = models::tensor_parallel_shard_config(c, in.tensor_parallel);
    held.vocab_size /= in.tensor_parallel;
  }
  const std::vector<int64_t> units = unit_numels(held);
  int64_t numel = 0;
  for (int64_t n : units) numel += n;
  if (in.work == RoleWork::kTrain && in.lora_rank > 0) {
    // The base frozen (a value head stays trained), the adapters the trained states.
    const std::vector<int64_t> trained = lora_unit_numels(c, in.lora_rank, in.lora_targets);
    int64_t trained_numel = 0;
    for (int64_t n : trained) trained_numel += n;
    const int64_t value_head = c.head == models::HeadKind::kValue ? c.hidden_size : 0;
    plan_trainer(in, trained, trained_numel, numel - value_head, t);
  } else if (in.work == RoleWork::kTrain) {
    plan_trainer(in, units, numel, 0, t);
  } else {
    plan_untrained(in, numel, t);
  }
  if (in.device_kind == DeviceKind::kCuda) t.nccl = kNcclCommBytes * in.nccl_communicators;
  fill_phases(in, t);
  return t;
}

namespace {

// LoRA of a trained role: <role>.lora.*, or with <role>.lora.adapter the adapter directory's
// adapter_config.json (its r, targets and dropout win, as in the trainer: actors/
// model_operations.cpp add_adapters). Throws InputError naming the file.
void set_lora_input(const JobSpec& spec, const std::string& r, RoleMemoryInput& in) {
  const std::string adapter = spec.get_string(r + ".lora.adapter");
  if (!adapter.empty()) {
    const models::LoraConfig c = models::read_adapter_config(adapter);
    in.lora_rank = c.rank;
    in.lora_targets = c.target_modules;
    in.lora_dropout = c.dropout;
    return;
  }
  in.lora_rank = spec.get_int(r + ".lora.rank");
  in.lora_targets = split_names(spec.get_string(r + ".lora.target_modules"));
  in.lora_dropout = spec.get_float(r + ".lora.dropout");
}

// The phase flags of RoleMemoryInput, as ppo/driver.cpp decides them at start-up.
void set_phase_flags(const JobSpec& spec, Role role, const Placement& placement,
                     RoleMemoryInput& in) {
  in.ppo = spec.kind() == JobKind::kPpo;
  if (!in.ppo) {
    if (in.device_kind == DeviceKind::kCuda && in.group_size > 1) in.nccl_communicators = 1;
    return;
  }
  auto kind_of = [&](Role r) {
    const auto g = placement.group(r);
    return g.empty() ? DeviceKind::kCpu : g.front().device_kind;
  };
  const bool gpus =
      kind_of(Role::kActor) == DeviceKind::kCuda && kind_of(Role::kRollout) == DeviceKind::kCuda;
  const bool colocated = spec.get_string("rollout.colocate_with") == "actor";
  const bool async = spec.get_int("algo.async_steps") > 0;
  const bool takes_turns = gpus && colocated && !async;
  in.sync_bucket_bytes =
      static_cast<int64_t>(spec.get_float("rollout.sync_bucket_mb") * static_cast<double>(1 << 20));
  in.sync_over_ipc = gpus && colocated;
  const bool sync_over_nccl = gpus && !colocated;
  const bool cuda = in.device_kind == DeviceKind::kCuda;
  if (role == Role::kActor) {
    in.sends_weights = true;
    in.offloads_states_while_generating =
        takes_turns && spec.get_bool("actor.offload_optimizer_while_generating") &&
        !spec.get_bool("actor.adam_offload");
    in.nccl_communicators = (cuda && in.group_size > 1 ? 1 : 0) + (sync_over_nccl ? 1 : 0);
  } else if (role == Role::kRollout) {
    in.sleeps_outside_generate = takes_turns && spec.get_bool("rollout.offload_while_training");
    in.generates_while_training = async;
    const int64_t tp = spec.get_int("rollout.tensor_parallel_size");
    in.nccl_communicators = (cuda && tp > 1 ? 1 : 0) + (sync_over_nccl ? 1 : 0);
  } else if (cuda && in.group_size > 1 &&
             (spec.trains(role) ||
              spec.get_int(std::string(role_name(role)) + ".zero_stage") == 3)) {
    in.nccl_communicators = 1;
  }
}

}  // namespace

RoleMemoryInput role_memory_input(const JobSpec& spec, Role role, const Placement& placement,
                                  const models::ModelConfig& model) {
  const std::string r = role_name(role);
  RoleMemoryInput in;
  in.role = r;
  in.model = model;
  if (role == Role::kCritic || role == Role::kReward) in.model.head = models::HeadKind::kValue;
  in.lm_head_log_probs = in.model.head == models::HeadKind::kLanguageModel;
  const auto group = placement.group(role);
  in.group_size = std::max<int>(1, static_cast<int>(group.size()));
  if (!group.empty()) in.device_kind = group.front().device_kind;
  in.compute_bytes = spec.get_string(r + ".dtype") == "fp32" ? 4 : 2;
  const bool ppo = spec.kind() == JobKind::kPpo;
  const int64_t prompt = spec.get_int("data.prompt_max_len");
  const int64_t max_len = spec.get_int("data.max_len");
  in.prompt_len = std::min(prompt, max_len);
  in.max_new_tokens = spec.get_int("rollout.max_new_tokens");
  // PPO sequences are a prompt and a response; other jobs read data.max_len tokens.
  in.seq_len = ppo ? std::min(max_len, in.prompt_len + in.max_new_tokens) : max_len;
  in.rollout_micro_batch = spec.get_int("rollout.micro_batch_size");
  in.n_samples = spec.get_int("rollout.n_samples_per_prompt");
  if (spec.at("rollout.kv_cache_memory_gb").is_string()) {  // "auto": plan_memory sizes it
    in.kv_auto = in.device_kind == DeviceKind::kCuda;
  } else {
    in.kv_cache_budget = static_cast<int64_t>(spec.get_float("rollout.kv_cache_memory_gb") *
                                              static_cast<double>(1ll << 30));
  }
  in.gpu_memory_utilization = spec.get_float("rollout.gpu_memory_utilization");
  in.logits_chunk_tokens = spec.get_int("train.logits_chunk_tokens");
  set_phase_flags(spec, role, placement, in);
  in.kv_block_size = spec.get_int("rollout.kv_block_size");
  in.max_num_seqs = spec.get_int("rollout.max_num_seqs");
  in.decode_graphs = in.device_kind == DeviceKind::kCuda && !spec.get_bool("rollout.enforce_eager");
  // DPO and RM batches hold chosen and rejected together.
  const int64_t pair = spec.kind() == JobKind::kDpo || spec.kind() == JobKind::kRm ? 2 : 1;
  if (spec.trains(role)) {
    in.work = RoleWork::kTrain;
    in.zero_stage = static_cast<int>(std::max<int64_t>(1, spec.get_int(r + ".zero_stage")));
    in.adam_offload = spec.get_bool(r + ".adam_offload");
    in.checkpointing = spec.get_bool(r + ".gradient_checkpointing");
    in.micro_batch = spec.get_int("train.micro_batch_size") * pair;
    set_lora_input(spec, r, in);
    if (ppo) in.infer_micro_batch = in.rollout_micro_batch * in.n_samples;
  } else if (role == Role::kRollout) {
    in.work = RoleWork::kGenerate;
    in.micro_batch = in.rollout_micro_batch * in.n_samples;
    in.tensor_parallel = static_cast<int>(spec.get_int("rollout.tensor_parallel_size"));
  } else {
    in.work = RoleWork::kInfer;
    in.shard_weights =
        (role == Role::kRef || role == Role::kReward) && spec.get_int(r + ".zero_stage") == 3;
    // PPO scores experience in micro batches of rollout mb x n (ppo/driver.cpp).
    in.micro_batch =
        ppo ? in.rollout_micro_batch * in.n_samples : spec.get_int("train.micro_batch_size") * pair;
  }
  // A PPO token budget splits every scoring and training forward into parts of at most
  // max(1, budget / length) rows (actors/model_operations.cpp: budget_ranges).
  const int64_t budget = spec.get_int("train.max_tokens_per_micro_batch");
  if (ppo && budget > 0 && in.work != RoleWork::kGenerate) {
    const int64_t rows = std::max<int64_t>(1, budget / in.seq_len);
    in.micro_batch = std::min(in.micro_batch, rows);
    if (in.infer_micro_batch > 0) in.infer_micro_batch = std::min(in.infer_micro_batch, rows);
  }
  return in;
}

std::map<Role, models::ModelConfig> load_role_models(const JobSpec& spec,
                                                     std::vector<std::string>& missing) {
  std::map<Role, models::ModelConfig> out;
  for (Role role : spec.used_roles()) {
    const std::string ref = spec.get_string(std::string(role_name(role)) + ".model");
    const bool preset = ref.rfind(models::kArchitecturePrefix, 0) == 0;
    const fs::path file = fs::is_regular_file(ref) ? fs::path(ref) : fs::path(ref) / "config.json";
    if (ref.empty() || (!preset && !fs::exists(file))) {
      missing.push_back(std::string(role_name(role)) + ": " +
                        (ref.empty() ? "(no model set)" : file.string()));
      continue;
    }
    out[role] = models::model_config_of(ref);
  }
  return out;
}

bool MemoryPlan::fits() const {
  return std::all_of(devices.begin(), devices.end(), [](const DevicePlan& d) { return d.fits(); });
}

const RolePlan* MemoryPlan::role(const std::string& name) const {
  for (const auto& r : roles)
    if (r.input.role == name) return &r;
  return nullptr;
}

json MemoryPlan::to_json() const {
  json roles_json = json::object();
  for (const auto& r : roles) {
    json j = r.terms.to_json();
    j["group_size"] = r.input.group_size;
    j["micro_batch"] = r.input.micro_batch;
    j["seq_len"] = r.input.seq_len;
    if (r.input.shard_weights) j["zero_stage"] = 3;
    if (r.input.work == RoleWork::kGenerate) {
      j["tensor_parallel_size"] = r.input.tensor_parallel;
      j["kv_cache_auto"] = r.input.kv_auto;
    }
    if (r.input.work == RoleWork::kTrain) {
      j["zero_stage"] = r.input.zero_stage;
      j["gradient_checkpointing"] = r.input.checkpointing;
      j["adam_offload"] = r.input.adam_offload;
    }
    j["dominant"] = r.terms.dominant().first;
    roles_json[r.input.role] = j;
  }
  json devices_json = json::array();
  for (const auto& d : devices)
    devices_json.push_back({{"node", d.node},
                            {"device", d.device_id},
                            {"capacity", d.capacity},
                            {"roles", d.roles},
                            {"phases", d.phases},
                            {"peak_phase", d.peak_phase},
                            {"total", d.total},
                            {"fits", d.fits()}});
  json s = json::array();
  for (const auto& x : suggestions)
    s.push_back({{"change", x.change},
                 {"new_total", x.new_total},
                 {"fits", x.fits},
                 {"costs_throughput", x.costs_throughput}});
  return {{"fits", fits()},
          {"kv_auto_error", kv_auto_error.empty() ? json(nullptr) : json(kv_auto_error)},
          {"roles", roles_json},
          {"devices", devices_json},
          {"suggestions", s},
          {"note",
           "per-rank bytes; engine_peak is what the trainer's tracker counts (measured "
           "peak_tensor_bytes)"}};
}

namespace {

// A spec change worth trying, and whether it fits by doing less or more slowly per step
// (recompute, host round trips, smaller batches, shorter sequences) rather than by placing
// the same work better (phases, the KV pool, tensor parallelism, sharding, more devices).
struct Candidate {
  std::string change;
  bool costs_throughput = false;
};

// Candidates that keep throughput for the roles on one device: sleep mode and the KV pool
// where the rollout shares a GPU, wider engines, sharding, more devices.
void placement_changes(const JobSpec& spec, const MemoryPlan& plan, const DevicePlan& device,
                       const Placement& placement, const std::set<std::string>& names,
                       std::vector<Candidate>& out) {
  for (const auto& name : names) {
    const RolePlan* r = plan.role(name);
    if (!r) continue;
    const RoleMemoryInput& in = r->input;
    if (in.work == RoleWork::kGenerate && in.device_kind == DeviceKind::kCuda) {
      if (in.sync_over_ipc && !in.sleeps_outside_generate && !in.generates_while_training &&
          !spec.get_bool("rollout.offload_while_training"))
        out.push_back({"rollout.offload_while_training=true", false});
      if (!in.kv_auto) out.push_back({"rollout.kv_cache_memory_gb=auto", false});
    }
    if (in.sends_weights && in.sync_over_ipc && !in.offloads_states_while_generating &&
        !in.adam_offload && spec.get_int("algo.async_steps") == 0)
      out.push_back({"actor.offload_optimizer_while_generating=true", false});
    // Engines twice as wide over the same workers: each rank holds half the weights and KV.
    const int wider = 2 * in.tensor_parallel;
    if (in.work == RoleWork::kGenerate && in.group_size % wider == 0) {
      try {
        models::check_tensor_parallel(in.model, wider, name);
        out.push_back({name + ".tensor_parallel_size=" + std::to_string(wider), false});
      } catch (const InputError&) {
        // The model's heads or vocabulary do not split that many ways.
      }
    }
    if (in.work == RoleWork::kTrain && in.zero_stage == 1)
      out.push_back({name + ".zero_stage=2", false});
  }
  // Spread a role over twice the devices, taking free ones of the same node.
  std::set<int> used;
  for (const auto& w : placement.workers)
    if (w.node == device.node) used.insert(w.device_id);
  int node_devices = 0;
  for (const auto& n : placement.nodes)
    if (n.name == device.node) node_devices = n.devices;
  for (const auto& name : names) {
    const RolePlan* r = plan.role(name);
    // More ranks help where weights or states are sharded: trainers, ZeRO-3 ref/reward.
    if (!r || (r->input.work != RoleWork::kTrain && !r->input.shard_weights)) continue;
    auto group = placement.group(parse_role(name));
    std::vector<int> ids;
    for (const auto& w : group) ids.push_back(w.device_id);
    for (int d = 0; d < node_devices && ids.size() < 2 * group.size(); ++d)
      if (!used.count(d)) ids.push_back(d);
    if (ids.size() < 2 * group.size()) continue;
    std::string list;
    for (int d : ids) list += (list.empty() ? "" : ",") + std::to_string(d);
    out.push_back({name + ".devices=[" + list + "]", false});
  }
}

// Spec changes worth trying for the roles on one device: those that keep throughput first,
// then those that cost it, each group in the order a practitioner would reach for them.
std::vector<Candidate> candidate_changes(const JobSpec& spec, const MemoryPlan& plan,
                                         const DevicePlan& device, const Placement& placement) {
  std::vector<Candidate> out;
  std::set<std::string> names;
  for (const auto& label : device.roles) names.insert(label.substr(0, label.find('[')));
  placement_changes(spec, plan, device, placement, names, out);
  bool trains = false, generates = false, infers = false;
  for (const auto& name : names) {
    const RolePlan* r = plan.role(name);
    if (!r) continue;
    if (r->input.work == RoleWork::kTrain) {
      trains = true;
      if (r->input.zero_stage == 2) out.push_back({name + ".zero_stage=3", true});
      if (!r->input.checkpointing) out.push_back({name + ".gradient_checkpointing=true", true});
      if (!r->input.adam_offload && r->input.device_kind == DeviceKind::kCuda)
        out.push_back({name + ".adam_offload=true", true});
    }
    generates |= r->input.work == RoleWork::kGenerate;
    infers |= r->input.work == RoleWork::kInfer;
    if (r->input.work == RoleWork::kInfer && (name == "ref" || name == "reward") &&
        !r->input.shard_weights && r->input.group_size > 1)
      out.push_back({name + ".zero_stage=3", true});
  }
  const int64_t train_mb = spec.get_int("train.micro_batch_size");
  if (trains && train_mb > 1)
    out.push_back({"train.micro_batch_size=" + std::to_string(train_mb / 2), true});
  const int64_t rollout_mb = spec.get_int("rollout.micro_batch_size");
  if ((generates || infers) && rollout_mb > 1)
    out.push_back({"rollout.micro_batch_size=" + std::to_string(rollout_mb / 2), true});
  const int64_t max_len = spec.get_int("data.max_len");
  if (max_len > 2) out.push_back({"data.max_len=" + std::to_string(max_len / 2), true});
  return out;
}

// Bytes over capacity, summed over devices (0 when everything fits).
int64_t overflow(const MemoryPlan& plan) {
  int64_t over = 0;
  for (const auto& d : plan.devices) over += std::max<int64_t>(0, d.total - d.capacity);
  return over;
}

int64_t device_total(const MemoryPlan& plan, const DevicePlan& device) {
  for (const auto& d : plan.devices)
    if (d.node == device.node && d.device_id == device.device_id) return d.total;
  return 0;
}

// `spec` with one more override, or nothing when it breaks a rule (batch divisibility, ...).
std::optional<JobSpec> with_change(const JobSpec& spec, const std::string& change) {
  try {
    return JobSpec::parse(spec.json().dump(), spec.source(), {change});
  } catch (const InputError&) {
    return std::nullopt;
  }
}

// Each candidate alone (reported with the worst device's new total); when none fits alone,
// also the greedy combination: candidates in order, each kept if it lowers the overflow,
// until everything fits.
// The plan of `spec`, or nothing when it cannot be planned (a KV pool below one sequence).
std::optional<MemoryPlan> plan_again(const JobSpec& spec,
                                     const std::map<Role, models::ModelConfig>& models) {
  try {
    return plan_memory(spec, models, false);
  } catch (const InputError&) {
    return std::nullopt;
  }
}

// Each candidate alone (reported with the worst device's new total); when none fits alone,
// first the combination as one --set line: candidates in order (those that keep throughput
// first), each kept if it lowers the bytes over capacity, until everything fits; a key
// appears once, with its last value.
void add_suggestions(const JobSpec& spec, const std::map<Role, models::ModelConfig>& models,
                     const Placement& placement, MemoryPlan& plan) {
  const DevicePlan* worst = nullptr;
  std::vector<Candidate> candidates;
  auto add_new = [](std::vector<Candidate>& to, const std::vector<Candidate>& from) {
    for (const auto& c : from)
      if (std::none_of(to.begin(), to.end(),
                       [&](const Candidate& x) { return x.change == c.change; }))
        to.push_back(c);
  };
  for (const auto& d : plan.devices) {
    if (d.fits()) continue;
    if (!worst || d.total - d.capacity > worst->total - worst->capacity) worst = &d;
    add_new(candidates, candidate_changes(spec, plan, d, placement));
  }
  if (!worst) return;
  bool any_fits = false;
  for (const auto& c : candidates) {
    auto changed = with_change(spec, c.change);
    if (!changed) continue;
    const auto again = plan_again(*changed, models);
    if (!again) continue;
    plan.suggestions.push_back(
        {c.change, device_total(*again, *worst), again->fits(), c.costs_throughput});
    any_fits |= again->fits();
  }
  // Fitting first; among them, those that keep throughput.
  std::stable_sort(plan.suggestions.begin(), plan.suggestions.end(),
                   [](const PlanSuggestion& a, const PlanSuggestion& b) {
                     if (a.fits != b.fits) return a.fits;
                     return a.fits && !a.costs_throughput && b.costs_throughput;
                   });
  if (any_fits) return;
  JobSpec current = spec;
  int64_t over = overflow(plan);
  std::vector<std::pair<std::string, std::string>> combined;
  bool costs = false;
  auto add_change = [&combined](const std::string& change) {
    const auto eq = change.find('=');
    const std::string key = change.substr(0, eq), value = change.substr(eq + 1);
    for (auto& kv : combined)
      if (kv.first == key) return void(kv.second = value);
    combined.push_back({key, value});
  };
  MemoryPlan last = plan;
  // Rounds: the candidates of the changed spec again (a micro batch can halve twice).
  for (int round = 0; round < 6 && over > 0; ++round) {
    const int64_t before = over;
    const Placement now = place(current);
    std::vector<Candidate> next;
    for (const auto& d : last.devices)
      if (!d.fits()) add_new(next, candidate_changes(current, last, d, now));
    std::stable_partition(next.begin(), next.end(),
                          [](const Candidate& c) { return !c.costs_throughput; });
    for (const auto& c : next) {
      auto changed = with_change(current, c.change);
      if (!changed) continue;
      auto again = plan_again(*changed, models);
      if (!again || overflow(*again) >= over) continue;
      current = *changed;
      over = overflow(*again);
      last = std::move(*again);
      add_change(c.change);
      costs |= c.costs_throughput;
      if (over == 0) break;
    }
    if (over == before) break;
  }
  std::string text;
  for (const auto& [key, value] : combined)
    text += (text.empty() ? "" : " --set ") + key + "=" + value;
  // Not when it is one of the single changes already listed.
  if (!text.empty() && std::none_of(plan.suggestions.begin(), plan.suggestions.end(),
                                    [&](const PlanSuggestion& x) { return x.change == text; }))
    plan.suggestions.insert(plan.suggestions.begin(),
                            {text, device_total(last, *worst), over == 0, costs});
}

}  // namespace

namespace {

// The devices' phase tables from the roles' (a device's total is its largest phase).
void fill_devices(const Placement& placement, MemoryPlan& plan) {
  plan.devices.clear();
  std::map<std::pair<std::string, int>, size_t> index;
  for (const auto& w : placement.workers) {
    auto key = std::make_pair(w.node, w.device_id);
    if (!index.count(key)) {
      DevicePlan d;
      d.node = w.node;
      d.device_id = w.device_id;
      for (const auto& n : placement.nodes)
        if (n.name == w.node)
          d.capacity = static_cast<int64_t>(n.memory_gb * static_cast<double>(1ll << 30));
      index[key] = plan.devices.size();
      plan.devices.push_back(d);
    }
    DevicePlan& d = plan.devices[index[key]];
    d.roles.push_back(w.label());
    const RolePlan* r = plan.role(role_name(w.role));
    if (!r) continue;
    for (const auto& [phase, bytes] : r->terms.phases) d.phases[phase] += bytes;
  }
  for (auto& d : plan.devices) {
    d.total = 0;
    for (const auto& [phase, bytes] : d.phases) {
      if (bytes > d.total) {
        d.total = bytes;
        d.peak_phase = phase;
      }
    }
  }
}

// rollout.kv_cache_memory_gb "auto" (vLLM's profile-then-fill): on every device of the
// rollout, capacity x gpu_memory_utilization less what the generate phase holds beside the
// KV cache; the pool is the smallest over the rollout's devices (every rank runs the same
// engine), and never more than max_num_seqs full-length sequences need.
void size_auto_kv_cache(const Placement& placement, MemoryPlan& plan) {
  RolePlan* rollout = nullptr;
  for (auto& r : plan.roles)
    if (r.input.work == RoleWork::kGenerate && r.input.kv_auto) rollout = &r;
  if (!rollout) return;
  std::optional<int64_t> budget;
  std::string where;
  for (const auto& d : plan.devices) {
    if (std::none_of(d.roles.begin(), d.roles.end(),
                     [](const std::string& l) { return l.rfind("rollout[", 0) == 0; }))
      continue;
    const int64_t others = d.phases.at("generate") - rollout->terms.kv_cache;
    const int64_t left = static_cast<int64_t>(static_cast<double>(d.capacity) *
                                              rollout->input.gpu_memory_utilization) -
                         others;
    if (!budget || left < *budget) {
      budget = left;
      where = d.node + ":" + std::to_string(d.device_id);
    }
  }
  if (!budget) return;
  // A pool below one sequence is the same bad input as a too-small explicit budget: a run
  // stops on it (kv_cache_gb_for_run); the plan shows the device over budget with the
  // smallest pool that works, so that its suggestions apply.
  const int64_t least = one_sequence_kv_bytes(rollout->input);
  rollout->input.kv_cache_budget = std::max(*budget, least);
  if (*budget < least) {
    char util[16];
    std::snprintf(util, sizeof util, "%.0f%%", 100 * rollout->input.gpu_memory_utilization);
    plan.kv_auto_error = "rollout.kv_cache_memory_gb auto: " + where + " has " +
                         format_gib(std::max<int64_t>(*budget, 0)) +
                         " GiB left for the KV cache in the generate phase (" + util +
                         " of its memory less every other term), less than one sequence of " +
                         std::to_string(rollout->input.prompt_len) + " + " +
                         std::to_string(rollout->input.max_new_tokens) + " tokens needs (" +
                         format_gib(least) + " GiB)";
  }
  rollout->terms = plan_role(rollout->input);
  fill_devices(placement, plan);
}

}  // namespace

MemoryPlan plan_memory(const JobSpec& spec, const std::map<Role, models::ModelConfig>& models,
                       bool suggest) {
  const Placement placement = place(spec);
  MemoryPlan plan;
  for (Role role : spec.used_roles()) {
    auto it = models.find(role);
    if (it == models.end())
      throw InputError(std::string("memory plan: no model config for ") + role_name(role) + " (" +
                       spec.get_string(std::string(role_name(role)) + ".model") + "/config.json)");
    RolePlan rp;
    rp.input = role_memory_input(spec, role, placement, it->second);
    rp.terms = plan_role(rp.input);
    plan.roles.push_back(rp);
  }
  fill_devices(placement, plan);
  size_auto_kv_cache(placement, plan);
  if (suggest) add_suggestions(spec, models, placement, plan);
  return plan;
}

double kv_cache_gb_for_run(const JobSpec& spec) {
  if (!spec.at("rollout.kv_cache_memory_gb").is_string())
    return spec.get_float("rollout.kv_cache_memory_gb");
  const Placement placement = place(spec);
  const auto group = placement.group(Role::kRollout);
  if (group.empty() || group.front().device_kind != DeviceKind::kCuda) return 0.0;
  std::vector<std::string> missing;
  const auto models = load_role_models(spec, missing);
  if (!missing.empty())
    throw InputError(
        "rollout.kv_cache_memory_gb auto: the plan needs every role's config.json; "
        "missing " +
        missing.front());
  const MemoryPlan plan = plan_memory(spec, models, /*suggest=*/false);
  if (!plan.kv_auto_error.empty()) throw InputError(plan.kv_auto_error);
  const RolePlan* r = plan.role("rollout");
  return r ? static_cast<double>(r->input.kv_cache_budget) / static_cast<double>(1ll << 30) : 0.0;
}

}  // namespace rlhf::engine
