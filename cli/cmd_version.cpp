// `rlhf version`: what this binary was built against and what it finds at run time
// (LibTorch, CUDA, cuDNN, NCCL, GPUs). The first thing to paste into a bug report.
#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <torch/version.h>

#include <iostream>

#include "cli/args.h"
#include "cli/commands.h"
#include "kernels/kernels.h"
#include "rlhf_version.h"
#include "transport/nccl_group.h"

namespace rlhf::cli {
namespace {

// 13000 -> "13.0"; 91900 -> "9.19.0" (CUDA's and cuDNN's encodings).
std::string cuda_version(long v) {
  return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
}
std::string cudnn_version(long v) {
  return std::to_string(v / 10000) + "." + std::to_string(v % 10000 / 100) + "." +
         std::to_string(v % 100);
}

}  // namespace

int cmd_version(const Argv& argv) {
  const std::vector<OptionSpec> options = {{"--help", false, "show this help"}};
  Args args(argv, options);
  if (args.flag("--help")) {
    std::cout << "usage: rlhf version\n\nThe versions this binary was built against and the "
                 "devices it sees.\n\n"
              << format_options(options);
    return 0;
  }
  const auto& cuda = at::detail::getCUDAHooks();
  std::cout << "rlhf " << RLHF_VERSION << '\n' << "torch " << TORCH_VERSION << " (LibTorch)\n";
  if (!cuda.hasCUDART()) {
    std::cout << "cuda: not compiled in\n";
    return 0;
  }
  std::cout << "cuda: compiled for " << cuda_version(cuda.versionCUDART()) << ", cuDNN "
            << cudnn_version(cuda.versionCuDNN()) << '\n';
  const std::string nccl = transport::nccl_version();
  std::cout << "nccl: " << (nccl.empty() ? "not compiled in" : nccl + " (collective backend)")
            << '\n';
  std::cout << "flashinfer: "
            << (kernels::available()
                    ? kernels::flashinfer_version() + " (kernels compiled for sm " +
                          kernels::cuda_architectures() + ")"
                    : std::string("not compiled in (GPU kernels: torch's operators)"))
            << '\n';
  const int gpus = at::hasCUDA() ? cuda.getNumGPUs() : 0;
  std::cout << "gpus: " << gpus
            << (gpus == 0 ? " (no CUDA driver or device: cuda nodes cannot run here)" : "") << '\n';
  return 0;
}

}  // namespace rlhf::cli
