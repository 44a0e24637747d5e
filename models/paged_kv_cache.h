// Keys and values of many sequences in one pool of fixed-size blocks (vLLM's PagedAttention
// layout): per layer a [num_blocks, block_size, kv_heads, head_dim] buffer, and per
// sequence a block table. A sequence holds only the blocks its tokens fill, so a budget
// holds as many sequences as their actual lengths allow, and sequences forked from one
// prompt share the prompt's blocks until one of them writes into a shared block
// (copy-on-write). A sequence stores its tokens only (no padding): position j of a sequence
// is its j-th token. Does not decide which sequences run, join or are preempted: rollout/'s
// scheduler does.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "kernels/kernels.h"
#include "models/config.h"
#include "models/kv_cache.h"

namespace rlhf::models {

struct AttentionInputs;

class PagedKvCache final : public KvStore {
 public:
  PagedKvCache(const ModelConfig& config, int64_t num_blocks, int64_t block_size,
               torch::Dtype dtype, torch::Device device = torch::kCPU);

  // Bytes of one block: keys and values of `block_size` positions in every layer.
  static int64_t block_bytes(const ModelConfig& config, int64_t block_size, torch::Dtype dtype);
  // The same for `element_bytes`-byte entries: what the memory planner sizes the pool with.
  static int64_t block_bytes(const ModelConfig& config, int64_t block_size, int64_t element_bytes);

