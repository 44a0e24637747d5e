// KL between the policy and the reference model per action token, and the KL coefficient
// controllers (fixed, adaptive). Matches OpenRLHF's compute_approx_kl and KL controllers.
#pragma once

#include <torch/types.h>

#include <string>

namespace rlhf::ppo {

enum class KlEstimator { kK1, kK2, kK3 };
// "k1" | "k2" | "k3"; throws InputError otherwise.
KlEstimator parse_kl_estimator(const std::string& name);
const char* kl_estimator_name(KlEstimator estimator);  // the inverse

// Per-token KL estimate from log_probs [B, A] (policy) and log_probs_ref [B, A], computed
// in FP32 and clamped to [-10, 10]. Estimators (http://joschu.net/blog/kl-approx.html), with
// r = log_probs - log_probs_ref:
//   k1 = r;   k2 = r^2 / 2;   k3 = exp(-r) - 1 + r.
torch::Tensor approx_kl(const torch::Tensor& log_probs, const torch::Tensor& log_probs_ref,
                        KlEstimator estimator);

// The batch's KL as OpenRLHF reports it and feeds its controller: the mean over sequences of
// each sequence's mean over its action tokens, mean_b(sum_t kl[b,t] m[b,t] / sum_t m[b,t])
// (experience_maker: info["kl"] = masked_mean(kl, action_mask, dim=-1)). A token mean over
// the whole batch would weight long responses more. kl, action_mask [B, A] -> scalar.
double sequence_mean_kl(const torch::Tensor& kl, const torch::Tensor& action_mask);

// On-policy distillation (algo.distill.coef): the per-token reverse KL to the teacher on the
// actor's own samples, k1 = log pi_actor(a_t) - log pi_teacher(a_t) with a_t ~ pi_actor (its
// expectation is KL(pi_actor || pi_teacher) at that position), and the advantage it gives,
//   A_t += -coef * k1_t,
// each token's own term, not discounted over later tokens: Thinking Machines' on-policy
// distillation (2025; Tinker's cookbook, discount 0), the reverse-KL case of GKD (Agarwal et
// al. 2024, lambda = 1). With the policy-gradient loss (ratio 1) the expected gradient is
// -coef x grad KL(pi_actor || pi_teacher) (tests/ppo/distill_test.cpp). log_probs,
// log_probs_teacher, action_mask [B, A] -> [B, A] FP32, 0 off the mask.
torch::Tensor distill_reverse_kl(const torch::Tensor& log_probs,
                                 const torch::Tensor& log_probs_teacher,
                                 const torch::Tensor& action_mask);
torch::Tensor distill_advantage(const torch::Tensor& reverse_kl, double coef);

// GKD's generalised Jensen-Shannon divergence (Agarwal et al. 2024, "On-Policy Distillation
// of Language Models", eq. for JSD(beta); TRL's GKDTrainer.generalized_jsd_loss), per
// position, between the teacher's next-token distribution P and the student's Q (both at the
// sampling temperature):
//   beta = 0: KL(P || Q) (forward);   beta = 1: KL(Q || P) (reverse);
//   otherwise, with M = beta P + (1 - beta) Q: beta KL(P || M) + (1 - beta) KL(Q || M).
// The teacher sends its top-k tokens only (algo.distill.gkd.top_k): teacher_top [.., k] are
// their log-probs (of its whole softmax), teacher_rest [..] the log of its mass on all other
// tokens (models::HeadTopK::rest; undefined: log(1 - the top's sum)), and student_top [.., k]
// the student's log-probs of the same tokens (its rest is 1 - their sum). Both distributions
// are lumped onto k + 1 outcomes, the k tokens and "any other token", and the divergence is
// that of the lumped distributions: exact when k >= vocab_size (no other token; the rest is
// dropped), and otherwise never above the whole-vocabulary value (KL and JSD are
// f-divergences, which lumping outcomes cannot increase). Computed in FP64 (the rest as 1 -
// a sum); the gradient reaches the student through student_top. Returns [..] FP32.
torch::Tensor gkd_divergence(const torch::Tensor& student_top, const torch::Tensor& teacher_top,
                             const torch::Tensor& teacher_rest, double beta, int64_t vocab_size);

// KL coefficient. Fixed when target == 0; otherwise the adaptive controller of Ziegler et
// al. 2019 as OpenRLHF implements it:
//   e = clip(current_kl / target - 1, -0.2, 0.2);  coef *= 1 + e * n_samples / horizon.
class KlController {
 public:
  KlController(double init_coef, double target, int64_t horizon)
      : value_(init_coef), target_(target), horizon_(horizon) {}
  double value() const { return value_; }
  // `current_kl` is the batch's sequence_mean_kl; `n_samples` the sequences it came from.
  void update(double current_kl, int64_t n_samples);
  void set_value(double v) { value_ = v; }  // for resume

 private:
  double value_;
  double target_;
  int64_t horizon_;
};

}  // namespace rlhf::ppo
