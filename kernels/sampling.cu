// FlashInfer's sort-free top-k/top-p sampling from probabilities (launchers.h), FP32 probs,
// int32 token ids. The Philox seed and offset are read from the device so a captured decode
// step replays with fresh draws (the caller advances the offset on the device).
#include <flashinfer/sampling.cuh>

#include "kernels/launchers.h"

namespace rlhf::kernels::detail {

int top_k_top_p_sample(float* probs, int32_t* out, bool* valid, uint32_t rows, uint32_t vocab,
                       int32_t top_k, float top_p, uint64_t* seed_offset, void* stream) {
  if (rows == 0) return 0;
  const int32_t k =
      top_k <= 0 || static_cast<uint32_t>(top_k) >= vocab ? static_cast<int32_t>(vocab) : top_k;
  const float p = top_p >= 1.0f ? 1.0f : top_p;
  return static_cast<int>(flashinfer::sampling::TopKTopPSamplingFromProb<float, int32_t>(
      probs, /*top_k_arr=*/nullptr, /*top_p_arr=*/nullptr, out, valid, /*indices=*/nullptr, rows, k,
      p, vocab, /*deterministic=*/true, /*seed_arr=*/seed_offset, /*seed_val=*/0,
      /*offset_arr=*/seed_offset + 1, /*offset_val=*/0, static_cast<cudaStream_t>(stream)));
}

}  // namespace rlhf::kernels::detail
