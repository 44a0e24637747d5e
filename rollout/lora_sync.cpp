// A LoRA actor's weights on the way to the rollout (weight_sync.h): merged (W + scale B A,
// one unit at a time on the actor) or as the adapters alone, merged by each rollout worker
// into a host copy of the base it loaded (LoraMerge).
#include <ATen/ATen.h>

#include <algorithm>
#include <map>
#include <string>

#include "core/errors.h"
#include "engine/trainer.h"
#include "rollout/weight_sync.h"

namespace rlhf::rollout {

namespace {

bool is_adapter(const std::string& name) {
  return name.find(".lora_A.weight") != std::string::npos ||
         name.find(".lora_B.weight") != std::string::npos;
}

}  // namespace

std::vector<std::vector<TensorSpec>> MergedLoraWeights::layout() {
  auto layout = inner_.layout();
  for (auto& unit : layout)
    unit.erase(std::remove_if(unit.begin(), unit.end(),
                              [](const TensorSpec& s) { return is_adapter(s.name); }),
               unit.end());
  return layout;
}

NamedTensors MergedLoraWeights::acquire(int64_t unit) {
  const NamedTensors all = inner_.acquire(unit);
  std::map<std::string, torch::Tensor> by_name(all.begin(), all.end());
  held_.clear();
  torch::NoGradGuard no_grad;
  for (const auto& [name, tensor] : all) {
    if (is_adapter(name)) continue;
    const std::string module = name.size() > 7 ? name.substr(0, name.size() - 7) : "";
    auto a = by_name.find(module + ".lora_A.weight");
    if (name.compare(name.size() - std::min<size_t>(7, name.size()), 7, ".weight") != 0 ||
        a == by_name.end()) {
      held_.emplace_back(name, tensor);
      continue;
    }
    // PEFT's merge: W + (B @ A) * scaling, in FP32.
    const auto& b = by_name.at(module + ".lora_B.weight");
    auto merged = tensor.to(torch::kFloat32) +
                  torch::matmul(b.to(torch::kFloat32), a->second.to(torch::kFloat32)) * scale_;
    held_.emplace_back(name, merged.to(tensor.scalar_type()));
  }
  return held_;
}

void MergedLoraWeights::release(int64_t unit) {
  held_.clear();
  inner_.release(unit);
}

std::vector<std::vector<TensorSpec>> LoraAdapterWeights::layout() {
  auto layout = inner_.layout();
  for (auto& unit : layout)
    unit.erase(std::remove_if(unit.begin(), unit.end(),
                              [](const TensorSpec& s) { return !is_adapter(s.name); }),
               unit.end());
  return layout;
}

NamedTensors LoraAdapterWeights::acquire(int64_t unit) {
  NamedTensors out;
  for (auto& [name, tensor] : inner_.acquire(unit))
    if (is_adapter(name)) out.emplace_back(name, tensor);
  return out;
}

const char* lora_sync_name(LoraSync mode) {
  return mode == LoraSync::kAdapters ? "adapters" : "merged";
}

LoraSync parse_lora_sync(const std::string& name) {
  if (name == "merged") return LoraSync::kMerged;
  if (name == "adapters") return LoraSync::kAdapters;
  throw InputError("rollout.lora_sync \"" + name + "\": expected merged or adapters");
}

namespace {

// "<module>.lora_A.weight" -> (module, true); B -> (module, false); else ("", false).
std::pair<std::string, bool> adapter_of(const std::string& name) {
  for (const bool a : {true, false}) {
    const std::string tail = a ? ".lora_A.weight" : ".lora_B.weight";
    if (name.size() > tail.size() &&
        name.compare(name.size() - tail.size(), tail.size(), tail) == 0)
      return {name.substr(0, name.size() - tail.size()), a};
  }
  return {"", false};
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

}  // namespace

std::string LoraMerge::prepare(models::CausalLM& model,
                               const std::vector<std::vector<TensorSpec>>& layout, double scale) {
  torch::NoGradGuard no_grad;
  std::map<std::string, std::pair<torch::Tensor, std::vector<int64_t>>> weights;  // full shapes
  for (const auto& unit : model.param_units())
    for (size_t i = 0; i < unit.params.size(); ++i)
      weights[unit.params[i].first] = {unit.params[i].second, unit.shapes.at(i)};
  const int tp = model.tensor_parallel().size;
  std::vector<models::ParamUnit> units;
  std::map<std::string, std::pair<torch::Tensor, torch::Tensor>> adapters;
  for (const auto& specs : layout) {
    models::ParamUnit unit;
    for (const auto& spec : specs) {
      const auto [module, is_a] = adapter_of(spec.name);
      auto w = weights.find(module + ".weight");
      if (module.empty() || w == weights.end())
        return spec.name + " is not a LoRA adapter of a linear map of this model";
      const auto& full = w->second.second;  // [out, in]
      const int64_t r = spec.shape.size() == 2 ? spec.shape[is_a ? 0 : 1] : -1;
      const std::vector<int64_t> want =
          is_a ? std::vector<int64_t>{r, full.at(1)} : std::vector<int64_t>{full.at(0), r};
      if (r <= 0 || spec.shape != want)
        return spec.name + " has shape " + shape_text(spec.shape) + ", this model's " + module +
               ".weight " + shape_text(full) + " needs " + shape_text(want);
      auto& buffer = is_a ? adapters[module].first : adapters[module].second;
      const auto shape = models::tensor_parallel_shape(spec.name, spec.shape, tp);
      auto old = adapters_.find(module);  // reuse last sync's buffer
      const auto& previous = old == adapters_.end() ? torch::Tensor()
                             : is_a                 ? old->second.first
                                                    : old->second.second;
      buffer =
          previous.defined() && previous.sizes() == c10::IntArrayRef(shape)
              ? previous
              : torch::zeros(
                    shape, torch::TensorOptions(torch::kFloat32).device(w->second.first.device()));
      unit.params.emplace_back(spec.name, buffer);
      unit.shapes.push_back(spec.shape);
    }
    units.push_back(std::move(unit));
  }
  for (const auto& [module, ab] : adapters) {
    if (!ab.first.defined() || !ab.second.defined())
      return module + " has only one of lora_A / lora_B";
    if (base_.count(module)) continue;
    if (!model_is_base_)
      return "the rollout's weights were replaced by a full-weights sync, so " + module +
             ".weight is no longer the base the adapters apply to";
    const auto& w = weights.at(module + ".weight").first;
    auto copy = w.detach().to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true);
    base_[module] = w.is_cuda() ? copy.pin_memory() : copy;
  }
  units_ = std::move(units);
  adapters_ = std::move(adapters);
  scale_ = scale;
  return "";
}

void LoraMerge::merge(models::CausalLM& model) {
  torch::NoGradGuard no_grad;
  std::map<std::string, torch::Tensor> weights;
  for (const auto& unit : model.param_units())
    for (const auto& [name, param] : unit.params) weights[name] = param;
  for (const auto& [module, ab] : adapters_) {
    auto& w = weights.at(module + ".weight");
    const auto& [a, b] = ab;
    // PEFT's merge as MergedLoraWeights computes it: W + (B @ A) * scaling, in FP32, from
    // the pristine base; then W's dtype.
    auto merged = base_.at(module).to(w.device(), torch::kFloat32, /*non_blocking=*/true) +
                  torch::matmul(b, a) * scale_;
    w.copy_(merged.to(w.scalar_type()));
  }
}

void LoraMerge::forget() {
  model_is_base_ = false;
  base_.clear();
  adapters_.clear();
  units_.clear();
}

int64_t LoraMerge::base_bytes() const {
  int64_t bytes = 0;
  for (const auto& [module, t] : base_) bytes += t.numel() * static_cast<int64_t>(t.element_size());
  return bytes;
}

}  // namespace rlhf::rollout
