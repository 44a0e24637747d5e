// CollectiveGroup over NCCL for CUDA tensors: every call is enqueued on the legacy default
// stream (the one LibTorch uses unless told otherwise) and waited for, so results are ready
// when the call returns. A wait is bounded: the communicator is polled for asynchronous
// errors and aborted when a peer fails or the group's timeout passes, so a dead rank stops
// its peers with an error instead of hanging them (NCCL's own blocking mode would wait
// forever). Built only with RLHF_HAVE_NCCL; runs only where there is a GPU.
#include "transport/nccl_group.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "core/errors.h"

namespace rlhf::transport {
namespace {

void check_cuda(cudaError_t status, const char* what, int rank) {
  if (status != cudaSuccess) {
    throw RuntimeError(std::string("nccl group: rank ") + std::to_string(rank) + ": " + what +
                       ": " + cudaGetErrorString(status));
  }
}

void check_nccl(ncclResult_t status, const char* what, int rank) {
  if (status != ncclSuccess) {
    throw RuntimeError(std::string("nccl group: rank ") + std::to_string(rank) + ": " + what +
                       ": " + ncclGetErrorString(status));
  }
}

ncclDataType_t nccl_dtype(const torch::Tensor& t) {
  switch (t.scalar_type()) {
    case torch::kFloat:
      return ncclFloat32;
    case torch::kDouble:
      return ncclFloat64;
    case torch::kHalf:
      return ncclFloat16;
    case torch::kBFloat16:
      return ncclBfloat16;
    case torch::kInt:
      return ncclInt32;
    case torch::kLong:
      return ncclInt64;
    case torch::kByte:
      return ncclUint8;
    case torch::kChar:
      return ncclInt8;
    default:
      TORCH_CHECK(false, "nccl group: unsupported dtype ", t.scalar_type());
  }
}

// CPU tensors (control values, checkpoint bookkeeping) are staged through the GPU, so
// callers need not know the backend.
bool on_host(const torch::Tensor& t) {
  return t.defined() && t.device().is_cpu();
}

void check_cuda_contiguous(const torch::Tensor& t, const char* what) {
  TORCH_CHECK(t.defined() && t.is_cuda() && t.is_contiguous(), "nccl ", what,
              ": needs a defined, contiguous CUDA tensor");
}

class NcclGroup final : public CollectiveGroup {
 public:
  NcclGroup(const CollectiveConfig& config, const c10::intrusive_ptr<c10d::Store>& store)
      : rank_(config.rank), size_(config.size), timeout_(config.timeout) {
    check_cuda(cudaSetDevice(config.cuda_device), "cudaSetDevice", rank_);
    ncclUniqueId id;
    const std::string key = "rlhf_nccl_unique_id";
    if (rank_ == 0) {
      check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId", rank_);
      std::vector<uint8_t> bytes(sizeof(id));
      std::memcpy(bytes.data(), &id, sizeof(id));
      store->set(key, bytes);
    } else {
      std::vector<uint8_t> bytes = store->get(key);  // waits up to the store's timeout
      if (bytes.size() != sizeof(id)) {
        throw RuntimeError("nccl group: rank " + std::to_string(rank_) + ": bad unique id size " +
                           std::to_string(bytes.size()));
      }
      std::memcpy(&id, bytes.data(), sizeof(id));
    }
    check_nccl(ncclCommInitRank(&comm_, size_, id, rank_), "ncclCommInitRank", rank_);
  }

