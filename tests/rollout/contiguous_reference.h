// The contiguous-cache generator rlhf ran before it had one engine (issue 40.2), kept only
// as the reference the paged engine is tested against: each micro batch of prompts is
// prefilled into one models::KvCache of P + R positions per row, copied to its n samples,
// and decoded a step at a time with finished rows compacted out. It draws from the same
// per-row sampling streams (rollout/sampling.h), so the same request and seed must give the
// same tokens as the paged engine, however that schedules them. Not used by rlhf itself.
#pragma once

#include <torch/types.h>

#include <memory>

#include "models/causal_lm.h"
#include "rollout/generator.h"

namespace rlhf::rollout::test {

// Rows as Generator::generate returns them (config's micro_batch_size prompts per cache;
// its kv_block_size, kv_cache_bytes and max_num_seqs do not apply). Timings: decode_steps,
// decode_tokens and kv_peak_bytes (the cache's bytes).
GenerationOutput contiguous_reference(const std::shared_ptr<models::CausalLM>& model,
                                      const GenerationConfig& config,
                                      const torch::Tensor& prompt_ids,
                                      const torch::Tensor& prompt_mask,
                                      const SamplingParams& params, int64_t first_prompt = 0);

}  // namespace rlhf::rollout::test
