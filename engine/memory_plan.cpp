// Memory planner: the engine's model states replayed exactly (unit by unit, as ShardedUnit
// and Trainer allocate and free them), activations and log-prob buffers counted from the
// tensors the model code saves for backward, and the search for a change that fits.
#include "engine/memory_plan.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "core/errors.h"
#include "core/text.h"
#include "engine/memory_suggestions.h"
#include "engine/sharded_unit_memory.h"
#include "models/activation_memory.h"
#include "models/decoder_layer.h"
#include "models/expert_parallel.h"
#include "models/layer_spec.h"
#include "models/lora.h"
#include "models/paged_kv_cache.h"
#include "models/param_layout.h"
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

int64_t div_up(int64_t a, int64_t b) {
  return (a + b - 1) / b;
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

// From the model's own parameter layout (models/param_layout.h), unit by unit.
std::vector<int64_t> unit_numels(const models::ModelConfig& c) {
  std::vector<int64_t> units;
  for (const auto& unit : models::parameter_units(c)) units.push_back(models::numel_of(unit));
  return units;
}

std::vector<int64_t> largest_param_numels(const models::ModelConfig& c) {
  std::vector<int64_t> out;
  for (const auto& unit : models::parameter_units(c)) {
    int64_t largest = 0;
    for (const auto& [name, shape] : unit) largest = std::max(largest, models::numel_of(shape));
    out.push_back(largest);
  }
  return out;
}

namespace {

// Whether a target_modules list adapts the decoder linear `name` (models/lora.cpp: PEFT's
// match, a module name equal to or ending in ".<target>"; the short name is the module's tail).
bool lora_adapts(const std::vector<std::string>& targets, const std::string& name) {
  return std::any_of(targets.begin(), targets.end(), [&](const std::string& t) {
    return t == "all-linear" || t == name || ends_with(t, "." + name);
  });
}

// The decoder linears LoRA can adapt (models::lora_module_names), from one layer of the
// model's parameter layout: {short name, [out, in]}.
std::vector<std::pair<std::string, std::vector<int64_t>>> adaptable_linears(
    const models::ModelConfig& c) {
  const auto& names = models::lora_module_names();
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  const auto units = models::parameter_units(c);
  if (units.size() < 3) return out;  // no decoder layer
  for (const auto& [name, shape] : units[1]) {
    if (shape.size() != 2 || !ends_with(name, ".weight")) continue;
    const std::string module = name.substr(0, name.size() - 7);
    const std::string short_name = module.substr(module.rfind('.') + 1);
    if (std::find(names.begin(), names.end(), short_name) != names.end())
      out.emplace_back(short_name, shape);
  }
  return out;
}

}  // namespace

// Per adapted linear [out, in]: A [r, in] and B [out, r]; a value head is trained beside the
// adapters (PEFT's modules_to_save).
std::vector<int64_t> lora_unit_numels(const models::ModelConfig& c, int64_t r,
                                      const std::vector<std::string>& targets) {
  int64_t layer = 0;
  for (const auto& [name, shape] : adaptable_linears(c))
    if (lora_adapts(targets, name)) layer += r * (shape[0] + shape[1]);
  std::vector<int64_t> units = {0};
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) units.push_back(layer);
  units.push_back(c.head == models::HeadKind::kValue ? c.hidden_size : 0);
  return units;
}

