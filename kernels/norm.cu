// FlashInfer's RMSNorm and fused residual-add + RMSNorm, instantiated for FP16, BF16 and FP32
// (launchers.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <flashinfer/norm.cuh>

#include "kernels/launchers.h"

namespace rlhf::kernels::detail {
namespace {

template <typename T>
int rms_norm_as(void* in, void* weight, void* out, uint32_t rows, uint32_t d, uint32_t stride_in,
                uint32_t stride_out, float eps, void* stream) {
  return static_cast<int>(flashinfer::norm::RMSNorm<T>(
      static_cast<T*>(in), static_cast<T*>(weight), static_cast<T*>(out), rows, d, stride_in,
      stride_out, eps, /*enable_pdl=*/false, static_cast<cudaStream_t>(stream)));
}

template <typename T>
int fused_add_as(void* in, void* residual, void* weight, uint32_t rows, uint32_t d,
                 uint32_t stride_in, uint32_t stride_residual, float eps, void* stream) {
  return static_cast<int>(flashinfer::norm::FusedAddRMSNorm<T>(
      static_cast<T*>(in), static_cast<T*>(residual), static_cast<T*>(weight), rows, d, stride_in,
      stride_residual, eps, /*enable_pdl=*/false, static_cast<cudaStream_t>(stream)));
}

}  // namespace

int rms_norm(DType t, void* in, void* weight, void* out, uint32_t rows, uint32_t d,
             uint32_t stride_in, uint32_t stride_out, float eps, void* stream) {
  switch (t) {
    case DType::kF16:
      return rms_norm_as<half>(in, weight, out, rows, d, stride_in, stride_out, eps, stream);
    case DType::kBF16:
      return rms_norm_as<__nv_bfloat16>(in, weight, out, rows, d, stride_in, stride_out, eps,
                                        stream);
    case DType::kF32:
      return rms_norm_as<float>(in, weight, out, rows, d, stride_in, stride_out, eps, stream);
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

int fused_add_rms_norm(DType t, void* in, void* residual, void* weight, uint32_t rows, uint32_t d,
                       uint32_t stride_in, uint32_t stride_residual, float eps, void* stream) {
  switch (t) {
    case DType::kF16:
      return fused_add_as<half>(in, residual, weight, rows, d, stride_in, stride_residual, eps,
                                stream);
    case DType::kBF16:
      return fused_add_as<__nv_bfloat16>(in, residual, weight, rows, d, stride_in, stride_residual,
                                         eps, stream);
    case DType::kF32:
      return fused_add_as<float>(in, residual, weight, rows, d, stride_in, stride_residual, eps,
                                 stream);
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

}  // namespace rlhf::kernels::detail
