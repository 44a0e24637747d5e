// What the compiled kernels are: FlashInfer's version and the CUDA architectures, from the
// build (kernels/CMakeLists.txt writes them into kernels_build.h).
#include "kernels/launchers.h"
#include "kernels_build.h"

namespace rlhf::kernels::detail {

bool compiled_in() {
  return true;
}
const char* flashinfer_version() {
  return RLHF_FLASHINFER_VERSION;
}
const char* cuda_architectures() {
  return RLHF_CUDA_ARCHITECTURES;
}

}  // namespace rlhf::kernels::detail