// The smallest KV budget a rollout rank can generate with: one full-length sequence's blocks.
int64_t one_sequence_kv_bytes(const RoleMemoryInput& in) {
  const int tp = in.tensor_parallel;
  const models::ModelConfig lc =
      tp > 1 ? models::tensor_parallel_shard_config(in.model, tp) : in.model;
  const int64_t capacity = in.prompt_len + in.max_new_tokens;
  return models::PagedKvCache::block_bytes(lc, in.kv_block_size, in.compute_bytes) *
         div_up(capacity, in.kv_block_size);
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
    t.activations = models::inference_bytes(c, in.micro_batch, in.seq_len, e, in.device_kind);
    if (lm)
      t.log_probs = models::log_prob_bytes(c, in.micro_batch, scored_positions(in),
                                           in.logprob_chunk, in.logits_chunk_tokens, e, false);
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
  // Paged (rollout/paged_generate.cpp): one pool of blocks, the budget's or what
  // max_num_seqs full-length sequences fill; a prefill forward of at most mb prompts;
  // decode logits for max_num_seqs rows.
  const int64_t bs = in.kv_block_size;
  if (bs < 1) throw InputError("rollout.kv_block_size must be >= 1, got " + std::to_string(bs));
  const int64_t block = models::PagedKvCache::block_bytes(lc, bs, e);  // the pool's own count
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
      models::inference_bytes(lc, in.rollout_micro_batch, in.prompt_len, e, in.device_kind, true),
      gather);
  t.log_probs = logits_bytes(seqs);
  // With CUDA graphs every captured shape writes its logits into one [seqs, 1, V] buffer in
  // the compute dtype, held for the engine's life (rollout/decode_graph.h: PagedDecoder).
  if (in.decode_graphs) t.log_probs += seqs * c.vocab_size * e;
  t.step_peak = t.kv_cache + t.activations + t.log_probs;
  t.kv_sequences = blocks / per_seq;
  t.sync = sync_receive_bytes(in, numel);
}

void plan_sync_and_save(const RoleMemoryInput& in, const EngineLayout& layout, int64_t numel,
                        int64_t score_gathered, MemoryTerms& t);

// What LoRA adds to a training step's saved activations (models/linear.cpp): per adapted
// linear the [B T, r] product x A^T in e that B's backward reads and, with lora.dropout > 0,
// the dropped input [B T, in] in e that A's backward reads plus what dropout keeps for its
// own backward (CPU: at::dropout's scaled noise, [B T, in] in e; CUDA: native_dropout's
// bool mask, 1 byte each). Kept for every layer without checkpointing, for the one
// recomputed layer with it.
int64_t lora_activation_bytes(const RoleMemoryInput& in, int64_t e) {
  if (in.lora_rank <= 0) return 0;
  const models::ModelConfig& c = in.model;
  const int64_t mask_bytes = in.device_kind == DeviceKind::kCuda ? 1 : e;
  int64_t per_token = 0;  // bytes per token and layer
  for (const auto& [name, shape] : adaptable_linears(c)) {
    if (!lora_adapts(in.lora_targets, name)) continue;
    per_token += in.lora_rank * e;
    if (in.lora_dropout > 0) per_token += shape[1] * (e + mask_bytes);  // the linear's input
  }
  const int64_t layers = in.checkpointing ? 1 : c.num_hidden_layers;
  return layers * in.micro_batch * in.seq_len * per_token;
}

// Expert parallelism's buffers in a sparse layer's forward beside what the block saves
// (models::training_bytes counts a gathered row, an output and a weighted output per token
// and slot, which the dispatched block keeps alike): the rows this rank sends and the expert
// outputs it returns, [tokens x top-k, H] each in e, as many arriving as leave (balanced
// routing; a skewed router sends more to some ranks).
int64_t all_to_all_bytes(const RoleMemoryInput& in, const EngineLayout& layout, int64_t e) {
  if (layout.experts.empty()) return 0;
  return 2 * in.micro_batch * in.seq_len * in.model.moe.num_experts_per_tok * in.model.hidden_size *
         e;
}

