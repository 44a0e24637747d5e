// PagedKvCache: a block pool with per-sequence block tables; see paged_kv_cache.h.
#include "models/paged_kv_cache.h"

#include <algorithm>

#include "models/decoder_layer.h"
#include "models/layer_spec.h"

namespace rlhf::models {

PagedKvCache::PagedKvCache(const ModelConfig& config, int64_t num_blocks, int64_t block_size,
                           torch::Dtype dtype, torch::Device device)
    : block_size_(block_size), sliding_window_(config.sliding_window), device_(device) {
  TORCH_CHECK(num_blocks > 0 && block_size > 0,
              "PagedKvCache: num_blocks and block_size must be positive, got ", num_blocks, ", ",
              block_size);
  const auto options = torch::TensorOptions().dtype(dtype).device(device);
  const std::vector<int64_t> shape{num_blocks + 1, block_size, config.num_key_value_heads,
                                   config.head_dim};
  // Zeroed, not empty: a decode step reads whole blocks, and keys past a sequence's length
  // are masked, but NaN garbage there would still poison the masked scores (NaN + -inf).
  // One block more than asked: the scratch block of fixed-shape decode steps.
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    keys_.push_back(torch::zeros(shape, options));
    values_.push_back(torch::zeros(shape, options));
    layer_windows_.push_back(layer_window(config, i));
  }
  refs_.assign(num_blocks, 0);
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(b);  // block 0 first
}

int64_t PagedKvCache::block_bytes(const ModelConfig& config, int64_t block_size,
                                  torch::Dtype dtype) {
  return block_bytes(config, block_size, static_cast<int64_t>(c10::elementSize(dtype)));
}

int64_t PagedKvCache::block_bytes(const ModelConfig& config, int64_t block_size,
                                  int64_t element_bytes) {
  return 2 * config.num_hidden_layers * block_size * config.num_key_value_heads * config.head_dim *
         element_bytes;
}

PagedKvCache::Sequence& PagedKvCache::sequence(int64_t seq) {
  TORCH_CHECK(seq >= 0 && seq < static_cast<int64_t>(sequences_.size()) && sequences_[seq].alive,
              "PagedKvCache: no sequence ", seq);
  return sequences_[seq];
}

const PagedKvCache::Sequence& PagedKvCache::sequence(int64_t seq) const {
  TORCH_CHECK(seq >= 0 && seq < static_cast<int64_t>(sequences_.size()) && sequences_[seq].alive,
              "PagedKvCache: no sequence ", seq);
  return sequences_[seq];
}

int64_t PagedKvCache::take_block() {
  TORCH_CHECK(!free_.empty(), "PagedKvCache: no free block");
  const int64_t block = free_.back();
  free_.pop_back();
  refs_[block] = 1;
  return block;
}

void PagedKvCache::drop_block(int64_t block) {
  TORCH_CHECK(refs_[block] > 0, "PagedKvCache: block ", block, " is not held");
  if (--refs_[block] == 0) free_.push_back(block);
}

void PagedKvCache::forget_released() {
  for (const auto& s : sequences_)
    TORCH_CHECK(!s.alive, "PagedKvCache::forget_released: a sequence is still alive");
  sequences_.clear();
}

int64_t PagedKvCache::create() {
  sequences_.push_back(Sequence{{}, 0, true});
  return static_cast<int64_t>(sequences_.size()) - 1;
}

int64_t PagedKvCache::fork(int64_t parent) {
  Sequence child = sequence(parent);
  for (int64_t block : child.blocks) ++refs_[block];
  sequences_.push_back(std::move(child));
  return static_cast<int64_t>(sequences_.size()) - 1;
}

void PagedKvCache::release(int64_t seq) {
  Sequence& s = sequence(seq);
  for (int64_t block : s.blocks) drop_block(block);
  s = Sequence{};
}

int64_t PagedKvCache::length(int64_t seq) const {
  return sequence(seq).length;
}

