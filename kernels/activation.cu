// SiLU-and-mul over a fused gate/up output with FlashInfer's act_and_mul_kernel (launchers.h).
// FlashInfer ships the kernel, not a launcher: the launch below follows its requirements
// (vec_size divides d, 256 threads per block, one block per row).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <flashinfer/activation.cuh>

#include "kernels/launchers.h"

namespace rlhf::kernels::detail {
namespace {

// SiLU(x) = x * sigmoid(x) = x / (1 + e^-x), in FP32.
__device__ __forceinline__ float silu(const float& x) {
  return x / (1.0f + __expf(-x));
}

template <typename T, uint32_t kVec>
int launch(void* in, void* out, uint32_t rows, uint32_t d, cudaStream_t stream) {
  const uint32_t threads = std::min<uint32_t>(256, (d / kVec + 31) / 32 * 32);
  flashinfer::activation::act_and_mul_kernel<T, silu, kVec><<<rows, threads, 0, stream>>>(
      static_cast<T*>(out), static_cast<const T*>(in), static_cast<int>(d));
  return static_cast<int>(cudaGetLastError());
}

// The widest power-of-two vector (<= 16 bytes) that divides d, as FlashInfer's own launcher.
template <typename T>
int silu_and_mul_as(void* in, void* out, uint32_t rows, uint32_t d, cudaStream_t stream) {
  constexpr uint32_t kMax = 16 / sizeof(T);
  if (d % kMax == 0) return launch<T, kMax>(in, out, rows, d, stream);
  if constexpr (kMax >= 4) {
    if (d % 4 == 0) return launch<T, 4>(in, out, rows, d, stream);
  }
  if (d % 2 == 0) return launch<T, 2>(in, out, rows, d, stream);
  return launch<T, 1>(in, out, rows, d, stream);
}

}  // namespace

int silu_and_mul(DType t, void* in, void* out, uint32_t rows, uint32_t d, void* stream) {
  if (rows == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  switch (t) {
    case DType::kF16:
      return silu_and_mul_as<half>(in, out, rows, d, s);
    case DType::kBF16:
      return silu_and_mul_as<__nv_bfloat16>(in, out, rows, d, s);
    case DType::kF32:
      return silu_and_mul_as<float>(in, out, rows, d, s);
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

}  // namespace rlhf::kernels::detail
