// CollectiveGroup over c10d::ProcessGroupGloo. CPU tensors go to Gloo as they are; CUDA
// tensors (ranks sharing one GPU, where NCCL refuses, or a CPU peer) are staged through a
// host copy: correct everywhere, and as fast as the PCIe copies allow.
#include "transport/gloo_group.h"

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "core/errors.h"
#include "transport/c10d_work.h"
#include "transport/store.h"

namespace rlhf::transport {
namespace {

void check_cpu_contiguous(const torch::Tensor& t, const char* what) {
  TORCH_CHECK(t.defined() && t.device().is_cpu() && t.is_contiguous(), "gloo ", what,
              ": needs a defined, contiguous CPU tensor, got ",
              t.defined() ? t.toString() : "undefined");
}

bool on_device(const torch::Tensor& t) {
  return t.defined() && !t.device().is_cpu();
}

// A host copy of a device tensor (the same tensor on the CPU).
torch::Tensor staged(const torch::Tensor& t) {
  TORCH_CHECK(t.is_contiguous(), "gloo: needs a contiguous tensor, got ", t.toString());
  return on_device(t) ? t.to(torch::kCPU) : t;
}

std::string message_of(const std::exception& e) {
  if (const auto* error = dynamic_cast<const c10::Error*>(&e))
    return error->what_without_backtrace();
  return e.what();
}

}  // namespace

GlooGroup::GlooGroup(const CollectiveConfig& config) : rank_(config.rank), size_(config.size) {
  auto store = open_store(config);
  try {
    auto options = c10d::ProcessGroupGloo::Options::create(config.timeout);
    // Peers on other nodes reach this rank at its node's address (set by the scheduler).
    options->devices.push_back(
        c10d::ProcessGroupGloo::createDeviceForHostname(collective_host(config.host)));
    options->threads = 1;  // one collective at a time: the trainer issues them in order
    group_ = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank_, size_, options);
  } catch (const std::exception& e) {
    throw CollectiveFailure("gloo group: rank " + std::to_string(rank_) + "/" +
                            std::to_string(size_) + ": rendezvous failed: " + message_of(e));
  }
}

GlooGroup::~GlooGroup() = default;

template <typename StartWork>
void GlooGroup::run(const char* operation, StartWork&& start) {
  try {
    wait_if_any(start());
  } catch (const std::exception& e) {
    throw CollectiveFailure(std::string("gloo ") + operation + ": rank " + std::to_string(rank_) +
                            "/" + std::to_string(size_) + ": " + message_of(e));
  }
}

void GlooGroup::do_all_reduce(torch::Tensor& tensor, ReduceOp op) {
  if (on_device(tensor)) {
    auto host = staged(tensor);
    do_all_reduce(host, op);
    tensor.copy_(host);
    return;
  }
  check_cpu_contiguous(tensor, "all_reduce");
  if (tensor.scalar_type() == torch::kBFloat16) {
    // Gloo can sum BF16 (torch >= 2.1), but each hop would round to 8 mantissa bits; the
    // sum goes through FP32 and is rounded once, as the gradients it serves deserve.
    auto wide = tensor.to(torch::kFloat);
    do_all_reduce(wide, op);
    tensor.copy_(wide);
    return;
  }
  std::vector<torch::Tensor> tensors{tensor};
  c10d::AllreduceOptions options;
  options.reduceOp = op == ReduceOp::kSum ? c10d::ReduceOp::SUM : c10d::ReduceOp::MAX;
  options.timeout = group_->getOptions()->timeout;
  run("all_reduce", [&] { return group_->allreduce(tensors, options); });
}

void GlooGroup::do_all_gather(torch::Tensor& output, const torch::Tensor& input) {
  if (on_device(output) || on_device(input)) {
    auto host = on_device(output) ? torch::empty_like(output, output.options().device(torch::kCPU))
                                  : output;
    do_all_gather(host, staged(input));
    if (on_device(output)) output.copy_(host);
    return;
  }
  check_cpu_contiguous(output, "all_gather output");
  check_cpu_contiguous(input, "all_gather input");
  TORCH_CHECK(output.numel() == input.numel() * size_ && output.dtype() == input.dtype(),
              "gloo all_gather: output must hold size x input elements of the same dtype, got ",
              output.sizes(), " and ", output.sizes());
  const int64_t n = input.numel();
  auto flat = output.view({-1});
  if (size_ == 1) {
    flat.copy_(input.view({-1}));
    return;
  }
  // c10d Gloo's allgather (_allgather_base) is slower than its ring all-reduce of the
  // whole output: 79 vs 64 ms for 64 MiB over 2 ranks with LibTorch 2.11
  // (bench/gloo_collectives.py; 1.13 was worse still). So: zero the output, place this rank's
  // piece, and sum-reduce the raw bytes as int32 words (exact: every word is non-zero on at most
  // one rank).
  flat.zero_();
  flat.narrow(0, rank_ * n, n).copy_(input.view({-1}));
  const int64_t bytes = output.numel() * static_cast<int64_t>(output.element_size());
  auto words = bytes % 4 == 0 ? flat.view(torch::kByte).view(torch::kInt) : flat.view(torch::kByte);
  do_all_reduce(words, ReduceOp::kSum);
}

