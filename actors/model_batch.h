// The batch a model worker's forward and train operations read from a request (private to
// actors/): sequences whose last action_len positions are the responses, their rows, and the
// temperature the log-probs are taken at. Used by model_operations.cpp (scoring) and
// train_operations.cpp (train steps).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <utility>

#include "actors/operation_registry.h"
#include "transport/message.h"

namespace rlhf::model_ops {

struct Batch {
  torch::Tensor sequences;       // [B, T] int64 prompt + response ids
  torch::Tensor attention_mask;  // [B, T]
  int64_t action_len = 0;        // A: the last A positions are the response
  torch::Tensor routes;          // [B, T, S, k] the rollout's routes, when sent
};

// The request's batch on `device` (the worker's), its last action_len positions the responses.
Batch read_batch(const Message& req, int64_t action_len, torch::Device device);
// Rows [b0, b1) of the request's tensor `name`, on `device`.
torch::Tensor rows(const Message& req, const char* name, int64_t b0, int64_t b1,
                   torch::Device device);
Batch slice(const Batch& b, int64_t begin, int64_t end);

// Hidden states [B, T, H] whose head outputs are the logits / temperature: the LM head is a
// linear map without bias (Llama, Qwen2), so (h / T) W^T = (h W^T) / T. Log-probs and
// entropy for the PPO ratio and KL are taken at the sampling temperature, as OpenRLHF
// (logits.div_(temperature) in Actor.forward) and veRL do. A request's temperature 1 or 0
// (greedy sampling) leaves the logits as they are; a negative one throws InputError.
double request_temperature(double t, const char* op);
torch::Tensor at_temperature(const torch::Tensor& hidden, double temperature);

// This rank's rows of a global batch of `rows` split evenly over the group.
std::pair<int64_t, int64_t> rank_rows(int64_t rows, const WorkerIdentity& self,
                                      const std::string& op);

}  // namespace rlhf::model_ops
