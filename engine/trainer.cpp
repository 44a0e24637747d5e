// Trainer: the hooks that drive ZeRO-3 gathering and early gradient reduction, the step
// (norm, clip, AdamW, schedule), and the streamed HF export.
#include "engine/trainer.h"

#include <malloc.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/errors.h"
#include "models/pretrained.h"
#include "models/safetensors.h"

namespace rlhf::engine {

namespace fs = std::filesystem;

namespace {

LossScaleConfig loss_scale_of(const TrainerConfig& config) {
  LossScaleConfig c = config.loss_scale;
  c.enabled = config.compute_dtype == torch::kFloat16;
  return c;
}

}  // namespace

class Trainer::Hooks final : public models::LayerHooks {
 public:
  explicit Hooks(Trainer& trainer) : trainer_(trainer) {}
  void before_forward(int unit) override { trainer_.before_unit(unit); }
  void after_forward(int unit) override { trainer_.after_unit(unit); }
  void after_backward(int unit) override { trainer_.after_unit_backward(unit); }

 private:
  Trainer& trainer_;
};

Trainer::Trainer(const TrainerConfig& config, models::ShardableModel& model,
                 transport::CollectiveGroup& group, const models::WeightSource* source)
    : config_(config),
      model_(model),
      group_(group),
      schedule_((config.validate(), config)),
      scaler_(loss_scale_of(config)) {
  ShardContext context;
  context.group = &group_;
  context.tracker = &tracker_;
  context.stage = config_.zero_stage;
  context.compute_dtype = config_.compute_dtype;
  context.device = config_.device;
  context.state_device = config_.optimizer_placement == OptimizerPlacement::kHost
                             ? torch::Device(torch::kCPU)
                             : config_.device;
  for (const auto& unit : model_.param_units())
    units_.push_back(std::make_unique<ShardedUnit>(unit, context, source));
  TORCH_CHECK(!units_.empty(), "Trainer: the model has no parameter units");
  reduced_.assign(units_.size(), false);
  hooks_ = std::make_unique<Hooks>(*this);
  model_.set_layer_hooks(hooks_.get());
}

Trainer::~Trainer() {
  model_.set_layer_hooks(nullptr);
}

void Trainer::before_unit(int unit) {
  TORCH_CHECK(unit >= 0 && unit < static_cast<int>(units_.size()),
              "Trainer: hook for unknown unit ", unit);
  // A training forward (grad mode on; scoring runs without) opens the step's window.
  if (torch::GradMode::is_enabled()) open_traffic_window();
  units_[unit]->gather();
  if (config_.tied_embeddings && unit == static_cast<int>(units_.size()) - 1) units_[0]->gather();
}

void Trainer::open_traffic_window() {
  if (traffic_window_open_) return;
  step_start_traffic_ = group_.traffic();
  traffic_window_open_ = true;
}

void Trainer::after_unit(int unit) {
  units_[unit]->release_if_unused();
  // A tied head's matrix (unit 0) stays while the head unit does (a training forward: the
  // graph holds the final norm): the log-probs after the norm read it under the same hook.
  if (config_.tied_embeddings && unit == static_cast<int>(units_.size()) - 1 &&
      !units_[unit]->gathered())
    units_[0]->release_if_unused();
}

void Trainer::after_unit_backward(int unit) {
  // Reduce-scatter (or accumulate) this unit's gradients while the rest of backward runs
  // on; the parameters gathered for the recompute go now.
  units_[unit]->reduce_grads();
  reduced_[unit] = true;
  units_[unit]->release();
}

double Trainer::backward_multiplier() const {
  // FP16: scaled so small gradients survive (loss_scaler.h).
  const double scale = scaler_.enabled() ? scaler_.scale() : 1.0;
  return scale / static_cast<double>(config_.grad_accum_steps);
}

void Trainer::backward(const torch::Tensor& loss, bool ends_micro_batch) {
  TORCH_CHECK(loss.defined() && loss.numel() == 1, "Trainer::backward: loss must be a scalar");
  restore_optimizer_state();
  if (micro_ == 0 && !part_open_) tracker_.reset_peak();
  open_traffic_window();
  std::fill(reduced_.begin(), reduced_.end(), false);
  (loss * backward_multiplier()).backward();
  // Units the model did not signal (no checkpointing; embeddings and head), in unit order
  // on every rank so the collectives match.
  for (size_t u = 0; u < units_.size(); ++u) {
    if (!reduced_[u]) units_[u]->reduce_grads();
    units_[u]->release();
  }
  loss_sum_ += loss.detach().to(torch::kCPU, torch::kDouble).item<double>();
  part_open_ = !ends_micro_batch;
  if (ends_micro_batch) ++micro_;
}

StepMetrics Trainer::step() {
  TORCH_CHECK(!part_open_, "Trainer::step: the last micro batch's final part is missing");
  TORCH_CHECK(micro_ == config_.grad_accum_steps, "Trainer::step: expected ",
              config_.grad_accum_steps, " micro batches before a step, got ", micro_);
  restore_optimizer_state();
  StepMetrics metrics;
  std::vector<torch::Tensor> grads;
  auto sums = torch::zeros({2}, torch::TensorOptions(torch::kDouble));  // [sum of g^2, loss sum]
  double sq = 0.0;
  for (auto& unit : units_) {
    grads.push_back(unit->finish_grads());
    if (scaler_.enabled()) grads.back().mul_(1.0 / scaler_.scale());  // unscaled, FP32
    const double norm = grads.back().norm().item<double>();  // accumulates in double on CPU
    sq += norm * norm;
  }
  sums[0] = sq;
  sums[1] = loss_sum_ / static_cast<double>(micro_);
  auto reduced = sums.to(config_.device);
  group_.all_reduce(reduced, transport::ReduceOp::kSum);
  reduced = reduced.to(torch::kCPU);
  metrics.grad_norm = std::sqrt(reduced[0].item<double>());
  metrics.loss = reduced[1].item<double>() / group_.size();
  metrics.lr = schedule_.lr_at(step_);
  metrics.skipped = !std::isfinite(metrics.grad_norm);
  metrics.loss_scale = scaler_.scale();
  scaler_.update(!metrics.skipped);  // FP16: an overflow backs the scale off
  metrics.skipped_steps = scaler_.skipped_steps();
  if (!metrics.skipped) {
    // torch.nn.utils.clip_grad_norm_: coef = max_norm / (norm + 1e-6), applied when < 1.
    double coef = 1.0;
    if (config_.max_norm > 0.0) coef = std::min(1.0, config_.max_norm / (metrics.grad_norm + 1e-6));
    AdamWStep hp{metrics.lr,  config_.beta1,        config_.beta2,
                 config_.eps, config_.weight_decay, step_ + 1};
    for (size_t u = 0; u < units_.size(); ++u) {
      if (coef < 1.0) grads[u].mul_(coef);
      units_[u]->apply_adamw(grads[u], hp);
    }
    for (auto& unit : units_) unit->refresh_params();
    ++step_;
  }
  for (auto& unit : units_) unit->zero_grads();
  metrics.step = step_;
  last_step_traffic_ = group_.traffic() - step_start_traffic_;
  traffic_window_open_ = false;
  micro_ = 0;
  loss_sum_ = 0.0;
  metrics.memory = tracker_.report();
  return metrics;
}

int64_t Trainer::offload_optimizer_state() {
  if (config_.optimizer_placement == OptimizerPlacement::kHost || optimizer_offload_.offloaded())
    return 0;
  std::vector<torch::Tensor> state;
  for (auto& unit : units_) {
    // At stage 3 the FP32 master is where gathers take the weights from: it stays.
    if (config_.zero_stage != ZeroStage::kParameters) state.push_back(unit->master());
    state.push_back(unit->exp_avg());
    state.push_back(unit->exp_avg_sq());
    state.push_back(unit->grad_buffer());
  }
  return optimizer_offload_.offload(state);
}

int64_t Trainer::restore_optimizer_state() {
  return optimizer_offload_.restore();
}

StepMetrics Trainer::train_step(const LossFn& loss_fn) {
  for (int64_t i = 0; i < config_.grad_accum_steps; ++i) backward(loss_fn(i));
  return step();
}

void Trainer::save_checkpoint(const std::string& dir, const CheckpointOptions& options) {
  restore_optimizer_state();
  CheckpointOptions with_state = options;
  if (scaler_.enabled()) with_state.trainer_state = {{"loss_scaler", scaler_.state()}};
  save_sharded_checkpoint(dir, units_, step_, static_cast<int>(config_.zero_stage), group_,
                          with_state);
}

void Trainer::load_checkpoint(const std::string& dir) {
  TORCH_CHECK(micro_ == 0, "Trainer::load_checkpoint: in the middle of a step (", micro_,
              " micro batches)");
  restore_optimizer_state();
  nlohmann::json state;
  step_ = load_sharded_checkpoint(dir, units_, group_, &state);
  if (state.is_object() && state.contains("loss_scaler")) scaler_.load(state["loss_scaler"]);
  for (auto& unit : units_) unit->refresh_params();
}

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

}  // namespace

