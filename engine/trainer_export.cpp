// Trainer: the model's weights whole, one unit at a time: the streamed HF export, the units
// the weight sync sends (expert-parallel experts gathered over the EP group), a LoRA run's
// trainable tensors.
#include <malloc.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/errors.h"
#include "engine/trainer.h"
#include "models/expert_parallel.h"
#include "models/pretrained.h"
#include "models/safetensors.h"

namespace rlhf::engine {

namespace fs = std::filesystem;

namespace {

int64_t heap_in_use() {
  struct mallinfo2 info = mallinfo2();
  return static_cast<int64_t>(info.uordblks + info.hblkhd);  // arena + mmap'd blocks
}

// config_json with its precision set to the exported weights' dtype: transformers 5 reads
// "dtype", 4.x "torch_dtype"; a BF16 export labelled float32 would load with the wrong label.
std::string config_with_dtype(const std::string& config_json, torch::Dtype dtype) {
  nlohmann::json config;
  try {
    config = nlohmann::json::parse(config_json);
  } catch (const nlohmann::json::exception& e) {
    throw InputError(std::string("export_hf: the model config is not JSON: ") + e.what());
  }
  if (!config.is_object()) throw InputError("export_hf: the model config is not a JSON object");
  const std::string name = models::dtype_hf_name(dtype);
  config["dtype"] = name;
  config["torch_dtype"] = name;
  return config.dump(2) + "\n";
}

// An expert unit's slots per expert (each expert's parameters are consecutive slots).
size_t slots_per_expert(const ShardedUnit& unit) {
  const size_t count = static_cast<size_t>(unit.expert_count());
  TORCH_CHECK(count > 0 && unit.slots().size() % count == 0, "Trainer: expert unit ", unit.name(),
              " holds ", unit.slots().size(), " parameters for ", count, " experts");
  return unit.slots().size() / count;
}

// Global expert e's tensor i: local expert (e mod count)'s slot, named for e.
const ParamSlot& expert_slot(const ShardedUnit& unit, int64_t e, size_t i) {
  const size_t per = slots_per_expert(unit);
  return unit.slots()[static_cast<size_t>(e % unit.expert_count()) * per + i];
}

}  // namespace

std::vector<models::ShapeList> Trainer::unit_layout() const {
  std::vector<models::ShapeList> out;
  for (const auto& members : members_) {
    models::ShapeList specs;
    for (size_t m : members) {
      const ShardedUnit& unit = *units_[m];
      if (unit.expert_count() == 0) {
        for (const auto* list : {&unit.slots(), &unit.frozen()})
          for (const auto& slot : *list) specs.emplace_back(slot.name, slot.shape);
        continue;
      }
      const int64_t experts = unit.expert_count() * experts_.ep->size();
      for (int64_t e = 0; e < experts; ++e)
        for (size_t i = 0; i < slots_per_expert(unit); ++i) {
          const ParamSlot& slot = expert_slot(unit, e, i);
          specs.emplace_back(models::with_expert_index(slot.name, e), slot.shape);
        }
    }
    out.push_back(std::move(specs));
  }
  return out;
}

std::vector<std::pair<std::string, torch::Tensor>> Trainer::acquire_unit(int64_t index,
                                                                         bool with_frozen) {
  TORCH_CHECK(index >= 0 && index < static_cast<int64_t>(members_.size()), "Trainer: unit ", index,
              " out of range");
  torch::NoGradGuard no_grad;
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (size_t m : members_[static_cast<size_t>(index)]) {
    ShardedUnit& unit = *units_[m];
    acquired_[m] = !unit.gathered();
    unit.gather(with_frozen);  // ZeRO-3: all-gather over the unit's group; else a no-op
    if (unit.expert_count() == 0) {
      for (const auto& slot : unit.slots()) out.emplace_back(slot.name, slot.param.detach());
      if (with_frozen)
        for (const auto& slot : unit.frozen()) out.emplace_back(slot.name, slot.param.detach());
      continue;
    }
    // This rank's experts end to end, all-gathered over the EP group: every rank's, rank order.
    std::vector<torch::Tensor> parts;
    for (const auto& slot : unit.slots()) parts.push_back(slot.param.detach().reshape({-1}));
    const torch::Tensor local = torch::cat(parts);
    const int64_t n = local.numel();
    torch::Tensor all = torch::empty({n * experts_.ep->size()}, local.options());
    experts_.ep->all_gather(all, local);
    const int64_t experts = unit.expert_count() * experts_.ep->size();
    for (int64_t e = 0; e < experts; ++e)
      for (size_t i = 0; i < slots_per_expert(unit); ++i) {
        const ParamSlot& slot = expert_slot(unit, e, i);
        const int64_t at = (e / unit.expert_count()) * n + slot.offset;
        out.emplace_back(models::with_expert_index(slot.name, e),
                         all.narrow(0, at, slot.numel).view(slot.shape));
      }
  }
  return out;
}

void Trainer::release_unit(int64_t index) {
  for (size_t m : members_.at(static_cast<size_t>(index))) {
    if (acquired_[m]) units_[m]->release();
    acquired_[m] = false;
  }
}

std::vector<std::pair<std::string, torch::Tensor>> Trainer::gather_trainable() {
  restore_optimizer_state();
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (auto& unit : units_) {
    TORCH_CHECK(unit->expert_count() == 0,
                "Trainer::gather_trainable: not for an expert-parallel model");
    if (unit->slots().empty()) continue;         // same on every rank: the layout is shared
    torch::Tensor full = unit->gather_master();  // [padded] FP32
    for (const auto& slot : unit->slots())
      out.emplace_back(
          slot.name,
          full.narrow(0, slot.offset, slot.numel).view(slot.shape).to(torch::kCPU).clone());
  }
  return out;
}

void Trainer::export_unit(ShardedUnit& unit, models::SafetensorsWriter* writer, torch::Dtype dtype,
                          int64_t heap_start) {
  export_memory_.largest_unit_bytes =
      std::max(export_memory_.largest_unit_bytes, unit.padded_numel() * 4);
  // [padded] FP32 over the unit's group: one unit, never more (an expert unit: this EP
  // rank's experts).
  torch::Tensor full = unit.gather_master();
  const int64_t full_bytes = full.numel() * 4;
  const bool frozen_here = !unit.gathered();
  unit.gather_frozen();  // ZeRO-3 shards a frozen base too: collective, every rank
  tracker_.add(MemoryKind::kGathered, full_bytes);
  auto write = [&](const std::string& name, const torch::Tensor& values) {
    auto tensor = values.to(torch::kCPU, dtype);
    const int64_t bytes = tensor.numel() * static_cast<int64_t>(tensor.element_size());
    tracker_.add(MemoryKind::kBuffers, bytes);
    export_memory_.peak_heap_growth =
        std::max(export_memory_.peak_heap_growth, heap_in_use() - heap_start);
    writer->write(name, tensor);
    tracker_.sub(MemoryKind::kBuffers, bytes);
  };
  if (unit.expert_count() > 0) {
    // Every EP rank's experts to rank 0, one expert at a time over EP group 0 (the ranks
    // with expert-data-parallel rank 0, world rank 0 among them).
    const size_t per = slots_per_expert(unit);
    const int64_t count = unit.expert_count();
    for (int p = 0; experts_.edp->rank() == 0 && p < experts_.ep->size(); ++p)
      for (int64_t j = 0; j < count; ++j) {
        const ParamSlot& first = unit.slots()[static_cast<size_t>(j) * per];
        const ParamSlot& last = unit.slots()[static_cast<size_t>(j + 1) * per - 1];
        const int64_t n = last.offset + last.numel - first.offset;
        torch::Tensor one = experts_.ep->rank() == p ? full.narrow(0, first.offset, n).clone()
                                                     : torch::empty({n}, full.options());
        tracker_.add(MemoryKind::kBuffers, n * 4);
        experts_.ep->broadcast(one, p);
        for (size_t i = 0; writer && i < per; ++i) {
          const ParamSlot& slot = unit.slots()[static_cast<size_t>(j) * per + i];
          write(models::with_expert_index(slot.name, p * count + j),
                one.narrow(0, slot.offset - first.offset, slot.numel).view(slot.shape));
        }
        tracker_.sub(MemoryKind::kBuffers, n * 4);
      }
  } else if (writer) {
    for (const auto& slot : unit.slots())
      write(slot.name, full.narrow(0, slot.offset, slot.numel).view(slot.shape));
    for (const auto& slot : unit.frozen())
      writer->write(slot.name, slot.param.data().to(torch::kCPU, dtype));
  }
  if (frozen_here) unit.release();
  export_memory_.peak_heap_growth =
      std::max(export_memory_.peak_heap_growth, heap_in_use() - heap_start);
  full = torch::Tensor();
  tracker_.sub(MemoryKind::kGathered, full_bytes);
}

void Trainer::export_hf(const std::string& dir, const std::string& config_json,
                        torch::Dtype dtype) {
  restore_optimizer_state();
  const bool writer_rank = group_.rank() == 0;
  const fs::path final_dir(dir);
  const fs::path tmp_dir = final_dir.string() + ".tmp-export";
  std::unique_ptr<models::SafetensorsWriter> writer;
  if (writer_rank) {
    fs::remove_all(tmp_dir);
    fs::create_directories(tmp_dir);
    std::vector<models::TensorInfo> layout;
    for (const auto& unit : unit_layout())
      for (const auto& [name, shape] : unit) layout.push_back({name, dtype, shape, 0, 0});
    writer = std::make_unique<models::SafetensorsWriter>(
        (tmp_dir / models::kSingleFileName).string(), layout);
  }
  export_memory_ = ExportMemory{};
  const int64_t heap_start = heap_in_use();
  const int64_t engine_start = tracker_.total();
  tracker_.reset_peak();
  for (auto& unit : units_) export_unit(*unit, writer.get(), dtype, heap_start);
  export_memory_.peak_engine_bytes = tracker_.report().peak - engine_start;
  if (writer_rank) {
    writer->finish();
    std::ofstream config_file(tmp_dir / "config.json");
    config_file << config_with_dtype(config_json, dtype);
    config_file.close();
    if (!config_file)
      throw RuntimeError("export_hf: cannot write " + (tmp_dir / "config.json").string());
    std::error_code ec;
    fs::remove_all(final_dir, ec);
    fs::rename(tmp_dir, final_dir, ec);
    if (ec)
      throw RuntimeError("export_hf: cannot rename " + tmp_dir.string() + " to " + dir + ": " +
                         ec.message());
  }
  group_.barrier();  // the export is complete on disk when any rank returns
}

}  // namespace rlhf::engine
