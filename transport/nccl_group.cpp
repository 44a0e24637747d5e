// CollectiveGroup over c10d's ProcessGroupNCCL from the LibTorch we link (issue 32.4), built
// on the group's (authenticated) store. Each collective on CUDA tensors is enqueued on
// torch's current CUDA stream (asyncOp = false: no side stream, no event, no host wait), so
// whatever runs next on that stream sees the result and a CUDA graph can capture it;
// all_reduce_async (nccl_group.h) runs on NCCL's own stream and returns a Work handle to wait
// on later.
// Failures: ProcessGroupNCCL's watchdog thread watches every collective against the group's
// timeout and aborts the communicators when one is late or NCCL reports an error (a peer
// died). It runs here in CleanUpOnly mode (TORCH_NCCL_ASYNC_ERROR_HANDLING=2 unless the
// environment says otherwise): the process lives and the next call through this group
// aborts it (check(): else torch's heartbeat monitor ends the process minutes later) and
// throws CollectiveFailure naming rank and operation. Calls that hand a result to the host (CPU
// tensors staged through the GPU, barrier) wait for it and check once more.
// Built only with RLHF_HAVE_NCCL; runs only where there is a GPU.
#include "transport/nccl_group.h"

#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <nccl.h>

#include <cstdlib>
#include <functional>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#include <vector>

#include "core/errors.h"
#include "transport/c10d_work.h"

namespace rlhf::transport {
namespace {

// CPU tensors (control values, checkpoint bookkeeping) are staged through the GPU, so
// callers need not know the backend.
bool on_host(const torch::Tensor& t) {
  return t.defined() && t.device().is_cpu();
}

void check_cuda_contiguous(const torch::Tensor& t, const char* what) {
  TORCH_CHECK(t.defined() && t.is_cuda() && t.is_contiguous(), "nccl ", what,
              ": needs a defined, contiguous CUDA tensor");
}

c10d::ReduceOp reduce_op(ReduceOp op) {
  return op == ReduceOp::kSum ? c10d::ReduceOp(c10d::ReduceOp::SUM)
                              : c10d::ReduceOp(c10d::ReduceOp::MAX);
}

const char* error_name(c10d::ErrorType error) {
  switch (error) {
    case c10d::ErrorType::TIMEOUT:
      return "a collective timed out (a peer is gone or stuck)";
    case c10d::ErrorType::COMM_ERROR:
      return "NCCL reported an error (a peer's connection lost)";
    case c10d::ErrorType::REMOTE_ERROR:
      return "a peer reported an error";
    default:
      return "unknown error";
  }
}

class NcclGroup;

// all_reduce_async's handle: the Work of a collective on NCCL's stream.
class NcclPending final : public PendingCollective {
 public:
  NcclPending(NcclGroup& group, c10::intrusive_ptr<c10d::Work> work)
      : group_(group), work_(std::move(work)) {}
  void wait() override;

 private:
  NcclGroup& group_;
  c10::intrusive_ptr<c10d::Work> work_;
};

class NcclGroup final : public CollectiveGroup {
 public:
  NcclGroup(const CollectiveConfig& config, const c10::intrusive_ptr<c10d::Store>& store)
      : rank_(config.rank),
        size_(config.size),
        device_(torch::kCUDA, static_cast<c10::DeviceIndex>(config.cuda_device)) {
    // Abort the communicators on a timeout or NCCL error and keep the process (the default,
    // 3, would end it from the watchdog thread); read by ProcessGroupNCCL's constructor.
    ::setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2", /*overwrite=*/0);
    auto options = c10d::ProcessGroupNCCL::Options::create();
    options->timeout = config.timeout;
    try {
      c10::cuda::set_device(device_.index());
      pg_ = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank_, size_, options);
      pg_->setBoundDeviceId(device_);
      pg_->eagerConnectSingleDevice(device_);  // rendezvous now, not at the first collective
    } catch (const std::exception& e) {
      throw CollectiveFailure(where("join") + e.what());
    }
  }

