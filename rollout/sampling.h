// Choosing the next token from logits [B, V]: greedy, temperature, top-k, top-p, each row
// drawing from its own seeded random stream so a rollout can be reproduced. Does not run
// the model or decide when a sequence stops (generator.h does).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <random>
#include <vector>

namespace rlhf::rollout {

// The job spec's rollout.temperature / top_k / top_p, plus the request's seed.
struct SamplingParams {
  double temperature = 1.0;  // 0: greedy (argmax); otherwise logits / temperature
  int64_t top_k = -1;        // keep the k largest logits; -1 (or >= V): off
  double top_p = 1.0;        // keep the smallest set of most likely tokens with mass >= top_p
  uint64_t seed = 0;         // row r of a request draws from the stream seeded by (seed, r)

  bool greedy() const { return temperature == 0.0; }
  // Throws InputError for temperature < 0, top_k == 0 or < -1, top_p outside (0, 1].
  void validate() const;
};

struct Sampled {
  torch::Tensor tokens;     // [A] int64
  torch::Tensor log_probs;  // [A] FP32: log-prob of each token under the distribution
                            // actually sampled from (see sampling_log_probs)
};

// The log-probs of the distribution a row is sampled from, FP32 [B, V]: log_softmax(logits
// / T) restricted to the top-k, then to the top-p nucleus (HF's warper order: temperature,
// top-k, top-p), renormalised; removed tokens are -inf. Greedy (T = 0) returns the model's
// own log_softmax(logits) (temperature 1, nothing removed): the log-prob a PPO actor
// recomputes. With T = 1 and no top-k/top-p this is exactly the model's distribution, so
// returned log-probs equal the actor's (OpenRLHF recomputes old log-probs on the actor and
// these are for checks and off-policy corrections).
torch::Tensor sampling_log_probs(const torch::Tensor& logits, const SamplingParams& params);

// Per-row random streams. Row r's stream is std::mt19937_64 seeded with splitmix64(seed ^
// splitmix64(r)): independent of batch composition, device and thread count, so the same
// (seed, row) gives the same tokens wherever it runs.
class Sampler {
 public:
  // Streams for request rows [first_row, first_row + rows) (a micro batch of a larger
  // request starts at its first row, so splitting a request changes no draw).
  Sampler(SamplingParams params, int64_t rows, int64_t first_row = 0);

  const SamplingParams& params() const { return params_; }

  // logits [A, V] (any float dtype, any device) of the request rows `rows` (A row ids in
  // [first_row, first_row + rows)): one token per row, by inverse-CDF sampling with one uniform
  // draw from each row's stream (greedy draws none). Returns tokens and log-probs on the logits'
  // device.
  Sampled sample(const torch::Tensor& logits, const std::vector<int64_t>& rows);

  // The next `steps` draws of request rows [first, first + rows), [rows, steps] FP64 on the
  // CPU: column t is what sample() would draw for the row's t-th token. A decode loop
  // uploads them once per micro batch and samples on the device with sample_uniform(), so
  // no token waits for the host (greedy draws nothing: returns an undefined tensor).
  torch::Tensor draws(int64_t first, int64_t rows, int64_t steps);
  // logits [A, V], u [A] FP64 on the logits' device (ignored when greedy): tokens and
  // log-probs on that device, by the same inverse-CDF rule as sample().
  Sampled sample_uniform(const torch::Tensor& logits, const torch::Tensor& u) const;

 private:
  SamplingParams params_;
  int64_t first_row_ = 0;
  std::vector<std::mt19937_64> streams_;
};

}  // namespace rlhf::rollout