void GlooGroup::do_reduce_scatter(torch::Tensor& output, torch::Tensor& input) {
  if (on_device(output) || on_device(input)) {
    auto host_in = staged(input);
    auto host_out = on_device(output)
                        ? torch::empty_like(output, output.options().device(torch::kCPU))
                        : output;
    do_reduce_scatter(host_out, host_in);
    if (on_device(output)) output.copy_(host_out);
    return;
  }
  check_cpu_contiguous(output, "reduce_scatter output");
  check_cpu_contiguous(input, "reduce_scatter input");
  TORCH_CHECK(input.numel() == output.numel() * size_ && output.dtype() == input.dtype(),
              "gloo reduce_scatter: input must hold size x output elements of the same dtype, got ",
              input.sizes(), " and ", output.sizes());
  if (size_ > 1) do_all_reduce(input, ReduceOp::kSum);
  output.view({-1}).copy_(input.view({-1}).narrow(0, rank_ * output.numel(), output.numel()));
}

void GlooGroup::do_broadcast(torch::Tensor& tensor, int root) {
  if (on_device(tensor)) {
    auto host = staged(tensor);
    do_broadcast(host, root);
    if (rank_ != root) tensor.copy_(host);
    return;
  }
  check_cpu_contiguous(tensor, "broadcast");
  std::vector<torch::Tensor> tensors{tensor};
  c10d::BroadcastOptions options;
  options.rootRank = root;
  run("broadcast", [&] { return group_->broadcast(tensors, options); });
}

void GlooGroup::do_all_to_all(torch::Tensor& output, const torch::Tensor& input,
                              const std::vector<int64_t>& output_splits,
                              const std::vector<int64_t>& input_splits) {
  if (on_device(output) || on_device(input)) {
    auto host = on_device(output) ? torch::empty_like(output, output.options().device(torch::kCPU))
                                  : output;
    do_all_to_all(host, staged(input), output_splits, input_splits);
    if (on_device(output)) output.copy_(host);
    return;
  }
  check_cpu_contiguous(output, "all_to_all output");
  const torch::Tensor in = input.contiguous();
  const int64_t row = in.size(0) > 0 ? in.nbytes() / in.size(0)
                                     : (output.size(0) > 0 ? output.nbytes() / output.size(0) : 0);
  std::vector<int64_t> out_bytes, in_bytes;
  for (int64_t s : output_splits) out_bytes.push_back(s * row);
  for (int64_t s : input_splits) in_bytes.push_back(s * row);
  auto out_flat = output.view({-1}).view(torch::kByte);
  auto in_flat = in.view({-1}).view(torch::kByte);
  if (size_ == 1) {
    out_flat.copy_(in_flat);
    return;
  }
  c10d::AllToAllOptions options;
  options.timeout = group_->getOptions()->timeout;
  run("all_to_all",
      [&] { return group_->alltoall_base(out_flat, in_flat, out_bytes, in_bytes, options); });
}

void GlooGroup::do_scatter(torch::Tensor& output, const std::vector<torch::Tensor>& inputs,
                           int root) {
  TORCH_CHECK(rank_ != root || static_cast<int>(inputs.size()) == size_, "gloo scatter: root ",
              root, " needs ", size_, " inputs, got ", inputs.size());
  for (const auto& in : inputs)
    TORCH_CHECK(in.numel() == output.numel() && in.dtype() == output.dtype(),
                "gloo scatter: every input must match the output's numel and dtype, got ",
                in.sizes(), " for ", output.sizes());
  if (on_device(output)) {
    auto host = torch::empty_like(output, output.options().device(torch::kCPU));
    std::vector<torch::Tensor> staged_inputs;
    for (const auto& in : inputs) staged_inputs.push_back(staged(in));
    do_scatter(host, staged_inputs, root);
    output.copy_(host);
    return;
  }
  check_cpu_contiguous(output, "scatter output");
  std::vector<torch::Tensor> host_inputs;
  for (const auto& in : inputs) host_inputs.push_back(on_device(in) ? staged(in) : in.contiguous());
  if (size_ == 1) {
    output.copy_(host_inputs.at(0).view(output.sizes()));
    return;
  }
  std::vector<torch::Tensor> outputs{output};
  std::vector<std::vector<torch::Tensor>> input_lists;
  if (rank_ == root) {
    input_lists.emplace_back();
    for (auto& in : host_inputs) input_lists.back().push_back(in.view(output.sizes()));
  }
  c10d::ScatterOptions options;
  options.rootRank = root;
  options.timeout = group_->getOptions()->timeout;
  run("scatter", [&] { return group_->scatter(outputs, input_lists, options); });
}

void GlooGroup::do_barrier() {
  run("barrier", [&] { return group_->barrier(); });
}

}  // namespace rlhf::transport
