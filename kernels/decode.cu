// FlashInfer's paged decode attention (launchers.h: PagedDecodeArgs), instantiated for FP16
// and BF16, head dims 64, 128 and 256, no positional encoding inside the kernel (RoPE is
// applied before the keys are written), no sliding window, no soft cap. FlashInfer dispatches
// the GQA group size (heads / kv_heads) itself over 1, 2, 3, 4, 6, 8 and 16 and throws for
// others: paged_decode_supported() keeps those away.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <flashinfer/attention/decode.cuh>
#include <flashinfer/attention/default_decode_params.cuh>
#include <flashinfer/attention/variants.cuh>

#include "kernels/launchers.h"

namespace rlhf::kernels::detail {
namespace {

template <typename T, uint32_t kHeadDim>
int decode_as(const PagedDecodeArgs& a) {
  using Params = flashinfer::BatchDecodeParams<T, T, T, int32_t>;
  using Variant = flashinfer::DefaultAttention</*custom_mask=*/false, /*sliding_window=*/false,
                                               /*soft_cap=*/false, /*alibi=*/false>;
  const int64_t strides[3] = {a.kv_strides[0], a.kv_strides[1], a.kv_strides[2]};
  flashinfer::paged_kv_t<T, int32_t> kv(
      a.kv_heads, a.page_size, kHeadDim, a.batch, flashinfer::QKVLayout::kNHD, static_cast<T*>(a.k),
      static_cast<T*>(a.v), strides, a.indices, a.indptr, a.last_page_len);
  Params p(static_cast<T*>(a.q), /*q_rope_offset=*/nullptr, kv, static_cast<T*>(a.o),
           /*lse=*/nullptr, /*alibi=*/nullptr, a.heads, static_cast<int32_t>(a.q_stride_n),
           static_cast<int32_t>(a.q_stride_h), /*window_left=*/-1, /*soft_cap=*/0.0f, a.sm_scale,
           /*rope_scale=*/1.0f, /*rope_theta=*/1e4f);
  p.request_indices = a.request_indices;
  p.kv_tile_indices = a.kv_tile_indices;
  p.o_indptr = a.o_indptr;
  p.kv_chunk_size_ptr = a.kv_chunk_size;
  p.block_valid_mask = nullptr;
  p.partition_kv = false;
  p.padded_batch_size = a.batch;
  return static_cast<int>(flashinfer::BatchDecodeWithPagedKVCacheDispatched<
                          kHeadDim, flashinfer::PosEncodingMode::kNone, Variant>(
      p, /*tmp_v=*/nullptr, /*tmp_s=*/nullptr, /*enable_pdl=*/false,
      static_cast<cudaStream_t>(a.stream)));
}

template <typename T>
int decode_dim(const PagedDecodeArgs& a) {
  switch (a.head_dim) {
    case 64:
      return decode_as<T, 64>(a);
    case 128:
      return decode_as<T, 128>(a);
    case 256:
      return decode_as<T, 256>(a);
  }
  return kNotCompiled;
}

}  // namespace

bool paged_decode_supported(uint32_t head_dim, uint32_t heads, uint32_t kv_heads) {
  if (head_dim != 64 && head_dim != 128 && head_dim != 256) return false;
  if (kv_heads == 0 || heads % kv_heads != 0) return false;
  switch (heads / kv_heads) {
    case 1:
    case 2:
    case 3:
    case 4:
    case 6:
    case 8:
    case 16:
      return true;
  }
  return false;
}

int paged_decode(const PagedDecodeArgs& a) {
  if (!paged_decode_supported(a.head_dim, a.heads, a.kv_heads)) return kNotCompiled;
  if (a.batch == 0) return 0;
  switch (a.dtype) {
    case DType::kF16:
      return decode_dim<half>(a);
    case DType::kBF16:
      return decode_dim<__nv_bfloat16>(a);
    case DType::kF32:
      return kNotCompiled;  // FlashInfer's decode takes 16-bit inputs
  }
  return kNotCompiled;
}

}  // namespace rlhf::kernels::detail