int64_t PagedKvCache::blocks_needed(int64_t seq, int64_t tokens) const {
  const Sequence& s = sequence(seq);
  TORCH_CHECK(tokens >= 0, "PagedKvCache: negative token count");
  const int64_t held = static_cast<int64_t>(s.blocks.size());
  const int64_t fresh = std::max<int64_t>(0, blocks_for(s.length + tokens) - held);
  // The block the next position falls in is one already held, partly filled and shared.
  const bool copy = tokens > 0 && s.length % block_size_ != 0 && s.length / block_size_ < held &&
                    refs_[s.blocks[s.length / block_size_]] > 1;
  return fresh + (copy ? 1 : 0);
}

bool PagedKvCache::reserve(int64_t seq, int64_t tokens) {
  if (blocks_needed(seq, tokens) > free_blocks()) return false;
  Sequence& s = sequence(seq);
  const int64_t index = s.length / block_size_;
  if (tokens > 0 && s.length % block_size_ != 0 && index < static_cast<int64_t>(s.blocks.size()) &&
      refs_[s.blocks[index]] > 1) {
    // Copy-on-write: this sequence is about to write into a block its forks still read.
    const int64_t shared = s.blocks[index], own = take_block();
    for (auto* pool : {&keys_, &values_})
      for (auto& layer : *pool) layer.select(0, own).copy_(layer.select(0, shared));
    drop_block(shared);
    s.blocks[index] = own;
  }
  while (static_cast<int64_t>(s.blocks.size()) < blocks_for(s.length + tokens))
    s.blocks.push_back(take_block());
  return true;
}

int64_t PagedKvCache::slot(const Sequence& s, int64_t pos) const {
  const int64_t index = pos / block_size_;
  TORCH_CHECK(index < static_cast<int64_t>(s.blocks.size()), "PagedKvCache: position ", pos,
              " was not reserved");
  return s.blocks[index] * block_size_ + pos % block_size_;
}

void PagedKvCache::plan_prefill(const std::vector<int64_t>& seqs, const torch::Tensor& mask) {
  TORCH_CHECK(mask.dim() == 2 && mask.size(0) == static_cast<int64_t>(seqs.size()),
              "PagedKvCache::plan_prefill: mask must be [", seqs.size(), ", T], got ",
              mask.sizes());
  const auto host = mask.to(torch::kCPU, torch::kInt64).contiguous();
  const int64_t B = host.size(0), T = host.size(1);
  const int64_t* m = host.data_ptr<int64_t>();
  std::vector<int64_t> rows, slots;
  step_tokens_.assign(B, 0);
  for (int64_t b = 0; b < B; ++b) {
    const Sequence& s = sequence(seqs[b]);
    TORCH_CHECK(s.length == 0, "PagedKvCache::plan_prefill: sequence ", seqs[b], " is not empty");
    for (int64_t t = 0; t < T; ++t) {
      if (m[b * T + t] == 0) continue;
      rows.push_back(b * T + t);
      slots.push_back(slot(s, step_tokens_[b]++));
    }
  }
  step_ = Step::kPrefill;
  step_batch_ = B;
  step_seqs_ = seqs;
  write_rows_ = torch::tensor(rows, torch::kInt64).to(device_);
  write_slots_ = torch::tensor(slots, torch::kInt64).to(device_);
  prefill_mask_ = mask.to(device_, torch::kInt64);
  positions_ = (prefill_mask_.cumsum(1) - 1).masked_fill(prefill_mask_ == 0, 1);
  decode_mask_.reset();
}

