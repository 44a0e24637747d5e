// KvCache: preallocated per-layer buffers; see kv_cache.h.
#include "models/kv_cache.h"

namespace rlhf::models {

KvCache::KvCache(const ModelConfig& config, int64_t batch, int64_t capacity, torch::Dtype dtype,
                 torch::Device device)
    : batch_(batch), capacity_(capacity) {
  TORCH_CHECK(batch > 0 && capacity > 0, "KvCache: batch and capacity must be positive, got ",
              batch, ", ", capacity);
  auto options = torch::TensorOptions().dtype(dtype).device(device);
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    keys_.push_back(
        torch::zeros({batch, config.num_key_value_heads, capacity, config.head_dim}, options));
    values_.push_back(
        torch::zeros({batch, config.num_key_value_heads, capacity, config.head_dim}, options));
  }
}

int64_t KvCache::bytes(const ModelConfig& config, int64_t batch, int64_t capacity,
                       torch::Dtype dtype) {
  return 2 * config.num_hidden_layers * batch * config.num_key_value_heads * capacity *
         config.head_dim * static_cast<int64_t>(c10::elementSize(dtype));
}

std::pair<torch::Tensor, torch::Tensor> KvCache::append(int64_t layer, const torch::Tensor& k,
                                                        const torch::Tensor& v) {
  TORCH_CHECK(layer >= 0 && layer < num_layers(), "KvCache: layer ", layer, " out of range");
  const auto& buf = keys_[layer];
  TORCH_CHECK(k.dim() == 4 && k.size(0) == batch_ && k.size(1) == buf.size(1) &&
                  k.size(3) == buf.size(3) && v.sizes() == k.sizes(),
              "KvCache: expected keys/values [", batch_, ", ", buf.size(1), ", T, ", buf.size(3),
              "], got ", k.sizes(), " and ", v.sizes());
  const int64_t end = length_ + k.size(2);
  TORCH_CHECK(end <= capacity_, "KvCache: ", end, " positions exceed the capacity of ", capacity_);
  keys_[layer].narrow(2, length_, k.size(2)).copy_(k);
  values_[layer].narrow(2, length_, k.size(2)).copy_(v);
  return {keys_[layer].narrow(2, 0, end), values_[layer].narrow(2, 0, end)};
}

void KvCache::advance(int64_t steps) {
  TORCH_CHECK(steps >= 0 && length_ + steps <= capacity_, "KvCache: cannot advance ", length_,
              " by ", steps);
  length_ += steps;
}

torch::Tensor KvCache::keys(int64_t layer, int64_t begin, int64_t end) const {
  TORCH_CHECK(layer >= 0 && layer < num_layers() && 0 <= begin && begin <= end && end <= length_,
              "KvCache: bad range [", begin, ", ", end, ") of layer ", layer);
  return keys_[layer].narrow(2, begin, end - begin);
}

torch::Tensor KvCache::values(int64_t layer, int64_t begin, int64_t end) const {
  TORCH_CHECK(layer >= 0 && layer < num_layers() && 0 <= begin && begin <= end && end <= length_,
              "KvCache: bad range [", begin, ", ", end, ") of layer ", layer);
  return values_[layer].narrow(2, begin, end - begin);
}

void KvCache::select_rows(const torch::Tensor& rows) {
  TORCH_CHECK(rows.dim() == 1 && rows.numel() > 0 && rows.scalar_type() == torch::kInt64,
              "KvCache::select_rows: rows must be a non-empty int64 [B'], got ", rows.scalar_type(),
              rows.sizes());
  TORCH_CHECK(rows.min().item<int64_t>() >= 0 && rows.max().item<int64_t>() < batch_,
              "KvCache::select_rows: rows outside [0, ", batch_, ")");
  for (auto* buffers : {&keys_, &values_}) {
    for (auto& b : *buffers) {
      auto sizes = b.sizes().vec();
      sizes[0] = rows.size(0);
      auto fresh = torch::empty(sizes, b.options());  // only the filled positions are copied
      fresh.narrow(2, 0, length_)
          .copy_(b.narrow(2, 0, length_).index_select(0, rows.to(b.device())));
      b = fresh;
    }
  }
  batch_ = rows.size(0);
}

}  // namespace rlhf::models
