// The tiny training job shared by the engine tests and their worker process: a 2-layer
// Llama (hidden 64, vocab 288), a fixed global batch per step of 8 random sequences of 16
// tokens, split into 4 micro batches of 2, and the next-token NLL loss.
#pragma once

#include <torch/torch.h>

#include <memory>

#include "engine/trainer_config.h"
#include "models/causal_lm.h"
#include "models/config.h"
#include "models/lora.h"

namespace rlhf::testing {

inline constexpr int64_t kGlobalMicroBatches = 4;  // per step, over all ranks
inline constexpr int64_t kMicroBatchSize = 2;
inline constexpr int64_t kSeqLen = 16;
inline constexpr int64_t kSteps = 5;

inline models::ModelConfig tiny_config(bool tied) {
  models::ModelConfig config;  // the defaults are the tiny preset's shape
  config.torch_dtype = "float32";
  config.tie_word_embeddings = tied;
  config.validate("tiny test config");
  return config;
}

// Same seed, same weights (FP32, CPU), per-layer checkpointing on.
inline std::shared_ptr<models::CausalLM> tiny_model(bool tied, bool checkpointing = true) {
  auto model = std::make_shared<models::CausalLM>(tiny_config(tied));
  model->init_weights(1234);
  model->set_checkpointing(checkpointing ? models::Checkpointing::kPerLayer
                                         : models::Checkpointing::kNone);
  return model;
}

// The tiny model with rank-8 adapters on every linear of the decoder (A from seed 7, B
// zero), the base frozen: what a LoRA role trains.
inline models::LoraConfig tiny_lora_config() {
  models::LoraConfig lora;
  lora.rank = 8;
  lora.alpha = 16;
  return lora;
}
inline std::shared_ptr<models::CausalLM> tiny_lora_model(bool tied, bool checkpointing = true) {
  auto model = tiny_model(tied, checkpointing);
  models::apply_lora(*model, tiny_lora_config(), 7);
  return model;
}

// Token ids [2, 16] of global micro batch `micro` of optimizer step `step` (0-based):
// arithmetic sequences (random start, stride 1-3) modulo the vocabulary, so there is
// something to learn and each step's update moves the loss visibly.
inline torch::Tensor micro_batch(int64_t step, int64_t micro, int64_t vocab) {
  auto gen = at::detail::createCPUGenerator(static_cast<uint64_t>(1000 + step * 16 + micro));
  auto start = torch::randint(vocab, {kMicroBatchSize, 1}, gen, torch::kLong);
  auto stride = torch::randint(1, 4, {kMicroBatchSize, 1}, gen, torch::kLong);
  return (start + stride * torch::arange(kSeqLen, torch::kLong)).remainder(vocab);
}

// Mean next-token negative log-likelihood over the micro batch, FP32.
inline torch::Tensor nll_loss(models::CausalLM& model, const torch::Tensor& tokens) {
  auto hidden = model.forward(tokens, torch::ones_like(tokens));
  return -model.next_token_log_probs(hidden, tokens).mean();
}

// The settings every parity run uses: warmup 2 of 8 steps (lr 0, lr/2, lr, then cosine),
// weight decay and clipping on, so each feature changes the numbers.
inline engine::TrainerConfig parity_config(int stage, torch::Dtype dtype, int world) {
  engine::TrainerConfig config;
  config.zero_stage = static_cast<engine::ZeroStage>(stage);
  config.compute_dtype = dtype;
  config.lr = 1e-2;
  config.weight_decay = 0.1;
  config.max_norm = 1.0;
  config.lr_scheduler = engine::LrScheduler::kCosineWithMinLr;
  config.warmup_ratio = 0.25;
  config.total_steps = 8;
  config.grad_accum_steps = kGlobalMicroBatches / world;
  return config;
}

}  // namespace rlhf::testing