void PagedKvCache::plan_decode(const std::vector<int64_t>& seqs) {
  const int64_t B = static_cast<int64_t>(seqs.size());
  TORCH_CHECK(B > 0, "PagedKvCache::plan_decode: no sequences");
  int64_t M = 0;
  for (int64_t seq : seqs) M = std::max(M, blocks_for(sequence(seq).length + 1));
  const int64_t S = M * block_size_;
  std::vector<int64_t> slots(B), positions(B), blocks(B * M, 0);
  auto mask = torch::zeros({B, 1, 1, S}, torch::kBool);
  auto* allowed = mask.data_ptr<bool>();
  for (int64_t b = 0; b < B; ++b) {
    const Sequence& s = sequence(seqs[b]);
    slots[b] = slot(s, s.length);
    positions[b] = s.length;
    const int64_t used = blocks_for(s.length + 1);
    std::copy(s.blocks.begin(), s.blocks.begin() + used, blocks.begin() + b * M);
    // Keys 0..length (the new token included), within the sliding window if there is one.
    const int64_t first =
        sliding_window_ > 0 ? std::max<int64_t>(0, s.length + 1 - sliding_window_) : 0;
    std::fill(allowed + b * S + first, allowed + b * S + s.length + 1, true);
  }
  step_ = Step::kDecode;
  decode_plan_.reset();
  step_batch_ = B;
  step_seqs_ = seqs;
  step_tokens_.assign(B, 1);
  write_rows_ = torch::Tensor();
  write_slots_ = torch::tensor(slots, torch::kInt64).to(device_);
  read_blocks_ = torch::tensor(blocks, torch::kInt64).to(device_);
  positions_ = torch::tensor(positions, torch::kInt64).view({B, 1}).to(device_);
  decode_mask_ = mask.to(device_);
  prefill_mask_ = torch::Tensor();
}

void PagedKvCache::plan_extend(const std::vector<int64_t>& seqs, const torch::Tensor& mask) {
  TORCH_CHECK(mask.dim() == 2 && mask.size(0) == static_cast<int64_t>(seqs.size()) && !seqs.empty(),
              "PagedKvCache::plan_extend: mask must be [", seqs.size(), ", T], got ", mask.sizes());
  const auto host = mask.to(torch::kCPU, torch::kInt64).contiguous();
  const int64_t B = host.size(0), T = host.size(1);
  const int64_t* m = host.data_ptr<int64_t>();
  step_tokens_.assign(B, 0);
  int64_t M = 1;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T && m[b * T + t] != 0; ++t) ++step_tokens_[b];
    TORCH_CHECK(step_tokens_[b] > 0, "PagedKvCache::plan_extend: row ", b, " has no new token");
    M = std::max(M, blocks_for(sequence(seqs[b]).length + step_tokens_[b]));
  }
  const int64_t S = M * block_size_;
  std::vector<int64_t> rows, slots, positions(B * T), blocks(B * M, scratch_block());
  auto allowed_mask = torch::zeros({B, 1, T, S}, torch::kBool);
  auto* allowed = allowed_mask.data_ptr<bool>();
  for (int64_t b = 0; b < B; ++b) {
    const Sequence& s = sequence(seqs[b]);
    const int64_t k = step_tokens_[b];
    std::copy(s.blocks.begin(), s.blocks.begin() + blocks_for(s.length + k),
              blocks.begin() + b * M);
    for (int64_t t = 0; t < T; ++t) {
      const int64_t pos = s.length + std::min(t, k - 1);  // padding repeats the last position
      positions[b * T + t] = pos;
      if (t < k) {
        rows.push_back(b * T + t);
        slots.push_back(slot(s, pos));
      }
      // Keys 0..pos (within the sliding window): the whole sequence's causal mask.
      const int64_t first =
          sliding_window_ > 0 ? std::max<int64_t>(0, pos + 1 - sliding_window_) : 0;
      std::fill(allowed + (b * T + t) * S + first, allowed + (b * T + t) * S + pos + 1, true);
    }
  }
  step_ = Step::kExtend;
  step_batch_ = B;
  step_seqs_ = seqs;
  write_rows_ = torch::tensor(rows, torch::kInt64).to(device_);
  write_slots_ = torch::tensor(slots, torch::kInt64).to(device_);
  read_blocks_ = torch::tensor(blocks, torch::kInt64).to(device_);
  positions_ = torch::tensor(positions, torch::kInt64).view({B, T}).to(device_);
  decode_mask_ = allowed_mask.to(device_);
  prefill_mask_ = torch::Tensor();
}

void PagedKvCache::truncate(int64_t seq, int64_t length) {
  Sequence& s = sequence(seq);
  TORCH_CHECK(length >= 0 && length <= s.length, "PagedKvCache::truncate: sequence ", seq,
              " holds ", s.length, " positions, cannot keep ", length);
  s.length = length;
  while (static_cast<int64_t>(s.blocks.size()) > blocks_for(length)) {
    drop_block(s.blocks.back());
    s.blocks.pop_back();
  }
}