  ~NcclGroup() override {
    if (comm_ != nullptr) ncclCommDestroy(comm_);  // nothing to do on failure in a destructor
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend_name() const override { return "nccl"; }

  void all_reduce(torch::Tensor& tensor, ReduceOp op) override {
    if (on_host(tensor)) {
      auto staged = tensor.to(torch::kCUDA);
      all_reduce(staged, op);
      tensor.copy_(staged);
      return;
    }
    check_cuda_contiguous(tensor, "all_reduce");
    check_nccl(
        ncclAllReduce(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(), nccl_dtype(tensor),
                      op == ReduceOp::kSum ? ncclSum : ncclMax, comm_, stream()),
        "ncclAllReduce", rank_);
    wait("ncclAllReduce");
  }

  void all_gather(torch::Tensor& output, const torch::Tensor& input) override {
    if (on_host(output) || on_host(input)) {
      auto out = on_host(output) ? output.to(torch::kCUDA) : output;
      all_gather(out, on_host(input) ? input.to(torch::kCUDA) : input);
      if (on_host(output)) output.copy_(out);
      return;
    }
    check_cuda_contiguous(output, "all_gather output");
    check_cuda_contiguous(input, "all_gather input");
    TORCH_CHECK(output.numel() == input.numel() * size_ && output.dtype() == input.dtype(),
                "nccl all_gather: output must hold size x input elements of the same dtype");
    check_nccl(ncclAllGather(input.data_ptr(), output.data_ptr(), input.numel(), nccl_dtype(input),
                             comm_, stream()),
               "ncclAllGather", rank_);
    wait("ncclAllGather");
  }

  void reduce_scatter(torch::Tensor& output, torch::Tensor& input) override {
    if (on_host(output) || on_host(input)) {
      auto out = on_host(output) ? output.to(torch::kCUDA) : output;
      auto in = on_host(input) ? input.to(torch::kCUDA) : input;
      reduce_scatter(out, in);
      if (on_host(output)) output.copy_(out);
      return;
    }
    check_cuda_contiguous(output, "reduce_scatter output");
    check_cuda_contiguous(input, "reduce_scatter input");
    TORCH_CHECK(input.numel() == output.numel() * size_ && output.dtype() == input.dtype(),
                "nccl reduce_scatter: input must hold size x output elements of the same dtype");
    check_nccl(ncclReduceScatter(input.data_ptr(), output.data_ptr(), output.numel(),
                                 nccl_dtype(input), ncclSum, comm_, stream()),
               "ncclReduceScatter", rank_);
    wait("ncclReduceScatter");
  }

  void broadcast(torch::Tensor& tensor, int root) override {
    if (on_host(tensor)) {
      auto staged = tensor.to(torch::kCUDA);
      broadcast(staged, root);
      if (rank_ != root) tensor.copy_(staged);
      return;
    }
    check_cuda_contiguous(tensor, "broadcast");
    check_nccl(ncclBroadcast(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(),
                             nccl_dtype(tensor), root, comm_, stream()),
               "ncclBroadcast", rank_);
    wait("ncclBroadcast");
  }

  // NCCL has no scatter: root sends each rank its piece (point to point, in one group
  // call), every rank receives its own.
  void scatter(torch::Tensor& output, const std::vector<torch::Tensor>& inputs, int root) override {
    TORCH_CHECK(rank_ != root || static_cast<int>(inputs.size()) == size_, "nccl scatter: root ",
                root, " needs ", size_, " inputs, got ", inputs.size());
    if (on_host(output)) {
      auto out = output.to(torch::kCUDA);
      scatter(out, inputs, root);
      output.copy_(out);
      return;
    }
    check_cuda_contiguous(output, "scatter output");
    std::vector<torch::Tensor> device_inputs;
    for (const auto& in : inputs) {
      TORCH_CHECK(in.numel() == output.numel() && in.dtype() == output.dtype(),
                  "nccl scatter: every input must match the output's numel and dtype");
      device_inputs.push_back(on_host(in) ? in.to(torch::kCUDA) : in.contiguous());
    }
    // Nothing may throw between ncclGroupStart and ncclGroupEnd (an open group would swallow
    // this thread's later NCCL calls): the first failure is kept and raised after the end.
    const ncclDataType_t dtype = nccl_dtype(output);
    ncclResult_t failed = ncclSuccess;
    const char* failed_call = "ncclGroupEnd";
    auto keep = [&](ncclResult_t result, const char* call) {
      if (result != ncclSuccess && failed == ncclSuccess) {
        failed = result;
        failed_call = call;
      }
    };
    check_nccl(ncclGroupStart(), "ncclGroupStart", rank_);
    if (rank_ == root) {
      for (int r = 0; r < size_; ++r)
        if (r != root)
          keep(ncclSend(device_inputs[r].data_ptr(), output.numel(), dtype, r, comm_, stream()),
               "ncclSend");
    } else {
      keep(ncclRecv(output.data_ptr(), output.numel(), dtype, root, comm_, stream()), "ncclRecv");
    }
    keep(ncclGroupEnd(), "ncclGroupEnd");
    check_nccl(failed, failed_call, rank_);
    if (rank_ == root) output.copy_(device_inputs[root].view(output.sizes()));
    wait("ncclScatter");
  }

  void barrier() override {
    // NCCL has no barrier: an all-reduce of one float on the device is one.
    auto one = torch::zeros({1}, torch::TensorOptions(torch::kFloat).device(torch::kCUDA));
    all_reduce(one, ReduceOp::kSum);
  }

 private:
  static cudaStream_t stream() { return cudaStreamLegacy; }
  // Polls the stream until the collective is done; on an asynchronous NCCL error (a peer's
  // connection lost) or after the timeout, aborts the communicator (which also ends the
  // kernel still waiting for the peer) and throws. The group is unusable afterwards.
  void wait(const char* what) {
    const auto start = std::chrono::steady_clock::now();
    auto pause = std::chrono::microseconds(2);
    while (true) {
      const cudaError_t state = cudaStreamQuery(stream());
      if (state == cudaSuccess) return;
      if (state != cudaErrorNotReady) check_cuda(state, what, rank_);
      ncclResult_t async = ncclSuccess;
      check_nccl(ncclCommGetAsyncError(comm_, &async), "ncclCommGetAsyncError", rank_);
      const bool late = std::chrono::steady_clock::now() - start > timeout_;
      if (async != ncclSuccess || late) {
        ncclCommAbort(comm_);
        comm_ = nullptr;
        throw RuntimeError(
            "nccl group: rank " + std::to_string(rank_) + "/" + std::to_string(size_) + ": " +
            what + ": " +
            (late ? "not done after " + std::to_string(timeout_.count() / 1000) +
                        " s (a peer is gone or stuck); communicator aborted"
                  : std::string(ncclGetErrorString(async)) + "; communicator aborted"));
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
  }

  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
  ncclComm_t comm_ = nullptr;
};

}  // namespace

std::string nccl_version() {
  return std::to_string(NCCL_MAJOR) + "." + std::to_string(NCCL_MINOR) + "." +
         std::to_string(NCCL_PATCH);
}

std::unique_ptr<CollectiveGroup> make_nccl_group(const CollectiveConfig& config,
                                                 const c10::intrusive_ptr<c10d::Store>& store) {
  return std::make_unique<NcclGroup>(config, store);
}

}  // namespace rlhf::transport
