// Per-layer key/value cache for incremental decoding: preallocated [B, kv_heads, capacity,
// head_dim] buffers that each layer appends to. Does not decide what to evict or how
// sequences are batched: that is rollout/'s job.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "models/config.h"

namespace rlhf::models {

// What an attention layer sees of a cache: it hands over its new keys/values and gets back
// those it attends to. KvCache (one contiguous buffer per row) and PagedKvCache (a block
// pool, paged_kv_cache.h) implement it.
class KvStore {
 public:
  virtual ~KvStore() = default;
  // k, v: [B, kv_heads, T, head_dim] of this forward's T new positions in `layer`. Returns
  // the keys/values the new queries attend to, each [B, kv_heads, S, head_dim].
  virtual std::pair<torch::Tensor, torch::Tensor> append(int64_t layer, const torch::Tensor& k,
                                                         const torch::Tensor& v) = 0;
  // Decode steps where the store can attend in place (a paged cache on a GPU with kernels/'s
  // paged decode compiled in): writes k, v as append() does and returns the attention of q
  // [B, heads, 1, head_dim] over each row's cached positions (softmax scale `scale`), [B,
  // heads, 1, head_dim]. Otherwise an undefined tensor, changing nothing: the caller then
  // calls append() and attends to what it returns.
  virtual torch::Tensor append_and_attend(int64_t layer, const torch::Tensor& q,
                                          const torch::Tensor& k, const torch::Tensor& v,
                                          double scale) {
    return {};
  }
};

class KvCache final : public KvStore {
 public:
  KvCache(const ModelConfig& config, int64_t batch, int64_t capacity, torch::Dtype dtype,
          torch::Device device = torch::kCPU);

  // Bytes of a cache of `batch` rows and `capacity` positions (keys and values, every layer).
  static int64_t bytes(const ModelConfig& config, int64_t batch, int64_t capacity,
                       torch::Dtype dtype);

  int64_t batch() const { return batch_; }
  int64_t capacity() const { return capacity_; }
  int64_t length() const { return length_; }  // positions filled in every layer
  int64_t num_layers() const { return static_cast<int64_t>(keys_.size()); }

  // Writes this step's keys/values k, v: [B, kv_heads, T, head_dim] at positions
  // [length, length + T) of `layer` and returns all keys/values so far, each
  // [B, kv_heads, length + T, head_dim] (views). Throws when capacity would be exceeded.
  std::pair<torch::Tensor, torch::Tensor> append(int64_t layer, const torch::Tensor& k,
                                                 const torch::Tensor& v) override;
  // Marks the T positions appended by every layer as filled (the model calls this once
  // per forward, after the last layer).
  void advance(int64_t steps);

  // Keys/values of positions [begin, end) of `layer`: [B, kv_heads, end - begin, head_dim].
  torch::Tensor keys(int64_t layer, int64_t begin, int64_t end) const;
  torch::Tensor values(int64_t layer, int64_t begin, int64_t end) const;

  void reset() { length_ = 0; }  // keeps the buffers

  // Keeps batch rows `rows` ([B'] int64 indices into [0, batch), repeats allowed), in that
  // order: drops finished sequences from a decode batch, or copies a prefilled prompt to
  // its n samples. The buffers are reallocated at [B', kv_heads, capacity, head_dim].
  void select_rows(const torch::Tensor& rows);

 private:
  int64_t batch_;
  int64_t capacity_;
  int64_t length_ = 0;
  std::vector<torch::Tensor> keys_;    // per layer [B, kv_heads, capacity, head_dim]
  std::vector<torch::Tensor> values_;  // per layer [B, kv_heads, capacity, head_dim]
};

}  // namespace rlhf::models