void PagedKvCache::fill_decode_inputs(const std::vector<int64_t>& seqs, int64_t batch, int64_t M,
                                      int64_t* out) const {
  const int64_t B = static_cast<int64_t>(seqs.size());
  TORCH_CHECK(B <= batch && M > 0, "PagedKvCache::fill_decode_inputs: ", B,
              " sequences in a step of ", batch, " rows, ", M, " blocks");
  int64_t* slots = out;
  int64_t* positions = out + batch;
  int64_t* blocks = out + 2 * batch;
  std::fill(blocks, blocks + batch * M, scratch_block());
  for (int64_t b = 0; b < batch; ++b) {
    if (b >= B) {  // padding: writes and reads the scratch block, sees its position 0
      slots[b] = scratch_block() * block_size_;
      positions[b] = 0;
      continue;
    }
    const Sequence& s = sequence(seqs[b]);
    const int64_t used = blocks_for(s.length + 1);
    TORCH_CHECK(used <= M, "PagedKvCache::fill_decode_inputs: sequence ", seqs[b], " needs ", used,
                " blocks, the step has ", M);
    slots[b] = slot(s, s.length);
    positions[b] = s.length;
    std::copy(s.blocks.begin(), s.blocks.begin() + used, blocks + b * M);
  }
}

void PagedKvCache::plan_decode_static(const std::vector<int64_t>& seqs, const torch::Tensor& slots,
                                      const torch::Tensor& positions, const torch::Tensor& blocks) {
  const int64_t batch = slots.size(0);
  TORCH_CHECK(slots.dim() == 1 && positions.sizes() == torch::IntArrayRef({batch, 1}) &&
                  blocks.dim() == 1 && batch > 0 && blocks.size(0) % batch == 0 &&
                  static_cast<int64_t>(seqs.size()) <= batch,
              "PagedKvCache::plan_decode_static: slots [B], positions [B, 1] and blocks [B * M] "
              "for at most B sequences, got ",
              slots.sizes(), ", ", positions.sizes(), ", ", blocks.sizes(), " for ", seqs.size());
  step_ = Step::kStaticDecode;
  decode_plan_.reset();
  step_batch_ = batch;
  step_seqs_ = seqs;
  step_tokens_.assign(seqs.size(), 1);
  write_rows_ = torch::Tensor();
  write_slots_ = slots;
  read_blocks_ = blocks;
  positions_ = positions;
  decode_mask_.reset();
  prefill_mask_ = torch::Tensor();
}

void PagedKvCache::attention(AttentionInputs& in, int64_t window) const {
  TORCH_CHECK(step_ != Step::kNone, "PagedKvCache: no planned step");
  in.causal = false;
  if (step_ == Step::kPrefill) {
    set_attention_mask(in, prefill_mask_, 0, prefill_mask_.size(1), window);
    return;
  }
  const int64_t S = read_blocks_.size(0) / step_batch_ * block_size_;
  const auto key = torch::arange(S, positions_.options()).view({1, 1, 1, S});
  // A query at position p sees keys (p - window, p]; key index j of a row is position j.
  auto within = [&](const torch::Tensor& allowed) {
    const auto pos = positions_.view({step_batch_, 1, -1, 1});  // [B, 1, T, 1]
    return allowed.logical_and(key > pos - window);
  };
  if (step_ == Step::kDecode || step_ == Step::kExtend) {
    // Planned with the config's window; a local layer's narrower one is applied on top.
    in.mask = window > 0 && window != sliding_window_ ? within(*decode_mask_) : *decode_mask_;
  } else {
    // Keys 0..position (the new token included), within the window: on the device.
    const auto pos = positions_.view({step_batch_, 1, 1, 1});
    auto allowed = key <= pos;
    in.mask = window > 0 ? within(allowed) : allowed;
  }
}

