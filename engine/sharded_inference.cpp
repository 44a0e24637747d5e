// ShardedInference: per-rank shards read from a WeightSource, gathered unit by unit.
#include "engine/sharded_inference.h"

#include <algorithm>

namespace rlhf::engine {

ShardedInference::ShardedInference(models::ShardableModel& model, transport::CollectiveGroup& group,
                                   const models::WeightSource& source, torch::Dtype dtype,
                                   torch::Device device, bool tied_embeddings)
    : model_(model), group_(group), dtype_(dtype), device_(device), tied_(tied_embeddings) {
  torch::NoGradGuard no_grad;
  const int world = group_.size(), rank = group_.rank();
  for (const auto& pu : model_.param_units()) {
    Unit unit;
    int64_t numel = 0;
    for (size_t i = 0; i < pu.params.size(); ++i) {
      Slot slot{pu.params[i].first, pu.params[i].second, pu.shapes.at(i), numel, 1};
      for (int64_t d : slot.shape) slot.numel *= d;
      numel += slot.numel;
      slot.param.set_data(torch::empty({0}, torch::TensorOptions(dtype_).device(device_)));
      unit.slots.push_back(std::move(slot));
    }
    unit.shard = (numel + world - 1) / world;
    unit.padded = unit.shard * world;
    unit.local = torch::zeros({unit.shard}, torch::TensorOptions(dtype_).device(device_));
    const int64_t begin = rank * unit.shard, end = begin + unit.shard;
    for (const auto& slot : unit.slots) {
      const int64_t lo = std::max(begin, slot.offset), hi = std::min(end, slot.offset + slot.numel);
      if (lo >= hi) continue;
      auto slice = source.read(slot.name, lo - slot.offset, hi - lo, dtype_, device_);
      tracker_.add(MemoryKind::kBuffers, slice.numel() * slice.element_size());
      unit.local.narrow(0, lo - begin, hi - lo).copy_(slice);
      tracker_.sub(MemoryKind::kBuffers, slice.numel() * slice.element_size());
    }
    tracker_.add(MemoryKind::kParams, unit.shard * unit.local.element_size());
    units_.push_back(std::move(unit));
  }
  TORCH_CHECK(!units_.empty(), "ShardedInference: the model has no parameter units");
  model_.set_layer_hooks(this);
}

ShardedInference::~ShardedInference() {
  model_.set_layer_hooks(nullptr);
}

int64_t ShardedInference::shard_bytes() const {
  int64_t bytes = 0;
  for (const auto& u : units_) bytes += u.local.numel() * u.local.element_size();
  return bytes;
}

void ShardedInference::gather(Unit& unit) {
  if (unit.users++ > 0) return;
  torch::NoGradGuard no_grad;
  auto full = torch::empty({unit.padded}, unit.local.options());
  group_.all_gather(full, unit.local);
  for (auto& slot : unit.slots)
    slot.param.set_data(full.narrow(0, slot.offset, slot.numel).view(slot.shape));
  unit.gathered = unit.padded * full.element_size();
  tracker_.add(MemoryKind::kGathered, unit.gathered);
}

void ShardedInference::release(Unit& unit) {
  if (unit.users == 0 || --unit.users > 0) return;
  for (auto& slot : unit.slots)
    slot.param.set_data(torch::empty({0}, torch::TensorOptions(dtype_).device(device_)));
  tracker_.sub(MemoryKind::kGathered, unit.gathered);
  unit.gathered = 0;
}

void ShardedInference::before_forward(int unit) {
  TORCH_CHECK(unit >= 0 && unit < static_cast<int>(units_.size()),
              "ShardedInference: hook for unknown unit ", unit);
  gather(units_[unit]);
  if (tied_ && unit == static_cast<int>(units_.size()) - 1) gather(units_[0]);
}

void ShardedInference::after_forward(int unit) {
  TORCH_CHECK(unit >= 0 && unit < static_cast<int>(units_.size()),
              "ShardedInference: hook for unknown unit ", unit);
  release(units_[unit]);
  if (tied_ && unit == static_cast<int>(units_.size()) - 1) release(units_[0]);
}

}  // namespace rlhf::engine