std::vector<std::pair<std::string, torch::Tensor>> Trainer::gather_trainable() {
  restore_optimizer_state();
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (auto& unit : units_) {
    if (unit->slots().empty()) continue;         // same on every rank: the layout is shared
    torch::Tensor full = unit->gather_master();  // [padded] FP32
    for (const auto& slot : unit->slots())
      out.emplace_back(
          slot.name,
          full.narrow(0, slot.offset, slot.numel).view(slot.shape).to(torch::kCPU).clone());
  }
  return out;
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
    for (const auto& unit : units_) {
      for (const auto* list : {&unit->slots(), &unit->frozen()}) {
        for (const auto& slot : *list) layout.push_back({slot.name, dtype, slot.shape, 0, 0});
      }
    }
    writer = std::make_unique<models::SafetensorsWriter>(
        (tmp_dir / models::kSingleFileName).string(), layout);
  }
  export_memory_ = ExportMemory{};
  const int64_t heap_start = heap_in_use();
  const int64_t engine_start = tracker_.total();
  tracker_.reset_peak();
  for (auto& unit : units_) {
    export_memory_.largest_unit_bytes =
        std::max(export_memory_.largest_unit_bytes, unit->padded_numel() * 4);
    torch::Tensor full = unit->gather_master();  // [padded] FP32: one unit, never more
    const int64_t full_bytes = full.numel() * 4;
    const bool frozen_here = !unit->gathered();
    unit->gather_frozen();  // ZeRO-3 shards a frozen base too: collective, every rank
    tracker_.add(MemoryKind::kGathered, full_bytes);
    if (writer_rank) {
      for (const auto& slot : unit->slots()) {
        auto tensor =
            full.narrow(0, slot.offset, slot.numel).view(slot.shape).to(torch::kCPU, dtype);
        tracker_.add(MemoryKind::kBuffers,
                     tensor.numel() * static_cast<int64_t>(tensor.element_size()));
        export_memory_.peak_heap_growth =
            std::max(export_memory_.peak_heap_growth, heap_in_use() - heap_start);
        writer->write(slot.name, tensor);
        tracker_.sub(MemoryKind::kBuffers,
                     tensor.numel() * static_cast<int64_t>(tensor.element_size()));
      }
      for (const auto& slot : unit->frozen())
        writer->write(slot.name, slot.param.data().to(torch::kCPU, dtype));
    }
    if (frozen_here) unit->release();
    export_memory_.peak_heap_growth =
        std::max(export_memory_.peak_heap_growth, heap_in_use() - heap_start);
    full = torch::Tensor();
    tracker_.sub(MemoryKind::kGathered, full_bytes);
  }
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
