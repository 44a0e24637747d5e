// The launchers when the kernels are not compiled in (no CUDA toolkit or no FlashInfer
// headers at configure time): every call reports kNotCompiled, which kernels.cpp turns into
// a message saying how to build them.
#include "kernels/launchers.h"

namespace rlhf::kernels::detail {

bool compiled_in() {
  return false;
}
const char* flashinfer_version() {
  return "";
}
const char* cuda_architectures() {
  return "";
}

int rms_norm(DType, void*, void*, void*, uint32_t, uint32_t, uint32_t, uint32_t, float, void*) {
  return kNotCompiled;
}
int fused_add_rms_norm(DType, void*, void*, void*, uint32_t, uint32_t, uint32_t, uint32_t, float,
                       void*) {
  return kNotCompiled;
}
int silu_and_mul(DType, void*, void*, uint32_t, uint32_t, void*) {
  return kNotCompiled;
}
int top_k_top_p_sample(float*, int32_t*, bool*, uint32_t, uint32_t, int32_t, float, uint64_t*,
                       void*) {
  return kNotCompiled;
}

int paged_decode(const PagedDecodeArgs&) {
  return kNotCompiled;
}
bool paged_decode_supported(uint32_t, uint32_t, uint32_t) {
  return false;
}

}  // namespace rlhf::kernels::detail
