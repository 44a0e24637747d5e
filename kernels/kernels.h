// GPU kernels for the rollout and the model's forward, from FlashInfer (Apache-2.0) compiled
// ahead of time into the build for the architectures in TORCH_CUDA_ARCH_LIST (scripts/
// get-flashinfer unpacks its headers from the pinned wheel; nothing is JIT-compiled or
// downloaded at run time). Plain calls on CUDA tensors, on torch's current stream; the CPU
// path never needs them, and the torch implementations stay the reference in tests.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>

namespace rlhf::kernels {

// True when the kernels were compiled into this binary (a CUDA toolkit and FlashInfer's headers
// at configure time). They also need a CUDA device to run.
bool available();
// "0.7.2.post1", or "" when not compiled in.
std::string flashinfer_version();
// "8.0;9.0": the architectures the kernels were built for, or "".
std::string cuda_architectures();

// Whether a model's forward on this thread may use these kernels in place of torch's
// operators (RMSNorm, SiLU-and-mul): off unless an EnableInScope is alive. The rollout's
// generate turns it on; trainers and scorers keep torch's operators, so log-probs computed
// without gradients equal those computed with them.
bool enabled_here();
class EnableInScope {
 public:
  explicit EnableInScope(bool on = true);
  ~EnableInScope();
  EnableInScope(const EnableInScope&) = delete;
  EnableInScope& operator=(const EnableInScope&) = delete;

 private:
  bool previous_;
};

// x [.., d] (contiguous rows; FP16, BF16 or FP32, CUDA), weight [d] of x's dtype:
// x / sqrt(mean(x^2) + eps) * weight, as a new tensor (FlashInfer's RMSNorm; it computes in
// FP32 and rounds once).
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps);
// In place, as the decoder layer's "residual add, then norm": residual += x; x =
// rms_norm(residual, weight, eps) (FlashInfer's FusedAddRMSNorm: one read of each).
void fused_add_rms_norm(torch::Tensor& x, torch::Tensor& residual, const torch::Tensor& weight,
                        double eps);
// gate_up [.., 2d] (the fused gate/up projection: gate first): silu(gate) * up, [.., d].
torch::Tensor silu_and_mul(const torch::Tensor& gate_up);
// One token per row of probs [B, V] (FP32, CUDA, rows summing to 1) within the top-k
// (k <= 0: all) and the top-p nucleus (p = 1: all), by FlashInfer's sort-free rejection
// sampling with the Philox stream at seed_offset ([2] int64 on the device: seed, offset, read
// as uint64; the caller advances the offset between steps). Returns int64 [B].
torch::Tensor top_k_top_p_sample(const torch::Tensor& probs, int64_t top_k, double top_p,
                                 const torch::Tensor& seed_offset);

// The fixed "no split" plan of a paged decode step (FlashInfer's page table in CSR form, int32
// on the device), built from the cache's block tables [B, M] (int64 page ids; entries past a
// row's pages are ignored) and positions [B] (int64: the new token's position; the row attends
// to keys 0..position): torch operators of fixed shapes, no host sync, so it is built inside a
// captured CUDA graph and replays for any step of the same shape.
struct PagedDecodePlan {
  torch::Tensor indptr;           // [B + 1]: row b's pages are indices[indptr[b], indptr[b + 1])
  torch::Tensor indices;          // [B * M + 1]: page ids, packed (the last entry is a dump)
  torch::Tensor last_page_len;    // [B]: positions used in each row's last page
  torch::Tensor request_indices;  // [B] 0..B-1, kv_tile_indices [B] 0, o_indptr [B + 1] 0..B,
  torch::Tensor kv_tile_indices;  // kv_chunk_size [1] = M * page_size: one tile per row
  torch::Tensor o_indptr;
  torch::Tensor kv_chunk_size;
};
PagedDecodePlan plan_paged_decode(const torch::Tensor& block_tables, const torch::Tensor& positions,
                                  int64_t page_size);
// Whether paged_decode_attention has an instance for these shapes: compiled in, FP16/BF16,
// head_dim 64, 128 or 256, and heads / kv_heads in {1, 2, 3, 4, 6, 8, 16} (FlashInfer's GQA
// dispatch; Qwen2-0.5B's 7 is not among them: its decode keeps the gather + SDPA path).
bool paged_decode_supported(torch::Dtype dtype, int64_t head_dim, int64_t heads, int64_t kv_heads);
// One decode step's attention, reading keys and values in place from one layer's pool
// ([pages, page_size, kv_heads, head_dim] each, as models::PagedKvCache holds them, the new
// token's key and value already written): q [B, heads, head_dim] -> [B, heads, head_dim],
// softmax(q k^T * sm_scale) v over each row's positions 0..position.
torch::Tensor paged_decode_attention(const torch::Tensor& q, const torch::Tensor& k_pool,
                                     const torch::Tensor& v_pool, const PagedDecodePlan& plan,
                                     double sm_scale);

}  // namespace rlhf::kernels
