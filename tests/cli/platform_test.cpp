// The platform the binary was built on: LibTorch 2.11 with CUDA, and a binary that starts
// on a machine without an NVIDIA driver (the driver stub libcuda.so is not a dependency).
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <memory>
#include <string>

#include "test_paths.h"
#include "tests/support/run_cli.h"

namespace rlhf::test {
namespace {

// stdout of a shell command, or a failed test.
std::string shell_output(const std::string& command) {
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command.c_str(), "r"), pclose);
  if (!pipe) {
    ADD_FAILURE() << "cannot run: " << command;
    return "";
  }
  std::string out;
  std::array<char, 4096> buffer;
  while (size_t n = fread(buffer.data(), 1, buffer.size(), pipe.get()))
    out.append(buffer.data(), n);
  return out;
}

TEST(Platform, VersionNamesTorch211WithCuda) {
  const auto r = run_cli({"version"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("torch 2.11."), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("cuda: compiled for 13."), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("gpus: "), std::string::npos) << r.out;
}

TEST(Platform, BinaryLinksTorchCudaButNotTheDriver) {
  const std::string needed =
      shell_output(std::string("readelf -d '") + RLHF_CLI_PATH + "' | grep NEEDED");
  ASSERT_FALSE(needed.empty()) << "readelf printed no NEEDED entries for " << RLHF_CLI_PATH;
  // torch_cuda registers the CUDA kernels from static initialisers: it must be loaded.
  EXPECT_NE(needed.find("libtorch_cuda.so"), std::string::npos) << needed;
  // libcuda.so.1 comes with the NVIDIA driver: depending on it would stop the binary from
  // starting on CPU-only machines (LibTorch loads it lazily when a GPU is used).
  EXPECT_EQ(needed.find("libcuda.so"), std::string::npos) << needed;
}

}  // namespace
}  // namespace rlhf::test
