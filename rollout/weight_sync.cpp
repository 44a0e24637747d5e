// Weight sync: header + layout check, then one flat broadcast per unit. See weight_sync.h.
#include "rollout/weight_sync.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <map>

#include "core/errors.h"
#include "engine/trainer.h"

namespace rlhf::rollout {
namespace {

using Clock = std::chrono::steady_clock;

// Header fields, broadcast from the root as one int64 tensor.
enum HeaderField : int64_t { kVersion = 0, kUnits, kLayoutHash, kWireDtype, kHeaderSize };

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

template <typename T>
void sort_by_name(std::vector<T>& v) {
  std::sort(v.begin(), v.end(), [](const T& a, const T& b) { return a.first < b.first; });
}

std::vector<std::vector<TensorSpec>> layout_of_units(const std::vector<models::ParamUnit>& units) {
  std::vector<std::vector<TensorSpec>> layout;
  for (const auto& unit : units) {
    std::vector<TensorSpec> specs;
    for (const auto& [name, tensor] : unit.params) specs.push_back({name, tensor.sizes().vec()});
    layout.push_back(std::move(specs));
  }
  return layout;
}

// Where the group's small control tensors live: NCCL only takes CUDA tensors (the current
// device), Gloo here takes CPU ones.
torch::Device control_device(const transport::CollectiveGroup& group) {
  return group.backend_name() == "nccl" ? torch::Device(torch::kCUDA) : torch::Device(torch::kCPU);
}

// Every rank says whether it can take this sync (0 yes, 1 no); all learn the worst.
bool all_ok(transport::CollectiveGroup& group, bool ok) {
  auto flag =
      torch::tensor({static_cast<int64_t>(ok ? 0 : 1)}, torch::kInt64).to(control_device(group));
  group.all_reduce(flag, transport::ReduceOp::kMax);
  return flag.item<int64_t>() == 0;
}

}  // namespace

int64_t layout_hash(const std::vector<std::vector<TensorSpec>>& layout) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over "unit|name:d0,d1;..."
  auto mix = [&h](const std::string& s) {
    for (unsigned char ch : s) {
      h ^= ch;
      h *= 1099511628211ull;
    }
  };
  for (size_t u = 0; u < layout.size(); ++u) {
    auto specs = layout[u];
    std::sort(specs.begin(), specs.end(),
              [](const TensorSpec& a, const TensorSpec& b) { return a.name < b.name; });
    mix("|" + std::to_string(u));
    for (const auto& s : specs) {
      mix(s.name + ":");
      for (int64_t d : s.shape) mix(std::to_string(d) + ",");
      mix(";");
    }
  }
  return static_cast<int64_t>(h >> 1);
}

std::vector<std::vector<TensorSpec>> ModelWeights::layout() {
  return layout_of_units(model_.param_units());
}

NamedTensors ModelWeights::acquire(int64_t unit) {
  auto units = model_.param_units();
  TORCH_CHECK(unit >= 0 && unit < static_cast<int64_t>(units.size()), "ModelWeights: unit ", unit,
              " out of range");
  return units[static_cast<size_t>(unit)].params;
}

std::vector<std::vector<TensorSpec>> TrainerWeights::layout() {
  std::vector<std::vector<TensorSpec>> layout;
  for (const auto& unit : trainer_.units()) {
    std::vector<TensorSpec> specs;
    for (const auto* list : {&unit->slots(), &unit->frozen()}) {
      for (const auto& slot : *list) specs.push_back({slot.name, slot.shape});
    }
    layout.push_back(std::move(specs));
  }
  return layout;
}

NamedTensors TrainerWeights::acquire(int64_t unit) {
  const auto& units = trainer_.units();
  TORCH_CHECK(unit >= 0 && unit < static_cast<int64_t>(units.size()), "TrainerWeights: unit ", unit,
              " out of range");
  auto& u = *units[static_cast<size_t>(unit)];
  gathered_here_ = !u.gathered();
  u.gather();  // ZeRO-3: all-gather over the trainer's group; a no-op at stages 1-2
  NamedTensors out;
  for (const auto* list : {&u.slots(), &u.frozen()}) {
    for (const auto& slot : *list) out.emplace_back(slot.name, slot.param.detach());
  }
  return out;
}

