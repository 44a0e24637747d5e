// The trainer's settings, filled by the caller from the job spec (never the whole spec).
// Defaults are OpenRLHF's where the concept exists there (actor optimizer settings).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>

#include "engine/loss_scaler.h"

namespace rlhf::engine {

// What each rank keeps a shard of (ZeRO paper, Rajbhandari et al. 2020).
enum class ZeroStage : int {
  kOptimizer = 1,   // FP32 master weights and AdamW moments sharded; grads all-reduced
  kGradients = 2,   // + gradients reduce-scattered as soon as a unit's backward is done
  kParameters = 3,  // + parameters sharded, all-gathered per unit just before use
};

// HF transformers' schedule names, as OpenRLHF passes them to get_scheduler.
enum class LrScheduler {
  kConstant,            // lr throughout (HF "constant": no warmup)
  kConstantWithWarmup,  // linear warmup from 0, then lr
  kCosineWithMinLr,     // linear warmup, then cosine from lr down to min_lr_ratio x lr
};

// Where the FP32 master weights and AdamW moments live (OpenRLHF `adam_offload`).
enum class OptimizerPlacement {
  kDevice,  // next to the parameters
  kHost,    // host memory; the step runs on the host. On a CPU trainer the same code path
            // runs and the copies are no-ops.
};

struct TrainerConfig {
  ZeroStage zero_stage = ZeroStage::kParameters;
  torch::Dtype compute_dtype = torch::kBFloat16;  // parameters and activations in forward
  // Dynamic loss scaling (loss_scaler.h): on exactly when compute_dtype is FP16 (the Trainer
  // sets `enabled` from it).
  LossScaleConfig loss_scale;
  torch::Device device = torch::kCPU;

  // AdamW (Loshchilov & Hutter: decoupled weight decay), on FP32 master weights.
  double lr = 1e-6;    // OpenRLHF --actor_learning_rate
  double beta1 = 0.9;  // OpenRLHF --adam_betas (0.9, 0.95)
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.0;  // OpenRLHF --l2; never applied to biases and norm weights
  double max_norm = 1.0;      // global gradient-norm clip across all shards; <= 0: off

  LrScheduler lr_scheduler = LrScheduler::kCosineWithMinLr;
  double warmup_ratio = 0.03;  // warmup steps = ceil(total_steps x warmup_ratio)
  double min_lr_ratio = 0.1;   // OpenRLHF: min_lr = 0.1 x lr
  int64_t total_steps = 1;     // optimizer steps the schedule spans

  int64_t grad_accum_steps = 1;  // micro batches per optimizer step on each rank
  OptimizerPlacement optimizer_placement = OptimizerPlacement::kDevice;
  // The head unit reads unit 0's embedding matrix (HF tie_word_embeddings): ZeRO-3 then
  // gathers unit 0 together with the head.
  bool tied_embeddings = false;

  // Throws InputError naming the field when a value is out of range.
  void validate() const;
};

}  // namespace rlhf::engine
