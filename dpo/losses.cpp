#include "dpo/losses.h"

#include <torch/nn/functional/activation.h>

#include "core/errors.h"

namespace rlhf::dpo {

namespace {
torch::Tensor logsigmoid(const torch::Tensor& x) {
  return torch::log_sigmoid(x);
}

// log odds of a probability given as its log p <= 0: log p - log(1 - p). log(1 - e^x) is
// taken as log(-expm1(x)) near 0 and log1p(-exp(x)) below -ln 2 (Maechler 2012), each where it
// keeps its digits; x is capped at -1e-6 so p = 1 (an exact fit) gives a large finite log
// odds instead of inf.
torch::Tensor log_odds(const torch::Tensor& log_p) {
  torch::Tensor x = log_p.clamp_max(-1e-6);
  torch::Tensor log1mexp =
      torch::where(x > -0.693147, torch::log(-torch::expm1(x)), torch::log1p(-torch::exp(x)));
  return x - log1mexp;
}
}  // namespace

DpoLossType parse_dpo_loss(const std::string& name) {
  if (name == "sigmoid") return DpoLossType::kSigmoid;
  if (name == "ipo") return DpoLossType::kIpo;
  if (name == "hinge") return DpoLossType::kHinge;
  if (name == "simpo") return DpoLossType::kSimpo;
  if (name == "orpo") return DpoLossType::kOrpo;
  if (name == "kto") return DpoLossType::kKto;
  throw InputError("algo.dpo.loss: expected sigmoid, ipo, hinge, simpo, orpo or kto, found \"" +
                   name + "\"");
}

const char* dpo_loss_name(DpoLossType type) {
  switch (type) {
    case DpoLossType::kSigmoid:
      return "sigmoid";
    case DpoLossType::kIpo:
      return "ipo";
    case DpoLossType::kHinge:
      return "hinge";
    case DpoLossType::kSimpo:
      return "simpo";
    case DpoLossType::kOrpo:
      return "orpo";
    case DpoLossType::kKto:
      return "kto";
  }
  return "?";
}

bool needs_reference(DpoLossType type) {
  return type != DpoLossType::kSimpo && type != DpoLossType::kOrpo;
}

bool uses_mean_log_probs(DpoLossType type) {
  return type == DpoLossType::kSimpo || type == DpoLossType::kOrpo;
}

DpoLossResult dpo_loss(const DpoLossConfig& c, const PairLogProbs& lp) {
  if (c.type == DpoLossType::kKto)
    throw InputError("dpo_loss: kto takes unpaired rows; call kto_loss");
  TORCH_CHECK(lp.chosen.dim() == 1 && lp.chosen.sizes() == lp.rejected.sizes(),
              "dpo_loss: expected chosen and rejected log-probs [P], got ", lp.chosen.sizes(),
              " and ", lp.rejected.sizes());
  const bool ref = needs_reference(c.type);
  TORCH_CHECK(!ref || (lp.ref_chosen.defined() && lp.ref_rejected.defined()),
              "dpo_loss: this loss needs the reference model's log-probs");
  torch::Tensor pc = lp.chosen.to(torch::kFloat32), pr = lp.rejected.to(torch::kFloat32);
  torch::Tensor rc = ref ? lp.ref_chosen.to(torch::kFloat32) : torch::zeros_like(pc);
  torch::Tensor rr = ref ? lp.ref_rejected.to(torch::kFloat32) : torch::zeros_like(pr);
  torch::Tensor h = (pc - pr) - (rc - rr);
  torch::Tensor losses;
  switch (c.type) {
    case DpoLossType::kSigmoid:
      losses = -logsigmoid(c.beta * h) * (1.0 - c.label_smoothing) -
               logsigmoid(-c.beta * h) * c.label_smoothing;
      break;
    case DpoLossType::kIpo:
      losses = (h - 1.0 / (2.0 * c.beta)).pow(2);
      break;
    case DpoLossType::kHinge:
      losses = torch::relu(1.0 - c.beta * h);
      break;
    case DpoLossType::kSimpo:
      losses = -logsigmoid(c.beta * h - c.simpo_gamma) * (1.0 - c.label_smoothing) -
               logsigmoid(-(c.beta * h - c.simpo_gamma)) * c.label_smoothing;
      break;
    case DpoLossType::kOrpo:
      // L_SFT + lambda * L_OR, L_OR = -log sigmoid(log odds(y_w) - log odds(y_l)) (ORPO eq. 6-7).
      losses = -pc - c.orpo_lambda * logsigmoid(log_odds(pc) - log_odds(pr));
      break;
    case DpoLossType::kKto:
      break;  // refused above
  }
  DpoLossResult out;
  out.loss = losses.mean();
  if (c.nll_loss_coef > 0) {
    TORCH_CHECK(lp.chosen_tokens.defined(), "dpo_loss: nll_loss_coef needs chosen_tokens");
    torch::Tensor per_token =
        uses_mean_log_probs(c.type) ? pc : pc / lp.chosen_tokens.to(torch::kFloat32).clamp_min(1);
    out.loss = out.loss + c.nll_loss_coef * (-per_token).mean();
  }
  out.chosen_rewards = (c.beta * (pc - rc)).detach();
  out.rejected_rewards = (c.beta * (pr - rr)).detach();
  out.accuracy = (out.chosen_rewards > out.rejected_rewards).to(torch::kFloat32).mean();
  out.margin = (out.chosen_rewards - out.rejected_rewards).mean();
  return out;
}

torch::Tensor kto_reference_point(const torch::Tensor& mean_kl) {
  TORCH_CHECK(mean_kl.numel() == 1, "kto_reference_point: expected a scalar, got ",
              mean_kl.sizes());
  // KTO eq. 8; OpenRLHF KTOLoss: KL = (policy_KL_logps - reference_KL_logps).mean().detach(),
  // all-reduced over ranks, then KL.clamp(min=0).
  return mean_kl.detach().to(torch::kFloat32).reshape({}).clamp_min(0);
}

KtoLossResult kto_loss(const KtoLossConfig& c, const KtoLogProbs& lp) {
  TORCH_CHECK(lp.policy.dim() == 1 && lp.policy.sizes() == lp.ref.sizes() &&
                  lp.policy.sizes() == lp.desirable.sizes(),
              "kto_loss: expected policy, ref and desirable [N], got ", lp.policy.sizes(), ", ",
              lp.ref.sizes(), " and ", lp.desirable.sizes());
  torch::Tensor z0;
  if (lp.z0.defined()) {
    z0 = kto_reference_point(lp.z0.to(lp.policy.device()));
  } else {
    TORCH_CHECK(lp.policy_kl.defined() && lp.ref_kl.defined(),
                "kto_loss: needs z0 or the mismatched-pair log-probs policy_kl and ref_kl");
    TORCH_CHECK(lp.policy_kl.dim() == 1 && lp.policy_kl.sizes() == lp.ref_kl.sizes() &&
                    lp.policy_kl.numel() > 0,
                "kto_loss: expected mismatched-pair log-probs policy_kl and ref_kl [N], got ",
                lp.policy_kl.sizes(), " and ", lp.ref_kl.sizes());
    z0 = kto_reference_point(
        (lp.policy_kl.to(torch::kFloat32) - lp.ref_kl.to(torch::kFloat32)).mean());
  }
  torch::Tensor r = lp.policy.to(torch::kFloat32) - lp.ref.to(torch::kFloat32);  // [N]
  torch::Tensor d = lp.desirable.to(torch::kBool);
  torch::Tensor desirable_losses = c.desirable_weight * (1 - torch::sigmoid(c.beta * (r - z0)));
  torch::Tensor undesirable_losses = c.undesirable_weight * (1 - torch::sigmoid(c.beta * (z0 - r)));
  KtoLossResult out;
  out.loss = torch::where(d, desirable_losses, undesirable_losses).mean();
  torch::Tensor rewards = (c.beta * r).detach();
  out.chosen_rewards = rewards.masked_select(d);
  out.rejected_rewards = rewards.masked_select(d.logical_not());
  out.kl = z0;
  return out;
}

RmLossType parse_rm_loss(const std::string& name) {
  if (name == "sigmoid") return RmLossType::kSigmoid;
  if (name == "logexp") return RmLossType::kLogExp;
  throw InputError("algo.rm.loss: expected sigmoid or logexp, found \"" + name + "\"");
}

const char* rm_loss_name(RmLossType type) {
  return type == RmLossType::kLogExp ? "logexp" : "sigmoid";
}

torch::Tensor rm_loss(RmLossType type, const torch::Tensor& chosen_scores,
                      const torch::Tensor& rejected_scores, const torch::Tensor& margin) {
  TORCH_CHECK(chosen_scores.sizes() == rejected_scores.sizes(),
              "rm_loss: chosen and rejected scores differ in shape: ", chosen_scores.sizes(),
              " vs ", rejected_scores.sizes());
  torch::Tensor c = chosen_scores.to(torch::kFloat32), r = rejected_scores.to(torch::kFloat32);
  // log(1 + exp(x)) = softplus(x): exp overflows FP32 for x > 88 (and BF16 scores reach
  // that), softplus does not (it returns x itself above its threshold of 20).
  if (type == RmLossType::kLogExp) return torch::softplus(r - c).mean();
  torch::Tensor diff = c - r;
  if (margin.defined()) diff = diff - margin.to(torch::kFloat32);
  return (-logsigmoid(diff)).mean();
}

torch::Tensor sft_loss(const torch::Tensor& log_probs, const torch::Tensor& loss_mask) {
  TORCH_CHECK(log_probs.sizes() == loss_mask.sizes(),
              "sft_loss: shapes differ: ", log_probs.sizes(), " vs ", loss_mask.sizes());
  torch::Tensor m = loss_mask.to(torch::kFloat32);
  return -(log_probs.to(torch::kFloat32) * m).sum() / m.sum().clamp_min(1);
}

}  // namespace rlhf::dpo
