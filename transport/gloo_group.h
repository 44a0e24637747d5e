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

 protected:
  void do_all_reduce(torch::Tensor& tensor, ReduceOp op) override;
  void do_all_gather(torch::Tensor& output, const torch::Tensor& input) override;
  // All-reduces `input` in place and keeps this rank's slice. A ring all-reduce moves twice
  // the bytes of a ring reduce-scatter, but measured here it beats c10d Gloo's own
  // reduce-scatter (_reduce_scatter_base, LibTorch 2.11: 56 vs 88 ms for 64 MiB, N = 2)
  // and 1.13's alltoall + local sum (184 vs 307 ms); see bench/RESULTS.md.
  void do_reduce_scatter(torch::Tensor& output, torch::Tensor& input) override;
  void do_broadcast(torch::Tensor& tensor, int root) override;
  void do_scatter(torch::Tensor& output, const std::vector<torch::Tensor>& inputs,
                  int root) override;
  // Raw bytes (any dtype): rows become row-bytes runs of one kByte tensor.
  void do_all_to_all(torch::Tensor& output, const torch::Tensor& input,
                     const std::vector<int64_t>& output_splits,
                     const std::vector<int64_t>& input_splits) override;
  void do_barrier() override;

 private:
  // Starts one c10d work item and waits for it; a failure becomes rlhf::RuntimeError.
  template <typename StartWork>
  void run(const char* operation, StartWork&& start);

  int rank_;
  int size_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> group_;  // complete type only in gloo_group.cpp
};

}  // namespace rlhf::transport