std::pair<torch::Tensor, torch::Tensor> PagedKvCache::append(int64_t layer, const torch::Tensor& k,
                                                             const torch::Tensor& v) {
  TORCH_CHECK(step_ != Step::kNone, "PagedKvCache: append without a planned step");
  TORCH_CHECK(layer >= 0 && layer < static_cast<int64_t>(keys_.size()), "PagedKvCache: layer ",
              layer, " out of range");
  auto& keys = keys_[layer];
  auto& values = values_[layer];
  const int64_t B = k.size(0), kv = keys.size(2), D = keys.size(3);
  TORCH_CHECK(k.dim() == 4 && B == step_batch_ && k.size(1) == kv && k.size(3) == D &&
                  v.sizes() == k.sizes(),
              "PagedKvCache: expected keys/values [", step_batch_, ", ", kv, ", T, ", D, "], got ",
              k.sizes(), " and ", v.sizes());
  auto flat_keys = keys.view({-1, kv, D}), flat_values = values.view({-1, kv, D});
  if (step_ == Step::kPrefill) {
    const int64_t T = k.size(2);
    flat_keys.index_copy_(0, write_slots_,
                          k.transpose(1, 2).reshape({B * T, kv, D}).index_select(0, write_rows_));
    flat_values.index_copy_(0, write_slots_,
                            v.transpose(1, 2).reshape({B * T, kv, D}).index_select(0, write_rows_));
    return {k, v};
  }
  if (step_ == Step::kExtend) {  // write the new tokens, then read them with the held ones
    const int64_t T = k.size(2);
    flat_keys.index_copy_(0, write_slots_,
                          k.transpose(1, 2).reshape({B * T, kv, D}).index_select(0, write_rows_));
    flat_values.index_copy_(0, write_slots_,
                            v.transpose(1, 2).reshape({B * T, kv, D}).index_select(0, write_rows_));
  } else {
    TORCH_CHECK(k.size(2) == 1, "PagedKvCache: a decode step appends one position, got ",
                k.size(2));
    flat_keys.index_copy_(0, write_slots_, k.squeeze(2));
    flat_values.index_copy_(0, write_slots_, v.squeeze(2));
  }
  const int64_t S = read_blocks_.size(0) / B * block_size_;
  auto gather = [&](const torch::Tensor& pool) {
    return pool.index_select(0, read_blocks_).view({B, S, kv, D}).transpose(1, 2);
  };
  return {gather(keys), gather(values)};
}

torch::Tensor PagedKvCache::append_and_attend(int64_t layer, const torch::Tensor& q,
                                              const torch::Tensor& k, const torch::Tensor& v,
                                              double scale) {
  const bool decode = step_ == Step::kDecode || step_ == Step::kStaticDecode;
  if (!decode || !in_place_decode_ || !device_.is_cuda() || layer < 0 ||
      layer >= static_cast<int64_t>(keys_.size()) || layer_windows_[layer] > 0 || q.size(2) != 1 ||
      !kernels::paged_decode_supported(keys_[layer].scalar_type(), keys_[layer].size(3), q.size(1),
                                       keys_[layer].size(2))) {
    return {};
  }
  auto& keys = keys_[layer];
  auto& values = values_[layer];
  const int64_t B = k.size(0), kv = keys.size(2), D = keys.size(3);
  TORCH_CHECK(B == step_batch_ && k.size(2) == 1 && v.sizes() == k.sizes(),
              "PagedKvCache: a decode step appends one position per row, got ", k.sizes());
  keys.view({-1, kv, D}).index_copy_(0, write_slots_, k.squeeze(2));
  values.view({-1, kv, D}).index_copy_(0, write_slots_, v.squeeze(2));
  if (!decode_plan_) {
    decode_plan_ =
        kernels::plan_paged_decode(read_blocks_.view({B, -1}), positions_.view({B}), block_size_);
  }
  return kernels::paged_decode_attention(q.squeeze(2), keys, values, *decode_plan_, scale)
      .unsqueeze(2);
}

void PagedKvCache::finish_step() {
  TORCH_CHECK(step_ != Step::kNone, "PagedKvCache: no planned step to finish");
  decode_plan_.reset();
  for (size_t i = 0; i < step_seqs_.size(); ++i) sequence(step_seqs_[i]).length += step_tokens_[i];
  step_ = Step::kNone;
}

}  // namespace rlhf::models