  ~NcclGroup() override {
    try {  // nothing to do on failure in a destructor
      if (pg_->getError() == c10d::ErrorType::SUCCESS)
        pg_->shutdown();
      else if (!aborted_)
        pg_->abort();
    } catch (...) {
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend_name() const override { return "nccl"; }

  void do_all_reduce(torch::Tensor& tensor, ReduceOp op) override {
    if (on_host(tensor)) {
      auto staged = tensor.to(device_);
      do_all_reduce(staged, op);
      tensor.copy_(staged);  // waits for the device
      check("all_reduce");
      return;
    }
    check_cuda_contiguous(tensor, "all_reduce");
    run("all_reduce", [&] {
      std::vector<at::Tensor> tensors{tensor};
      c10d::AllreduceOptions options;
      options.reduceOp = reduce_op(op);
      options.asyncOp = false;
      return pg_->allreduce(tensors, options);
    });
  }

  std::unique_ptr<PendingCollective> all_reduce_async(torch::Tensor& tensor, ReduceOp op) {
    check_cuda_contiguous(tensor, "all_reduce_async");
    check("all_reduce_async");
    try {
      std::vector<at::Tensor> tensors{tensor};
      c10d::AllreduceOptions options;
      options.reduceOp = reduce_op(op);
      options.asyncOp = true;  // on NCCL's stream, after the current stream's work so far
      return std::make_unique<NcclPending>(*this, pg_->allreduce(tensors, options));
    } catch (const std::exception& e) {
      throw CollectiveFailure(where("all_reduce_async") + e.what());
    }
  }

  void do_all_gather(torch::Tensor& output, const torch::Tensor& input) override {
    if (on_host(output) || on_host(input)) {
      auto out = on_host(output) ? output.to(device_) : output;
      do_all_gather(out, on_host(input) ? input.to(device_) : input);
      if (on_host(output)) output.copy_(out);
      check("all_gather");
      return;
    }
    check_cuda_contiguous(output, "all_gather output");
    check_cuda_contiguous(input, "all_gather input");
    TORCH_CHECK(output.numel() == input.numel() * size_ && output.dtype() == input.dtype(),
                "nccl all_gather: output must hold size x input elements of the same dtype");
    run("all_gather", [&] {
      auto in = input;
      c10d::AllgatherOptions options;
      options.asyncOp = false;
      return pg_->_allgather_base(output, in, options);
    });
  }

  void do_reduce_scatter(torch::Tensor& output, torch::Tensor& input) override {
    if (on_host(output) || on_host(input)) {
      auto out = on_host(output) ? output.to(device_) : output;
      auto in = on_host(input) ? input.to(device_) : input;
      do_reduce_scatter(out, in);
      if (on_host(output)) output.copy_(out);
      check("reduce_scatter");
      return;
    }
    check_cuda_contiguous(output, "reduce_scatter output");
    check_cuda_contiguous(input, "reduce_scatter input");
    TORCH_CHECK(input.numel() == output.numel() * size_ && output.dtype() == input.dtype(),
                "nccl reduce_scatter: input must hold size x output elements of the same dtype");
    run("reduce_scatter", [&] {
      c10d::ReduceScatterOptions options;
      options.asyncOp = false;
      return pg_->_reduce_scatter_base(output, input, options);
    });
  }

  void do_broadcast(torch::Tensor& tensor, int root) override {
    if (on_host(tensor)) {
      auto staged = tensor.to(device_);
      do_broadcast(staged, root);
      if (rank_ != root) tensor.copy_(staged);
      check("broadcast");
      return;
    }
    check_cuda_contiguous(tensor, "broadcast");
    run("broadcast", [&] {
      std::vector<at::Tensor> tensors{tensor};
      c10d::BroadcastOptions options;
      options.rootRank = root;
      options.asyncOp = false;
      return pg_->broadcast(tensors, options);
    });
  }

  void do_scatter(torch::Tensor& output, const std::vector<torch::Tensor>& inputs,
                  int root) override {
    TORCH_CHECK(rank_ != root || static_cast<int>(inputs.size()) == size_, "nccl scatter: root ",
                root, " needs ", size_, " inputs, got ", inputs.size());
    if (on_host(output)) {
      auto out = output.to(device_);
      do_scatter(out, inputs, root);
      output.copy_(out);
      check("scatter");
      return;
    }
    check_cuda_contiguous(output, "scatter output");
    std::vector<std::vector<at::Tensor>> device_inputs;  // root: one list of size() tensors
    if (rank_ == root) {
      device_inputs.emplace_back();
      for (const auto& in : inputs) {
        TORCH_CHECK(in.numel() == output.numel() && in.dtype() == output.dtype(),
                    "nccl scatter: every input must match the output's numel and dtype");
        device_inputs.back().push_back(on_host(in) ? in.to(device_).view(output.sizes())
                                                   : in.contiguous().view(output.sizes()));
      }
    }
    run("scatter", [&] {
      std::vector<at::Tensor> outputs{output};
      c10d::ScatterOptions options;
      options.rootRank = root;
      options.asyncOp = false;
      return pg_->scatter(outputs, device_inputs, options);
    });
  }

  void do_all_to_all(torch::Tensor& output, const torch::Tensor& input,
                     const std::vector<int64_t>& output_splits,
                     const std::vector<int64_t>& input_splits) override {
    if (on_host(output) || on_host(input)) {
      auto out = on_host(output) ? output.to(device_) : output;
      do_all_to_all(out, on_host(input) ? input.to(device_) : input, output_splits, input_splits);
      if (on_host(output)) output.copy_(out);
      check("all_to_all");
      return;
    }
    check_cuda_contiguous(output, "all_to_all output");
    run("all_to_all", [&] {
      auto in = input.contiguous();
      auto out_splits = output_splits;
      auto in_splits = input_splits;
      c10d::AllToAllOptions options;
      options.asyncOp = false;
      return pg_->alltoall_base(output, in, out_splits, in_splits, options);
    });
  }

  void do_barrier() override {
    // ProcessGroupNCCL's barrier is an all-reduce of one element; its Work's wait blocks the
    // host until the device has run it (a barrier must order host actions).
    run("barrier", [&] {
      c10d::BarrierOptions options;
      options.device_ids = {device_.index()};
      return pg_->barrier(options);
    });
    c10::cuda::getCurrentCUDAStream(device_.index()).synchronize();
    check("barrier");
  }

  // Throws when the watchdog has marked the group failed (timeout, NCCL error). The first time,
  // it aborts the group itself: in torch 2.11 the watchdog first waits for a debug dump
  // (about a minute, during which a host wait hangs) and its heartbeat monitor then ends the
  // process after TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC (480 s) unless the group was aborted.
  void check(const char* what) {
    const c10d::ErrorType error = pg_->getError();
    if (error == c10d::ErrorType::SUCCESS) return;
    if (!aborted_) {
      aborted_ = true;
      try {
        pg_->abort();
      } catch (...) {  // already aborted by the watchdog
      }
    }
    throw CollectiveFailure(where(what) + error_name(error) +
                            "; the communicators were aborted and the group is unusable");
  }

  std::string where(const char* what) const {
    return "nccl group: rank " + std::to_string(rank_) + "/" + std::to_string(size_) + ": " + what +
           ": ";
  }

 private:
  // Launches one collective on the current stream. With asyncOp false torch 2.11 returns no
  // Work (the collective is already queued there); a handle, where one comes back (barrier),
  // is waited on, which only makes the current stream wait. Never blocks the host.
  void run(const char* what, const std::function<c10::intrusive_ptr<c10d::Work>()>& launch) {
    check(what);
    try {
      wait_if_any(launch());
    } catch (const std::exception& e) {
      throw CollectiveFailure(where(what) + e.what());
    }
  }

  int rank_;
  int size_;
  torch::Device device_;
  c10::intrusive_ptr<c10d::ProcessGroupNCCL> pg_;
  bool aborted_ = false;  // check() aborted the group after a failure
};

void NcclPending::wait() {
  group_.check("all_reduce_async wait");
  try {
    wait_if_any(work_);  // the current stream waits for NCCL's; the host does not
  } catch (const std::exception& e) {
    throw CollectiveFailure(group_.where("all_reduce_async wait") + e.what());
  }
}

class DonePending final : public PendingCollective {
 public:
  void wait() override {}
};

}  // namespace

std::unique_ptr<PendingCollective> all_reduce_async(CollectiveGroup& group, torch::Tensor& tensor,
                                                    ReduceOp op) {
  if (auto* nccl = dynamic_cast<NcclGroup*>(&group)) return nccl->all_reduce_async(tensor, op);
  group.all_reduce(tensor, op);
  return std::make_unique<DonePending>();
}

std::string nccl_version() {
  return std::to_string(NCCL_MAJOR) + "." + std::to_string(NCCL_MINOR) + "." +
         std::to_string(NCCL_PATCH);
}

std::unique_ptr<CollectiveGroup> make_nccl_group(const CollectiveConfig& config,
                                                 const c10::intrusive_ptr<c10d::Store>& store) {
  return std::make_unique<NcclGroup>(config, store);
}

}  // namespace rlhf::transport
