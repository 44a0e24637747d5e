// Routing replay (issue 43.4), the rollout's half: the experts each sparse layer chose for
// every token a row's sequence fed through the paged engine (prompt, sampled tokens, an
// environment's answers), by position, through prefill, decode steps, extends and the
// recompute of a preempted row (a recompute writes its positions again: the routes that
// built the KV cache the row goes on with). The last token of a row is never fed, so it has
// none (-1), nor has padding. The routes travel with the samples (GenerationOutput::routes)
// and the actor replays them (models/routes.h).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "models/routes.h"

namespace rlhf::models {
class CausalLM;
}  // namespace rlhf::models

namespace rlhf::rollout {

class RouteLog {
 public:
  // Records `model`'s forwards for `rows` rows of up to `positions` positions each, from now
  // to destruction.
  RouteLog(models::CausalLM& model, int64_t rows, int64_t positions);

  // Where one input row of the last forward goes: columns [column, column + length) of its
  // input are positions [position, ...) of each of `rows` (a prompt's prefill serves its n).
  struct Span {
    int64_t input_row = 0;
    int64_t column = 0;
    int64_t length = 0;
    int64_t position = 0;
    std::vector<int64_t> rows;
  };
  // Files the routes of the forward just run (input [b, columns]) by `spans`; positions past a
  // row's end (a stopped row fed padding until the next check) are dropped.
  // `keep` [b] bool, when defined: the input rows whose routes count (-1 for the others).
  void store(int64_t columns, const std::vector<Span>& spans, const torch::Tensor& keep = {});

  // The batcher's three kinds of forward, over store(). A prefill of inputs [b, L]
  // left-padded: item i's lengths[i] tokens are positions 0.. of each of rows[i]. A decode
  // step [C, 1]: row rows[i] fed the token at positions[i] where live[i] ([C] bool; a row that
  // stopped is fed padding until it is released: no route there). An extend [b, T] right-padded:
  // row rows[i] fed lengths[i] tokens from positions[i].
  void prefilled(int64_t L, const std::vector<std::vector<int64_t>>& rows,
                 const std::vector<int64_t>& lengths);
  void decoded(const std::vector<int64_t>& rows, const std::vector<int64_t>& positions,
               const torch::Tensor& live);
  void extended(int64_t T, const std::vector<int64_t>& rows, const std::vector<int64_t>& positions,
                const std::vector<int64_t>& lengths);

  // Rows `rows` laid out as the output's sequences, [rows, T, S, k] for their attention_mask
  // [rows, T] (T = P + the response columns), -1 where it is 0 or nothing was recorded: row
  // r's prompt is row r / n of prompt_mask [B, P] (left-padded).
  torch::Tensor columns(const std::vector<int64_t>& rows, const torch::Tensor& prompt_mask,
                        int64_t n, const torch::Tensor& attention_mask) const;
  // Every row, in order.
  torch::Tensor columns(const torch::Tensor& prompt_mask, int64_t n,
                        const torch::Tensor& attention_mask) const;

 private:
  models::RouteRecorder recorder_;
  torch::Tensor routes_;  // [rows, positions, S, k] kRouteDtype, -1
};

class PagedBatcher;

// Routing replay for one paged call (`on`: Generator::set_record_routes): a log of `rows`
// rows of `positions` positions that `batcher` records into, or null when off. Throws
// InputError with padded decode steps (their forwards run outside the batcher's view).
std::unique_ptr<RouteLog> log_routes(bool on, models::CausalLM& model, PagedBatcher& batcher,
                                     bool padded_steps, int64_t rows, int64_t positions);

}  // namespace rlhf::rollout
