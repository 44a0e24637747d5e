// What a c10d collective hands back, and how both backends finish it. A collective returns a
// Work handle to wait on, or none at all: in torch 2.11 ProcessGroupNCCL returns a null handle
// for a collective launched with asyncOp = false (it is already queued on the current CUDA
// stream; torch's own distributed_c10d.py guards with `elif work is not None`), while Gloo
// always returns one. Calling wait() on the null handle crashed every synchronous NCCL
// collective (issue 39.1.1).
#pragma once

#include <torch/csrc/distributed/c10d/Work.hpp>

namespace rlhf::transport {

// Waits on `work` when there is one; a null handle means the collective needs no wait.
// Returns whether there was a handle. Throws what Work::wait throws (a failed collective).
inline bool wait_if_any(const c10::intrusive_ptr<c10d::Work>& work) {
  if (!work) return false;
  work->wait();
  return true;
}

}  // namespace rlhf::transport
