// The rendezvous store of a collective group (c10d FileStore or TCPStore), shared by the
// Gloo and NCCL backends. Not a general key-value service.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "transport/collective_group.h"

namespace rlhf::transport {

// Opens the store named by `config`; for kTcp with StoreHost::kRank0, rank 0 starts the
// server. Throws rlhf::InputError for a bad config, rlhf::RuntimeError on failure.
c10::intrusive_ptr<c10d::Store> open_store(const CollectiveConfig& config);

}  // namespace rlhf::transport
