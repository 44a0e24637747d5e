// The NCCL backend of CollectiveGroup: c10d's ProcessGroupNCCL from the linked LibTorch,
// bootstrapped through the group's store, collectives on torch's current CUDA stream (see
// nccl_group.cpp). Compiled only where NCCL's headers are found (RLHF_HAVE_NCCL); CPU tensors
// are staged through the GPU.
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

// An all_reduce_async in flight. wait() makes its result visible to what runs next: on a GPU
// (NCCL) torch's current stream waits for it, the host does not; on the CPU (Gloo) it has
// already run. Throws rlhf::RuntimeError when the collective failed. Must not outlive its
// group.
class PendingCollective {
 public:
  virtual ~PendingCollective() = default;
  virtual void wait() = 0;
};

// tensor = sum/max over the group, overlapping what the caller enqueues until the handle's
// wait(): with NCCL on its own stream (c10d's asynchronous Work; `tensor`, a contiguous CUDA
// tensor, must not be touched until then); any other group runs all_reduce now.
std::unique_ptr<PendingCollective> all_reduce_async(CollectiveGroup& group, torch::Tensor& tensor,
                                                    ReduceOp op);

// The NCCL version this build was compiled against ("2.28.9"), or "" without NCCL.
std::string nccl_version();

}  // namespace rlhf::transport