  int64_t num_blocks() const { return static_cast<int64_t>(refs_.size()); }
  int64_t block_size() const { return block_size_; }
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size()); }
  int64_t blocks_for(int64_t tokens) const { return (tokens + block_size_ - 1) / block_size_; }

  // Sequences, by id. create(): an empty sequence. fork(): a sequence holding the parent's
  // positions, sharing its blocks. release(): the id is gone and blocks no other sequence
  // holds return to the pool.
  int64_t create();
  int64_t fork(int64_t parent);
  void release(int64_t seq);
  // Every sequence released: ids start again from 0 (a pool kept across requests does not
  // grow its table). Throws while a sequence is alive.
  void forget_released();
  int64_t length(int64_t seq) const;

  // Blocks reserve(seq, tokens) would take from the pool: new blocks for positions past
  // the sequence's last block, plus a copy of its last block when that is shared and
  // partly filled (the first write into it copies it).
  int64_t blocks_needed(int64_t seq, int64_t tokens) const;
  // Makes room for `tokens` more positions of `seq`; false, changing nothing, when the pool
  // has fewer free blocks than blocks_needed.
  bool reserve(int64_t seq, int64_t tokens);

  // The next forward, over sequences `seqs` in batch order (each reserved for its new
  // tokens). Prefill: `mask` [B, T] marks each row's new tokens (1; left padding 0); the
  // sequences must be empty, and the new tokens attend among themselves (the model's
  // ordinary mask). Decode: one new token per sequence, attending to all its positions.
  void plan_prefill(const std::vector<int64_t>& seqs, const torch::Tensor& mask);
  void plan_decode(const std::vector<int64_t>& seqs);
  // Extend (a multi-turn rollout's next turn over the cache, issue 31): sequences that hold
  // positions take new tokens, `mask` [B, T] marking each row's new tokens (1, left-aligned;
  // right padding 0). New token t of a row sits at position length + t and attends to every
  // position the sequence holds and to the row's new tokens up to itself: the same keys a
  // forward of the whole sequence gives it, without recomputing the held prefix.
  void plan_extend(const std::vector<int64_t>& seqs, const torch::Tensor& mask);
  // Drops positions `length` and after of `seq` (a row fed padding after its turn ended);
  // blocks past the new end go back to the pool.
  void truncate(int64_t seq, int64_t length);

  // Decode steps of a fixed shape, for CUDA graphs (rollout/decode_graph.h): `batch` rows,
  // the first seqs.size() of them `seqs` and the rest padding, and M blocks per table.
  // fill_decode_inputs writes the step's inputs (int64) to out[0, decode_inputs_size):
  // slots [batch], positions [batch], block tables [batch, M]. Padding rows, and table
  // entries past a sequence's blocks, point at a scratch block that no sequence holds.
  static int64_t decode_inputs_size(int64_t batch, int64_t M) { return batch * (2 + M); }
  void fill_decode_inputs(const std::vector<int64_t>& seqs, int64_t batch, int64_t M,
                          int64_t* out) const;
  // Plans a decode step over `seqs` from device tensors holding fill_decode_inputs' output:
  // slots [batch], positions [batch, 1], blocks [batch * M]. The forward derives the mask
  // from the positions on the device, so its kernels depend on the tensors' contents only:
  // a graph captured for one step replays for any step of the same shape. Capturing plans
  // with no seqs (nothing is marked filled after it).
  void plan_decode_static(const std::vector<int64_t>& seqs, const torch::Tensor& slots,
                          const torch::Tensor& positions, const torch::Tensor& blocks);
  // The planned forward's position ids [B, T] and attention inputs (mask, causal) for layers
  // that attend within `window` keys (0: every key): the config's sliding_window, or its
  // local_window for local layers (LayerSpec::local_attention). A sequence keeps every
  // position's blocks: a window hides keys, it frees no memory.
  const torch::Tensor& positions() const { return positions_; }
  void attention(AttentionInputs& in, int64_t window) const;
  // KvStore: writes the new tokens' keys/values into their blocks; returns the prefill's own
  // keys/values, or each decoding sequence's positions gathered from its blocks ([B,
  // kv_heads, S, head_dim], S = the longest table's blocks x block_size; the mask hides the
  // positions past each sequence's length).
  std::pair<torch::Tensor, torch::Tensor> append(int64_t layer, const torch::Tensor& k,
                                                 const torch::Tensor& v) override;
  // KvStore: on a GPU, decode steps attend in place with FlashInfer's paged decode
  // (kernels/), reading each row's blocks where they are instead of gathering them into dense
  // tensors; undefined where it does not apply (prefill, the CPU, a layer with a window, shapes
  // kernels::paged_decode_supported refuses, or set_in_place_decode(false)).
  torch::Tensor append_and_attend(int64_t layer, const torch::Tensor& q, const torch::Tensor& k,
                                  const torch::Tensor& v, double scale) override;
  // On by default; off makes every decode step gather + SDPA (the reference in tests).
  void set_in_place_decode(bool on) { in_place_decode_ = on; }
  // After the forward: the planned sequences' lengths include their new tokens.
  void finish_step();

 private:
  struct Sequence {
    std::vector<int64_t> blocks;
    int64_t length = 0;
    bool alive = false;
  };
  Sequence& sequence(int64_t seq);
  const Sequence& sequence(int64_t seq) const;
  int64_t take_block();
  void drop_block(int64_t block);
  // Slot (block * block_size + offset) of position `pos` of sequence `s`.
  int64_t slot(const Sequence& s, int64_t pos) const;

  int64_t scratch_block() const { return num_blocks(); }  // the pool's extra block

  int64_t block_size_;
  int64_t sliding_window_;              // the config's; the planned masks hold it
  std::vector<int64_t> layer_windows_;  // each layer's (models::layer_window)
  torch::Device device_;
  // Per layer [num_blocks + 1, block_size, kv_heads, head_dim]: the last block is scratch,
  // written and read by the padding rows of fixed-shape decode steps.
  std::vector<torch::Tensor> keys_;
  std::vector<torch::Tensor> values_;  // per layer, as keys_
  std::vector<int64_t> refs_;          // sequences holding each block
  std::vector<int64_t> free_;          // blocks with no holder (a stack)
  std::vector<Sequence> sequences_;

  // The planned step.
  enum class Step { kNone, kPrefill, kDecode, kStaticDecode, kExtend };
  Step step_ = Step::kNone;
  int64_t step_batch_ = 0;  // rows of the planned forward (> step_seqs_ with padding)
  std::vector<int64_t> step_seqs_;
  std::vector<int64_t> step_tokens_;  // new tokens per planned sequence
  torch::Tensor write_rows_;          // prefill: rows of the flattened [B * T] new tokens kept
  torch::Tensor write_slots_;         // where each kept new token's key/value goes
  torch::Tensor read_blocks_;         // decode: [B * M] block ids (M >= longest table)
  torch::Tensor positions_;           // [B, T] int64
  torch::Tensor prefill_mask_;        // prefill: the caller's [B, T] mask
  // decode: [B, 1, 1, M * block_size] bool; extend: [B, 1, T, M * block_size]
  std::optional<torch::Tensor> decode_mask_;
  bool in_place_decode_ = true;
  // The step's FlashInfer page table, built by the first layer that attends in place (inside
  // a graph capture, so replays rebuild it from the static inputs).
  std::optional<kernels::PagedDecodePlan> decode_plan_;
};

}  // namespace rlhf::models
