// Routing replay checks the rollout tests share (route_log_test.cpp, multi_turn_test.cpp):
// the routes a generation recorded against a fresh forward of each row's whole sequence.
#pragma once

#include "models/causal_lm.h"
#include "rollout/generator.h"

namespace rlhf::rollout::route_check {

// For every row of `out` (generated with set_record_routes): a route at each of its tokens
// (attention mask 1) but the last when it has a response (the last is never fed), none on
// padding, and (FP32) the experts a fresh unpadded forward of the row through `model` picks,
// as sets, at every routed token. Returns the tokens compared.
int64_t expect_routes_of_a_fresh_forward(models::CausalLM& model, const GenerationOutput& out);

}  // namespace rlhf::rollout::route_check
