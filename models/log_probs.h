// Log-probabilities (and entropy) of given tokens through an LM head without the
// [tokens, V] logits: the head's matmul, an FP32 log-softmax and the gather run
// `chunk_tokens` tokens at a time (over the flattened batch, so the bound holds for any
// rows x length) in forward and again in backward, a custom autograd function that
// recomputes each chunk's logits. Exact, not approximated. Sampling's logits (a few
// positions) are CausalLM::logits(); this file does not sample.
#pragma once

#include <torch/types.h>

#include <cstdint>

namespace rlhf::models {

// train.logits_chunk_tokens' default (core/spec_schema.cpp): tokens per chunk of the head.
inline constexpr int64_t kDefaultLogitsChunkTokens = 1024;
// Positions per chunk of the path before issue 28 (chunk_tokens = 0), over all rows at once.
inline constexpr int64_t kLegacyLogProbChunk = 256;

enum class Entropy {
  kSkip,     // log-probs only
  kCompute,  // also the entropy of each position's distribution (same pass over the logits)
};

struct HeadLogProbs {
  torch::Tensor log_probs;  // [B, T] (or [B, T, K]) FP32 log p(labels[b, t] | hidden[b, t])
  torch::Tensor entropy;    // [B, T] FP32 -sum_v p_v log p_v; undefined with Entropy::kSkip
};

// logits = hidden @ weight^T in hidden's dtype (BF16 or FP32); the log-sum-exp, softmax and
// entropy in FP32. hidden: [B, T, H] (any strides: a narrowed view is not copied); weight:
// [V, H] in hidden's dtype (the LM head, or the embedding matrix when tied: its gradient
// flows to whichever parameter it is); labels: [B, T] int64 in [0, V).
//
// chunk_tokens > 0: at most chunk_tokens x V logits exist at once. Extra memory, forward and
// backward alike: one FP32 [chunk, V] buffer, plus (BF16) the [chunk, V] matmul output while
// it is converted, plus (backward, several chunks) an FP32 [V, H] accumulator of weight's
// gradient; differentiating the entropy adds a second FP32 [chunk, V] buffer.
// chunk_tokens == 0: the path before issue 28 (train.logits_chunk_tokens = 0): log-probs
// by chunked_log_probs in chunks of kLegacyLogProbChunk positions over all B rows, entropy
// 16 positions at a time without a graph.
// labels may be [B, T, K]: K tokens' log-probs at each position, [B, T, K] (the entropy stays
// [B, T]); the gradient of all K flows through the same recomputed logits (GKD's student
// log-probs at the teacher's top-K tokens). With chunk_tokens == 0 such labels take the
// token-chunked path in chunks of kLegacyLogProbChunk tokens.
// Throws c10::Error on mismatched shapes or dtypes, labels outside [0, V), chunk_tokens < 0.
HeadLogProbs head_log_probs(const torch::Tensor& hidden, const torch::Tensor& weight,
                            const torch::Tensor& labels, int64_t chunk_tokens,
                            Entropy entropy = Entropy::kSkip);

// The K most likely next tokens of each position and their log-probs (FP32, of the whole
// vocabulary's softmax), without a graph, `chunk_tokens` tokens at a time (0: the default
// chunk): what a teacher sends for GKD (ppo/kl.h gkd_divergence). k is capped at V; k = V
// is the whole distribution, sorted. hidden [B, T, H], weight [V, H] -> [B, T, k] each, and
// the log of the mass outside the top k [B, T] (summed from those tokens' own terms; -inf at
// k = V).
struct HeadTopK {
  torch::Tensor log_probs;  // [B, T, k] FP32, largest first
  torch::Tensor ids;        // [B, T, k] int64
  torch::Tensor rest;       // [B, T] FP32 log sum of the other tokens' probabilities
};
HeadTopK head_top_k(const torch::Tensor& hidden, const torch::Tensor& weight, int64_t k,
                    int64_t chunk_tokens);

// The plain reference: the whole [B, T, V] logits through autograd's own ops
// (log_softmax, gather), as HF/TRL compute them. For tests and benchmarks.
HeadLogProbs full_logits_log_probs(const torch::Tensor& hidden, const torch::Tensor& weight,
                                   const torch::Tensor& labels, Entropy entropy = Entropy::kSkip);

// The path before issue 28: chunks of `chunk` positions over all B rows ([B, chunk, V] FP32
// logits at once, about 3 of them at the peak), a custom backward that recomputes each
// chunk. hidden: [B, T, H]; weight: [V, H]; labels: [B, T] int64. Returns [B, T] FP32.
torch::Tensor chunked_log_probs(const torch::Tensor& hidden, const torch::Tensor& weight,
                                const torch::Tensor& labels, int64_t chunk = kLegacyLogProbChunk);

}  // namespace rlhf::models
