// rollout.*: generation (batching, sampling, the paged KV cache, tensor parallelism) and the
// actor -> rollout weight sync.
#pragma once

#include "core/spec_schema.h"

namespace rlhf::rollout {

SpecSection spec_section();

}  // namespace rlhf::rollout
