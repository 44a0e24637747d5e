// Host launchers of the FlashInfer kernels we instantiate ahead of time (norm.cu,
// activation.cu, sampling.cu), on raw device pointers: no torch here, so the .cu files compile
// with nvcc alone (a torch include costs more than the kernels). kernels.h is the torch-level
// API over these; nothing else calls them. Each returns the cudaError_t it got, as an int
// (0: cudaSuccess), and launches on `stream` (a cudaStream_t).
#pragma once

#include <cstdint>

namespace rlhf::kernels::detail {

enum class DType { kF16, kBF16, kF32 };

// FlashInfer's norm::RMSNorm: out[i] = in[i] / sqrt(mean(in[i]^2) + eps) * weight, per row
// of `rows` rows of `d` elements (row strides in elements).
int rms_norm(DType t, void* in, void* weight, void* out, uint32_t rows, uint32_t d,
             uint32_t stride_in, uint32_t stride_out, float eps, void* stream);
// FlashInfer's norm::FusedAddRMSNorm, in place: residual += in; in = rmsnorm(residual) * weight.
int fused_add_rms_norm(DType t, void* in, void* residual, void* weight, uint32_t rows, uint32_t d,
                       uint32_t stride_in, uint32_t stride_residual, float eps, void* stream);
// FlashInfer's activation::act_and_mul_kernel with SiLU: in is [rows, 2d] (gate then up, as
// the fused gate/up GEMM writes it), out [rows, d] = silu(gate) * up.
int silu_and_mul(DType t, void* in, void* out, uint32_t rows, uint32_t d, void* stream);
// FlashInfer's sampling::TopKTopPSamplingFromProb (sort-free rejection sampling): one token
// per row of probs [rows, vocab] FP32 within the top-k and the top-p nucleus. top_k <= 0 or
// >= vocab and top_p >= 1 switch that filter off. The Philox stream is (seed, offset) read
// from the device ([2] uint64 at seed_offset) so a CUDA graph replays with new draws.
// out: [rows] int32; valid: [rows] bool (false when the row's rejection loop ran out).
int top_k_top_p_sample(float* probs, int32_t* out, bool* valid, uint32_t rows, uint32_t vocab,
                       int32_t top_k, float top_p, uint64_t* seed_offset, void* stream);

// FlashInfer's BatchDecodeWithPagedKVCache (CUDA cores, no split-KV: one launch, nothing
// planned on the host, so it runs inside a CUDA graph as it is) reading the keys and values in
// place from a paged pool in the NHD layout [pages, page_size, kv_heads, head_dim] (strides in
// elements). Rows' pages: indices[indptr[b] .. indptr[b + 1]) with last_page_len[b] positions
// used in the last (int32). request_indices [B] = 0..B-1, kv_tile_indices [B] = 0, o_indptr
// [B + 1] = 0..B and kv_chunk_size [1] >= every row's length are the fixed "no split" plan.
struct PagedDecodeArgs {
  DType dtype = DType::kBF16;
  uint32_t head_dim = 0;  // 64, 128 or 256
  uint32_t batch = 0, heads = 0, kv_heads = 0, page_size = 0;
  void* q = nullptr;  // [batch, heads, head_dim], row stride q_stride_n, head stride q_stride_h
  int64_t q_stride_n = 0, q_stride_h = 0;
  void* k = nullptr;  // the pool's keys and values, one layer
  void* v = nullptr;
  int64_t kv_strides[3] = {0, 0, 0};  // page, position, head
  int32_t* indices = nullptr;
  int32_t* indptr = nullptr;
  int32_t* last_page_len = nullptr;
  int32_t* request_indices = nullptr;
  int32_t* kv_tile_indices = nullptr;
  int32_t* o_indptr = nullptr;
  int32_t* kv_chunk_size = nullptr;
  void* o = nullptr;  // [batch, heads, head_dim] contiguous
  float sm_scale = 1;
  void* stream = nullptr;
};
// kNotCompiled also when the head_dim or the group size (heads / kv_heads) has no instance:
// paged_decode_supported says which do.
int paged_decode(const PagedDecodeArgs& args);
bool paged_decode_supported(uint32_t head_dim, uint32_t heads, uint32_t kv_heads);

}  // namespace rlhf::kernels::detail

namespace rlhf::kernels::detail {

// What was compiled in: launchers.cpp when the kernels were built (FlashInfer's version and
// the CUDA architectures), launchers_stub.cpp otherwise (false, "", "": every launcher then
// returns kNotCompiled).
bool compiled_in();
const char* flashinfer_version();
const char* cuda_architectures();
constexpr int kNotCompiled = -1;

}  // namespace rlhf::kernels::detail