// The trainer's units as ShardedUnit lays them out: the trained elements per unit and, under
// LoRA, the frozen base's (whole on every rank at stage 1/2, sharded at stage 3); the
// adapters and a value head are trained.
EngineLayout trainer_layout(const RoleMemoryInput& in) {
  const models::ModelConfig& c = in.model;
  EngineLayout l;
  l.trained = unit_numels(c);
  if (in.lora_rank > 0) {
    l.frozen = l.trained;
    if (c.head == models::HeadKind::kValue) l.frozen.back() -= c.hidden_size;
    l.trained = lora_unit_numels(c, in.lora_rank, in.lora_targets);
  }
  l.world = static_cast<int>(in.group_size);
  if (in.expert_parallel > 1 && in.lora_rank == 0) {
    // Each sparse layer's routed experts: 1/ep of them on this rank, their own unit.
    l.ep = in.expert_parallel;
    l.edp = std::max(1, l.world / l.ep);
    const auto units = models::parameter_units(c);
    l.experts.assign(units.size(), 0);
    for (size_t u = 0; u < units.size(); ++u) {
      for (const auto& [name, shape] : units[u])
        if (models::expert_index(name) >= 0) l.experts[u] += models::numel_of(shape);
      l.trained[u] -= l.experts[u];
      l.experts[u] /= l.ep;
    }
  }
  l.stage = std::clamp(in.zero_stage, 1, 3);
  l.e = in.compute_bytes;
  l.checkpointing = in.checkpointing;
  l.tied = c.tie_word_embeddings;
  return l;
}

