// The KV pool and decode graphs a Generator keeps between paged generate calls on a GPU
// (Generator::release_paged_engine drops them). Internal to rollout/: generator.cpp and
// paged_generate.cpp.
#pragma once

#include <cstdint>
#include <memory>

#include "models/paged_kv_cache.h"
#include "rollout/decode_graph.h"
#include "rollout/generator.h"

namespace rlhf::rollout {

struct Generator::PagedEngine {
  int64_t num_blocks = 0, max_batch = 0, max_blocks = 0;
  std::unique_ptr<models::PagedKvCache> cache;
  std::unique_ptr<PagedDecoder> decoder;  // after the cache: destroyed first
};

}  // namespace rlhf::rollout