void TrainerWeights::release(int64_t unit) {
  if (gathered_here_) trainer_.units()[static_cast<size_t>(unit)]->release();
  gathered_here_ = false;
}

WeightSyncStats send_weights(WeightSource& source, transport::CollectiveGroup* group,
                             int64_t version, torch::Dtype wire_dtype) {
  torch::NoGradGuard no_grad;
  const auto start = Clock::now();
  const auto layout = source.layout();
  const auto units = static_cast<int64_t>(layout.size());
  WeightSyncStats stats;
  stats.version = version;
  if (group) {
    TORCH_CHECK(group->rank() == 0,
                "send_weights: the actor must be rank 0 of the sync group, got rank ",
                group->rank());
    auto header =
        torch::tensor({version, units, layout_hash(layout), static_cast<int64_t>(wire_dtype)},
                      torch::kInt64)
            .to(control_device(*group));
    group->broadcast(header, 0);
    if (!all_ok(*group, true))
      throw RuntimeError("weight sync v" + std::to_string(version) +
                         ": a rollout rank's model layout differs from the actor's (see its log); "
                         "nothing was sent");
  }
  for (int64_t u = 0; u < units; ++u) {
    auto tensors = source.acquire(u);
    if (group) {
      sort_by_name(tensors);
      std::vector<torch::Tensor> flat;
      for (const auto& [name, t] : tensors) flat.push_back(t.reshape({-1}).to(wire_dtype));
      auto bucket = torch::cat(flat);  // [unit numel] wire dtype: one broadcast per unit
      group->broadcast(bucket, 0);
      stats.tensors += static_cast<int64_t>(tensors.size());
      stats.bytes += bucket.numel() * static_cast<int64_t>(bucket.element_size());
    }
    source.release(u);
  }
  stats.seconds = seconds_since(start);
  return stats;
}

WeightSyncStats receive_weights(models::CausalLM& model, transport::CollectiveGroup& group) {
  torch::NoGradGuard no_grad;
  const auto start = Clock::now();
  TORCH_CHECK(group.rank() > 0, "receive_weights: rank 0 of the sync group is the sender");
  auto units = model.param_units();
  const auto layout = layout_of_units(units);
  const int64_t mine = layout_hash(layout);
  auto header = torch::zeros({kHeaderSize},
                             torch::TensorOptions(torch::kInt64).device(control_device(group)));
  group.broadcast(header, 0);
  header = header.to(torch::kCPU);
  const auto* h = header.data_ptr<int64_t>();
  const bool ok = h[kUnits] == static_cast<int64_t>(units.size()) && h[kLayoutHash] == mine;
  if (!all_ok(group, ok) || !ok) {
    throw RuntimeError("weight sync v" + std::to_string(h[kVersion]) + " on sync rank " +
                       std::to_string(group.rank()) + ": the actor's layout (" +
                       std::to_string(h[kUnits]) + " units, hash " +
                       std::to_string(h[kLayoutHash]) + ") differs from this model's (" +
                       std::to_string(units.size()) + " units, hash " + std::to_string(mine) +
                       "), or another rollout rank's does");
  }
  const auto wire = static_cast<torch::Dtype>(h[kWireDtype]);
  WeightSyncStats stats;
  stats.version = h[kVersion];
  for (auto& unit : units) {
    auto params = unit.params;
    sort_by_name(params);
    int64_t numel = 0;
    for (const auto& p : params) numel += p.second.numel();
    auto bucket = torch::empty({numel}, torch::TensorOptions(wire).device(model.device()));
    group.broadcast(bucket, 0);
    int64_t offset = 0;
    for (auto& [name, param] : params) {
      const int64_t n = numel_of(param.sizes().vec());
      param.copy_(bucket.narrow(0, offset, n).view(param.sizes()));  // in place, converting dtype
      offset += n;
    }
    stats.tensors += static_cast<int64_t>(params.size());
    stats.bytes += bucket.numel() * static_cast<int64_t>(bucket.element_size());
  }
  stats.seconds = seconds_since(start);
  return stats;
}

}  // namespace rlhf::rollout