// Model states, engine transients, activations and the phases of a training step.
void plan_trainer(const RoleMemoryInput& in, const EngineLayout& layout, MemoryTerms& t) {
  const models::ModelConfig& c = in.model;
  const std::vector<int64_t>& units = layout.trained;
  const int64_t frozen = layout.frozen_total();
  int64_t numel = 0, largest_frozen = 0;  // trained elements on this rank (its experts)
  for (size_t u = 0; u < units.size(); ++u) {
    numel += units[u] + layout.experts_at(u);
    largest_frozen = std::max(largest_frozen, layout.frozen_at(u));
  }
  const int64_t e = in.compute_bytes;
  const bool lm = c.head == models::HeadKind::kLanguageModel && in.lm_head_log_probs;
  const int stage = layout.stage;
  const bool off_device = in.adam_offload && in.device_kind == DeviceKind::kCuda;
  const EnginePeak p = engine_peak(layout, off_device);
  t.weights = p.weights;
  t.master = p.master;
  t.optimizer = p.optimizer;
  t.grads = p.grads;
  t.gathered = p.gathered;
  t.buffers = p.buffers;
  t.engine_peak = t.weights + p.master + p.optimizer + p.grads + p.gathered + p.buffers;
  // The sharded load (ShardedUnit with a WeightSource): beside the states as they will
  // stay, one FP32 slice of one unit's shard read from the checkpoint.
  int64_t largest_shard = 0;
  for (size_t u = 0; u < units.size(); ++u)
    largest_shard =
        std::max({largest_shard, div_up(units[u], in.group_size), layout.expert_shard(u)});
  t.load = 4 * largest_shard;
  // ZeRO-3 reads a frozen base's shard a slice at a time in the compute dtype (at most the
  // unit's shard); stage 1/2 read each frozen parameter straight into its place.
  if (stage == 3) t.load = std::max(t.load, e * div_up(largest_frozen, in.group_size));
  if (off_device) {
    t.host = t.master + t.optimizer;
    t.master = t.optimizer = 0;
  }
  // Compute-dtype .grad before the engine takes it: one layer at a time with checkpointing
  // (plus embeddings and head, reduced after backward), every parameter without.
  int64_t largest_layer = 0;
  for (size_t u = 1; u + 1 < units.size(); ++u)
    largest_layer = std::max(largest_layer, units[u] + layout.experts_at(u));
  const int64_t grads_in_flight = e * (units.front() + units.back() + largest_layer);
  t.param_grads = in.checkpointing ? grads_in_flight : e * numel;
  t.activations =
      models::training_bytes(c, in.micro_batch, in.seq_len, e, in.checkpointing, in.device_kind) +
      lora_activation_bytes(in, e) + all_to_all_bytes(in, layout, e);
  if (lm)
    t.log_probs = models::log_prob_bytes(c, in.micro_batch, in.seq_len - 1, in.logprob_chunk,
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
  const int64_t activation_phase =
      t.activations + t.log_probs + grads_in_flight + p.forward_gathered;
  const int64_t unreduced = in.checkpointing ? e * (units.front() + units.back()) : e * numel;
  const int64_t reduction_phase = unreduced + t.gathered + t.buffers;
  // A scoring forward (no grad) at stage 3 gathers one unit at a time (Trainer::before_unit,
  // released by after_unit: no graph holds it).
  const int64_t score_gathered = engine_score_gathered(layout);
  int64_t scoring_phase = 0;  // PPO: the trained roles also score experience without grad
  if (in.infer_micro_batch > 0) {
    scoring_phase =
        models::inference_bytes(c, in.infer_micro_batch, in.seq_len, e, in.device_kind) +
        (lm ? models::log_prob_bytes(c, in.infer_micro_batch, scored_positions(in),
                                     in.logprob_chunk, in.logits_chunk_tokens, e, false)
            : 0) +
        score_gathered;
  }
  t.step_peak = std::max({activation_phase, reduction_phase, scoring_phase});
  t.train_peak = std::max(activation_phase, reduction_phase);
  t.score_peak = scoring_phase;
  plan_sync_and_save(in, layout, numel, score_gathered, t);
}

// A trained role's weight sync and save transients, and what its tracker counts per phase.
void plan_sync_and_save(const RoleMemoryInput& in, const EngineLayout& layout, int64_t numel,
                        int64_t score_gathered, MemoryTerms& t) {
  const models::ModelConfig& c = in.model;
  const int64_t e = in.compute_bytes;
  const std::vector<int64_t>& units = layout.trained;
  const int64_t frozen = layout.frozen_total();
  // The weight sync: ZeRO-3 gathers one unit at a time, whole, in the compute dtype (a LoRA
  // sync of the adapters alone leaves the frozen base sharded); ZeRO 1/2 ranks hold the
  // weights whole already.
  const bool adapters_only = frozen > 0 && in.sync_adapters_only;
  int64_t unit_gathered = 0;
  for (size_t u = 0; u < units.size(); ++u)
    unit_gathered = std::max(unit_gathered, layout.gathered_bytes(u, !adapters_only));
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
    if (layout.experts_at(u) == 0) continue;
    // An expert unit (expert parallelism): this EP rank's experts gathered in FP32 over the
    // EDP group, and one expert at a time broadcast to rank 0 (FP32) beside its conversion.
    const int64_t experts = 4 * layout.expert_shard(u) * layout.edp;
    const int64_t one = 4 * layout.experts_at(u) * layout.ep /
                        models::layer_spec(c, static_cast<int64_t>(u) - 1).moe.experts;
    export_device = std::max(export_device, experts + one + (copies ? e * params[u] : 0));
    export_tracked = std::max(export_tracked, experts + one + e * params[u]);
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
    // The adapters alone (rollout.lora_sync adapters) go as they are.
    const std::vector<int64_t> base =
        frozen > 0 && !adapters_only ? unit_numels(c) : std::vector<int64_t>{};
    const int64_t merged = base.empty() ? 0 : e * *std::max_element(base.begin(), base.end());
    int64_t sent = numel;  // the model's elements (every expert, with expert parallelism)
    for (size_t u = 0; u < units.size(); ++u) sent += layout.experts_at(u) * (layout.ep - 1);
    const int64_t bucket =
        std::min(in.sync_bucket_bytes, e * (frozen > 0 && !adapters_only ? frozen : sent));
    // Expert parallelism: a layer's experts end to end and all-gathered over the EP group.
    int64_t experts = 0;
    for (size_t u = 0; u < units.size(); ++u)
      experts = std::max(experts, e * layout.experts_at(u) * (layout.ep + 1));
    t.sync = unit_gathered + bucket + merged + experts;
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
  if (in.work == RoleWork::kTrain) {
    plan_trainer(in, trainer_layout(in), t);
  } else {
    plan_untrained(in, numel, t);
  }
  if (in.device_kind == DeviceKind::kCuda) t.nccl = kNcclCommBytes * in.nccl_communicators;
  fill_phases(in, t);
  return t;
}

transport::CollectiveTraffic plan_collectives(const RoleMemoryInput& in) {
  if (in.work != RoleWork::kTrain) return {};
  return engine_collectives(trainer_layout(in), in.backward_calls);
}

}  // namespace rlhf::engine
