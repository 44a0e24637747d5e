// Log-probabilities of given tokens through an LM head, computed in chunks along the
// sequence so the [B, T, V] FP32 logits never exist at once, in forward or in backward
// (the backward recomputes each chunk's logits). Gradients are exact, not approximated.
#pragma once

#include <torch/types.h>

#include <cstdint>

namespace rlhf::models {

// log p(labels[b, t] | hidden[b, t]) = logits[labels] - logsumexp(logits), with
// logits = hidden @ weight^T computed in hidden's dtype and the softmax in FP32.
// hidden: [B, T, H]; weight: [V, H] (same dtype); labels: [B, T] int64 in [0, V).
// Returns [B, T] FP32. Extra memory: about 3 x B x chunk x V x 4 bytes in forward and
// backward, plus (backward, when T > chunk) a [V, H] FP32 accumulator for weight's gradient.
torch::Tensor chunked_log_probs(const torch::Tensor& hidden, const torch::Tensor& weight,
                                const torch::Tensor& labels, int64_t chunk = 256);

}  // namespace rlhf::models
