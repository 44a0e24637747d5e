// The Gloo backend of CollectiveGroup: c10d::ProcessGroupGloo on CPU tensors over loopback
// or the host named in the config. It does not handle CUDA tensors (that is NcclGroup).
#pragma once

#include "transport/collective_group.h"

namespace c10d {
class ProcessGroupGloo;
}

namespace rlhf::transport {

class GlooGroup final : public CollectiveGroup {
 public:
  explicit GlooGroup(const CollectiveConfig& config);
  ~GlooGroup() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend_name() const override { return "gloo"; }

  void all_reduce(torch::Tensor& tensor, ReduceOp op) override;
  void all_gather(torch::Tensor& output, const torch::Tensor& input) override;
  // Gloo in LibTorch 1.13 has no reduce-scatter: this one is a direct exchange (alltoall:
  // each rank receives every peer's copy of its own slice, (N-1)/N of the bytes, the same
  // volume as a ring reduce-scatter) followed by a local sum in rank order (deterministic).
  void reduce_scatter(torch::Tensor& output, const torch::Tensor& input) override;
  void broadcast(torch::Tensor& tensor, int root) override;
  void barrier() override;

 private:
  // Starts one c10d work item and waits for it; a failure becomes rlhf::RuntimeError.
  template <typename StartWork>
  void run(const char* operation, StartWork&& start);

  int rank_;
  int size_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> group_;  // complete type only in gloo_group.cpp
};

}  // namespace rlhf::transport
