// The reference the GKD tests compare against (tests/ppo/gkd_test.cpp, tests/actors/
// model_operations_test.cpp): the generalised JSD per position over the whole vocabulary from
// logits [.., V], in FP64, written as TRL's GKDTrainer.generalized_jsd_loss computes it
// (beta 0: KL(teacher || student), 1: KL(student || teacher), else with the mixture
// M = beta teacher + (1 - beta) student, beta KL(teacher || M) + (1 - beta) KL(student || M)).
#pragma once

#include <torch/torch.h>

namespace rlhf::test {

inline torch::Tensor whole_jsd(const torch::Tensor& student_logits,
                               const torch::Tensor& teacher_logits, double beta) {
  const auto q = torch::log_softmax(student_logits.to(torch::kFloat64), -1);
  const auto p = torch::log_softmax(teacher_logits.to(torch::kFloat64), -1);
  const auto kl = [](const torch::Tensor& a, const torch::Tensor& b) {
    return (a.exp() * (a - b)).sum(-1);
  };
  if (beta == 0.0) return kl(p, q);
  if (beta == 1.0) return kl(q, p);
  const auto m = torch::log(beta * p.exp() + (1 - beta) * q.exp());
  return beta * kl(p, m) + (1 - beta) * kl(q, m);
}

}  // namespace rlhf::test
