// Joining a collective group from a test's or a benchmark's own processes: every rank names
// the same file store, its rank and the group's size. One copy for the test helpers and the
// multi-process benchmarks (they include it from bench/ too).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "transport/collective_group.h"

namespace rlhf::test {

// Rank `rank` of a `size`-rank group that meets at the file store `store` (a fresh path for
// each group), Gloo unless `backend` says NCCL, which runs on `cuda_device`. The rendezvous
// and every collective wait at most `timeout`. Throws as make_collective_group does
// (InputError for a bad rank, RuntimeError naming the rank when a peer never comes).
inline std::unique_ptr<transport::CollectiveGroup> join_group(
    const std::string& store, int rank, int size, std::chrono::milliseconds timeout,
    transport::CollectiveBackend backend = transport::CollectiveBackend::kGloo,
    int cuda_device = 0) {
  transport::CollectiveConfig config;
  config.backend = backend;
  config.rank = rank;
  config.size = size;
  config.store_path = store;
  config.timeout = timeout;
  config.cuda_device = cuda_device;
  return transport::make_collective_group(config);
}

}  // namespace rlhf::test
