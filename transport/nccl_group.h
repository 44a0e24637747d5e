// The NCCL backend of CollectiveGroup: raw NCCL calls on CUDA tensors' memory, one
// communicator per group, bootstrapped through the group's store. Compiled only where the
// CUDA toolkit ships NCCL (RLHF_HAVE_NCCL); it does not handle CPU tensors (GlooGroup does).
#pragma once

#include <memory>
#include <string>

#include "transport/collective_group.h"
#include "transport/store.h"

namespace rlhf::transport {

// Joins an NCCL group through `store` (opened by make_collective_group). Throws
// rlhf::RuntimeError when the build has no NCCL, when CUDA/NCCL calls fail, or when
// rendezvous fails.
std::unique_ptr<CollectiveGroup> make_nccl_group(const CollectiveConfig& config,
                                                 const c10::intrusive_ptr<c10d::Store>& store);

// The NCCL version this build was compiled against ("2.28.9"), or "" without NCCL.
std::string nccl_version();

}  // namespace rlhf::transport
