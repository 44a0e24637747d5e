// Trainer: the hooks that drive ZeRO-3 gathering and early gradient reduction, the step
// (norm, clip, AdamW, schedule), checkpoints. The export and the weights whole: trainer_export.cpp.
#include "engine/trainer.h"

#include <cmath>

#include "core/errors.h"
#include "models/expert_parallel.h"

namespace rlhf::engine {

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

namespace {

// A model unit's routed experts apart from the rest (the experts' own sharded unit).
std::pair<models::ParamUnit, models::ParamUnit> split_experts(const models::ParamUnit& unit) {
  models::ParamUnit dense{unit.name, {}, {}}, routed{unit.name + ".experts", {}, {}};
  routed.expert_first = unit.expert_first;
  routed.expert_count = unit.expert_count;
  for (size_t i = 0; i < unit.params.size(); ++i) {
    auto& to = models::expert_index(unit.params[i].first) >= 0 ? routed : dense;
    to.params.push_back(unit.params[i]);
    to.shapes.push_back(unit.shapes[i]);
  }
  return {dense, routed};
}

}  // namespace

Trainer::Trainer(const TrainerConfig& config, models::ShardableModel& model,
                 transport::CollectiveGroup& group, const models::WeightSource* source,
                 ExpertGroups experts)
    : config_(config),
      model_(model),
      group_(group),
      schedule_((config.validate(), config)),
      experts_(experts),
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
  ShardContext expert_context = context;
  expert_context.group = experts_.edp;
  expert_context.grad_divisor = group_.size();
  for (const auto& unit : model_.param_units()) {
    members_.push_back({units_.size()});
    if (unit.expert_count == 0) {
      units_.push_back(std::make_unique<ShardedUnit>(unit, context, source));
      continue;
    }
    TORCH_CHECK(experts_.ep && experts_.edp &&
                    experts_.ep->size() * experts_.edp->size() == group_.size() &&
                    experts_.ep->rank() == group_.rank() % experts_.ep->size(),
                "Trainer: an expert-parallel model needs its EP and expert-data-parallel groups "
                "(EP x EDP = the trainer's ",
                group_.size(), " ranks, EP rank = rank mod EP)");
    auto [dense, routed] = split_experts(unit);
    units_.push_back(std::make_unique<ShardedUnit>(dense, context, source));
    members_.back().push_back(units_.size());
    units_.push_back(std::make_unique<ShardedUnit>(routed, expert_context, source));
    TORCH_CHECK(units_.back()->frozen().empty(),
                "Trainer: frozen experts (LoRA) under expert parallelism are not supported");
  }
  TORCH_CHECK(!units_.empty(), "Trainer: the model has no parameter units");
  reduced_.assign(units_.size(), false);
  acquired_.assign(units_.size(), false);
  hooks_ = std::make_unique<Hooks>(*this);
  model_.set_layer_hooks(hooks_.get());
}

Trainer::~Trainer() {
  model_.set_layer_hooks(nullptr);
}

void Trainer::before_unit(int unit) {
  TORCH_CHECK(unit >= 0 && unit < static_cast<int>(members_.size()),
              "Trainer: hook for unknown unit ", unit);
  // A training forward (grad mode on; scoring runs without) opens the step's window.
  if (torch::GradMode::is_enabled()) open_traffic_window();
  for (size_t m : members_[unit]) units_[m]->gather();
  if (config_.tied_embeddings && unit == static_cast<int>(members_.size()) - 1) units_[0]->gather();
}

transport::CollectiveTraffic Trainer::traffic() const {
  transport::CollectiveTraffic t = group_.traffic();
  if (experts_.ep) t += experts_.ep->traffic();
  if (experts_.edp) t += experts_.edp->traffic();
  return t;
}

void Trainer::open_traffic_window() {
  if (traffic_window_open_) return;
  step_start_traffic_ = traffic();
  traffic_window_open_ = true;
}

void Trainer::after_unit(int unit) {
  for (size_t m : members_[unit]) units_[m]->release_if_unused();
  // A tied head's matrix (unit 0) stays while the head unit does (a training forward: the
  // graph holds the final norm): the log-probs after the norm read it under the same hook.
  if (config_.tied_embeddings && unit == static_cast<int>(members_.size()) - 1 &&
      !units_[members_[unit].front()]->gathered())
    units_[0]->release_if_unused();
}

void Trainer::after_unit_backward(int unit) {
  // Reduce-scatter (or accumulate) this unit's gradients while the rest of backward runs
  // on; the parameters gathered for the recompute go now.
  for (size_t m : members_[unit]) {
    units_[m]->reduce_grads();
    reduced_[m] = true;
    units_[m]->release();
  }
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
    // In FP64 on the CPU, whose FP32 norm accumulates in FP32 (2.8e-5 relative error at 2M
    // elements, measured); CUDA's FP32 reduction is a tree, exact enough.
    const torch::Tensor& g = grads.back();
    const double norm =
        (g.is_cpu() ? torch::linalg_vector_norm(g, 2, c10::nullopt, false, torch::kDouble)
                    : g.norm())
            .item<double>();
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
  last_step_traffic_ = traffic() - step_start_traffic_;
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

}  // namespace rlhf::engine
