// Flat sharding of one unit: layout, gather/release, gradient reduction, the AdamW step.
#include "engine/sharded_unit.h"

#include <torch/csrc/autograd/variable.h>

#include <algorithm>

namespace rlhf::engine {
namespace {

int64_t bytes_of(const torch::Tensor& t) {
  return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
}

// The parameter's data replaced by an empty tensor: its storage is freed, its identity
// (autograd leaf, module registration) kept.
void free_data(torch::Tensor& param) {
  param.set_data(torch::empty({0}, param.options()));
}

}  // namespace

ShardedUnit::ShardedUnit(const models::ParamUnit& unit, const ShardContext& context,
                         const models::WeightSource* source)
    : ctx_(context),
      name_(unit.name),
      expert_first_(unit.expert_first),
      expert_count_(unit.expert_count) {
  torch::NoGradGuard no_grad;
  auto* group = ctx_.group;
  const int world = group->size();
  const int rank = group->rank();
  TORCH_CHECK(unit.shapes.size() == unit.params.size(), "ShardedUnit ", name_, ": the unit lists ",
              unit.params.size(), " parameters but ", unit.shapes.size(), " shapes");
  for (size_t i = 0; i < unit.params.size(); ++i) {
    const auto& [param_name, param] = unit.params[i];
    ParamSlot slot{param_name, param, unit.shapes[i], 0, 1};
    for (int64_t d : slot.shape) slot.numel *= d;
    TORCH_CHECK(source || (param.defined() && param.numel() == slot.numel), "ShardedUnit ", name_,
                ": parameter ", param_name,
                " holds no values (already sharded by another trainer?) and no source was given");
    if (!param.requires_grad()) {
      if (ctx_.stage == ZeroStage::kParameters) {  // sharded below (shard_frozen)
        slot.offset = frozen_numel_;
        frozen_numel_ += slot.numel;
        frozen_.push_back(std::move(slot));
        continue;
      }
      param.set_data(source
                         ? source->read(param_name, 0, slot.numel, ctx_.compute_dtype, ctx_.device)
                               .view(slot.shape)
                         : param.data().to(ctx_.device, ctx_.compute_dtype));
      state_bytes_[0] += bytes_of(param);
      frozen_numel_ += slot.numel;
      frozen_.push_back(std::move(slot));
      continue;
    }
    slot.offset = numel_;
    numel_ += slot.numel;
    slots_.push_back(std::move(slot));
  }
  shard_ = (numel_ + world - 1) / world;
  padded_ = shard_ * world;
  const int64_t begin = rank * shard_, end = begin + shard_;

  if (ctx_.stage == ZeroStage::kParameters && !frozen_.empty()) shard_frozen(source);
  if (source)
    load_shard(*source, begin, end);
  else
    broadcast_rank0(begin);
  exp_avg_ = torch::zeros_like(master_);
  exp_avg_sq_ = torch::zeros_like(master_);
  const auto grad_options = torch::TensorOptions(torch::kFloat).device(ctx_.device);
  grad_ = torch::zeros({ctx_.stage == ZeroStage::kOptimizer ? padded_ : shard_}, grad_options);
  if (ctx_.stage == ZeroStage::kParameters && ctx_.state_device != ctx_.device) {
    cached_shard_ = master_.to(ctx_.device, ctx_.compute_dtype);
    state_bytes_[0] += bytes_of(cached_shard_);
  }
  // Weight decay ranges, clipped to this rank's shard [rank S, (rank + 1) S).
  for (const auto& slot : slots_) {
    if (!takes_weight_decay(slot.name)) continue;
    const int64_t lo = std::max(begin, slot.offset), hi = std::min(end, slot.offset + slot.numel);
    if (lo < hi) decay_.emplace_back(lo - begin, hi - begin);
  }
  state_bytes_[1] = bytes_of(master_);
  state_bytes_[2] = bytes_of(exp_avg_) + bytes_of(exp_avg_sq_);
  state_bytes_[3] = bytes_of(grad_);
  ctx_.tracker->add(MemoryKind::kParams, state_bytes_[0]);
  ctx_.tracker->add(MemoryKind::kMaster, state_bytes_[1]);
  ctx_.tracker->add(MemoryKind::kOptimizer, state_bytes_[2]);
  ctx_.tracker->add(MemoryKind::kGrads, state_bytes_[3]);
}

// The master shard [begin, end) read straight from `source`, one parameter slice at a time
// (no rank ever holds the whole unit in FP32), and the compute-dtype parameters.
void ShardedUnit::load_shard(const models::WeightSource& source, int64_t begin, int64_t end) {
  // Each rank reads its own elements [begin, end) of the flat layout straight from the
  // source, one parameter slice at a time: no rank ever holds the whole unit in FP32.
  master_ = torch::zeros({shard_}, torch::TensorOptions(torch::kFloat).device(ctx_.state_device));
  for (const auto& slot : slots_) {
    const int64_t lo = std::max(begin, slot.offset), hi = std::min(end, slot.offset + slot.numel);
    if (lo >= hi) continue;
    auto slice =
        source.read(slot.name, lo - slot.offset, hi - lo, torch::kFloat, ctx_.state_device);
    ctx_.tracker->add(MemoryKind::kBuffers, bytes_of(slice));  // the load's one transient
    master_.narrow(0, lo - begin, hi - lo).copy_(slice);
    ctx_.tracker->sub(MemoryKind::kBuffers, bytes_of(slice));
  }
  for (auto& slot : slots_) {
    // Stage 1/2 keep every parameter whole in the compute dtype, read once in that dtype.
    slot.param.set_data(
        ctx_.stage == ZeroStage::kParameters
            ? torch::empty({0}, torch::TensorOptions(ctx_.compute_dtype).device(ctx_.device))
            : source.read(slot.name, 0, slot.numel, ctx_.compute_dtype, ctx_.device)
                  .view(slot.shape));
    state_bytes_[0] += bytes_of(slot.param);
  }
}

// Rank 0's values, broadcast so every rank starts from the same weights.
void ShardedUnit::broadcast_rank0(int64_t begin) {
  const int world = ctx_.group->size();
  auto* group = ctx_.group;
  auto flat = torch::zeros({padded_}, torch::TensorOptions(torch::kFloat).device(ctx_.device));
  for (const auto& slot : slots_)
    flat.narrow(0, slot.offset, slot.numel).copy_(slot.param.data().reshape({-1}));
  if (world > 1 && padded_ > 0) group->broadcast(flat, 0);
  master_ = flat.narrow(0, begin, shard_).to(ctx_.state_device, torch::kFloat, false, true);
  for (auto& slot : slots_) {
    if (ctx_.stage == ZeroStage::kParameters) {
      slot.param.set_data(torch::empty({0}, flat.options().dtype(ctx_.compute_dtype)));
    } else {
      slot.param.set_data(
          flat.narrow(0, slot.offset, slot.numel).view(slot.shape).to(ctx_.compute_dtype).clone());
      state_bytes_[0] += bytes_of(slot.param);
    }
  }
}

// Frozen elements [rank F, (rank + 1) F) of the frozen flat layout, one parameter slice at a
// time in the compute dtype (the slice read is the load's one transient), as load_shard
// reads the master; without a source, cut from this rank's own parameter values (which the
// caller built alike on every rank: frozen weights are not broadcast).
void ShardedUnit::shard_frozen(const models::WeightSource* source) {
  const int world = ctx_.group->size();
  frozen_shard_ = (frozen_numel_ + world - 1) / world;
  const int64_t begin = ctx_.group->rank() * frozen_shard_, end = begin + frozen_shard_;
  frozen_local_ =
      torch::zeros({frozen_shard_}, torch::TensorOptions(ctx_.compute_dtype).device(ctx_.device));
  for (auto& slot : frozen_) {
    const int64_t lo = std::max(begin, slot.offset), hi = std::min(end, slot.offset + slot.numel);
    if (lo < hi) {
      auto slice = source ? source->read(slot.name, lo - slot.offset, hi - lo, ctx_.compute_dtype,
                                         ctx_.device)
                          : slot.param.data().reshape({-1}).narrow(0, lo - slot.offset, hi - lo);
      ctx_.tracker->add(MemoryKind::kBuffers, bytes_of(slice));
      frozen_local_.narrow(0, lo - begin, hi - lo).copy_(slice);
      ctx_.tracker->sub(MemoryKind::kBuffers, bytes_of(slice));
    }
    slot.param.set_data(torch::empty({0}, frozen_local_.options()));
  }
  state_bytes_[0] += bytes_of(frozen_local_);
}

ShardedUnit::~ShardedUnit() {
  ctx_.tracker->sub(MemoryKind::kParams, state_bytes_[0]);
  ctx_.tracker->sub(MemoryKind::kMaster, state_bytes_[1]);
  ctx_.tracker->sub(MemoryKind::kOptimizer, state_bytes_[2]);
  ctx_.tracker->sub(MemoryKind::kGrads, state_bytes_[3]);
  ctx_.tracker->sub(MemoryKind::kGathered, gathered_bytes_ + frozen_gathered_bytes_);
}

torch::Tensor ShardedUnit::compute_shard() const {
  if (cached_shard_.defined()) return cached_shard_;
  return master_.to(ctx_.device, ctx_.compute_dtype);
}

void ShardedUnit::set_full_params(const torch::Tensor& flat) {
  for (auto& slot : slots_)
    slot.param.set_data(flat.narrow(0, slot.offset, slot.numel).view(slot.shape));
}

void ShardedUnit::gather(bool with_frozen) {
  if (ctx_.stage != ZeroStage::kParameters) return;
  if (with_frozen) gather_frozen();
  if (gathered_bytes_ > 0 || slots_.empty()) return;
  torch::NoGradGuard no_grad;
  auto full = torch::empty({padded_}, torch::TensorOptions(ctx_.compute_dtype).device(ctx_.device));
  auto shard = compute_shard();
  ctx_.group->all_gather(full, shard);
  set_full_params(full);
  gathered_bytes_ = bytes_of(full);
  ctx_.tracker->add(MemoryKind::kGathered, gathered_bytes_);
}

void ShardedUnit::gather_frozen() {
  if (ctx_.stage != ZeroStage::kParameters || frozen_gathered_bytes_ > 0 || frozen_.empty()) return;
  torch::NoGradGuard no_grad;
  auto full = torch::empty({frozen_shard_ * ctx_.group->size()}, frozen_local_.options());
  ctx_.group->all_gather(full, frozen_local_);
  frozen_uses_.clear();
  for (auto& slot : frozen_) {
    slot.param.set_data(full.narrow(0, slot.offset, slot.numel).view(slot.shape));
    frozen_uses_.push_back(slot.param.use_count());
  }
  frozen_gathered_bytes_ = bytes_of(full);
  full = torch::Tensor();
  frozen_uses_.push_back(frozen_.front().param.storage().use_count());
  ctx_.tracker->add(MemoryKind::kGathered, frozen_gathered_bytes_);
}

// A graph that saved a frozen parameter holds one more reference to it (a SavedVariable of
// the tensor itself) or to its storage (a saved view, such as the transposed weight of mm).
bool ShardedUnit::frozen_saved_by_graph() const {
  if (frozen_gathered_bytes_ == 0) return false;
  for (size_t i = 0; i < frozen_.size(); ++i)
    if (frozen_[i].param.use_count() > frozen_uses_[i]) return true;
  return frozen_.front().param.storage().use_count() > frozen_uses_.back();
}

void ShardedUnit::release_if_unused() {
  if (!gathered()) return;
  // A live AccumulateGrad node means a graph built in forward will read these parameters
  // in backward (a unit run without checkpointing): keep them until release().
  for (const auto& slot : slots_) {
    if (torch::autograd::impl::try_get_grad_accumulator(slot.param) != nullptr) return;
  }
  if (frozen_saved_by_graph()) return;
  release();
}

void ShardedUnit::release() {
  if (!gathered()) return;
  if (gathered_bytes_ > 0)
    for (auto& slot : slots_) free_data(slot.param);
  if (frozen_gathered_bytes_ > 0)
    for (auto& slot : frozen_) free_data(slot.param);
  ctx_.tracker->sub(MemoryKind::kGathered, gathered_bytes_ + frozen_gathered_bytes_);
  gathered_bytes_ = frozen_gathered_bytes_ = 0;
}

void ShardedUnit::reduce_grads() {
  if (slots_.empty())
    return;  // all frozen: the same on every rank, so no collective is skipped unevenly
  torch::NoGradGuard no_grad;
  if (ctx_.stage == ZeroStage::kOptimizer) {
    for (auto& slot : slots_) {
      auto& grad = slot.param.mutable_grad();
      if (grad.defined()) grad_.narrow(0, slot.offset, slot.numel).add_(grad.reshape({-1}));
      grad.reset();
    }
    return;
  }
  // FP32 before the reduction: summing N BF16 gradients in BF16 would lose their low bits.
  auto flat = torch::zeros({padded_}, torch::TensorOptions(torch::kFloat).device(ctx_.device));
  auto shard = torch::empty({shard_}, flat.options());
  const int64_t buffer_bytes = bytes_of(flat) + bytes_of(shard);
  ctx_.tracker->add(MemoryKind::kBuffers, buffer_bytes);
  for (auto& slot : slots_) {
    auto& grad = slot.param.mutable_grad();
    if (grad.defined()) flat.narrow(0, slot.offset, slot.numel).copy_(grad.reshape({-1}));
    grad.reset();
  }
  ctx_.group->reduce_scatter(shard, flat);
  grad_.add_(shard);
  ctx_.tracker->sub(MemoryKind::kBuffers, buffer_bytes);
}

torch::Tensor ShardedUnit::finish_grads() {
  const int world = ctx_.group->size();
  const int divisor = ctx_.grad_divisor > 0 ? ctx_.grad_divisor : world;
  if (ctx_.stage == ZeroStage::kOptimizer) {
    if (world > 1 && padded_ > 0) ctx_.group->all_reduce(grad_, transport::ReduceOp::kSum);
    return grad_.narrow(0, ctx_.group->rank() * shard_, shard_).div_(divisor);
  }
  return grad_.div_(divisor);
}

void ShardedUnit::apply_adamw(const torch::Tensor& grad, const AdamWStep& hp) {
  auto g = grad.to(ctx_.state_device);
  adamw_update(master_, exp_avg_, exp_avg_sq_, g, decay_, hp);
}

void ShardedUnit::refresh_params() {
  torch::NoGradGuard no_grad;
  if (ctx_.stage == ZeroStage::kParameters) {
    if (cached_shard_.defined()) cached_shard_.copy_(master_);
    return;
  }
  if (slots_.empty()) return;
  auto full = torch::empty({padded_}, torch::TensorOptions(ctx_.compute_dtype).device(ctx_.device));
  ctx_.tracker->add(MemoryKind::kBuffers, bytes_of(full));
  ctx_.group->all_gather(full, compute_shard());
  for (auto& slot : slots_)
    slot.param.data().copy_(full.narrow(0, slot.offset, slot.numel).view(slot.shape));
  ctx_.tracker->sub(MemoryKind::kBuffers, bytes_of(full));
}

void ShardedUnit::zero_grads() {
  grad_.zero_();
}

torch::Tensor ShardedUnit::gather_master() {
  auto full = torch::empty({padded_}, torch::TensorOptions(torch::kFloat).device(ctx_.device));
  if (padded_ > 0) ctx_.group->all_gather(full, master_.to(ctx_.device));
  return full;
}

}  // namespace rlhf::engine
