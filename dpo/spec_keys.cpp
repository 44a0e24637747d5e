#include "dpo/spec_keys.h"

#include "core/spec_check.h"
#include "dpo/losses.h"
#include "engine/spec_keys.h"

namespace rlhf::dpo {

using nlohmann::json;

namespace {

bool reference_free(const json& r) {
  return !needs_reference(parse_dpo_loss(r.at(spec_pointer("algo.dpo.loss"))));
}

// sft trains the actor, rm the reward model; dpo trains the actor against a reference unless
// the loss needs none or the LoRA actor is its own.
std::optional<RoleUse> roles(const json& r) {
  const std::string kind = r.at("kind");
  if (kind == "sft") return RoleUse{{Role::kActor}, {Role::kActor}};
  if (kind == "rm") return RoleUse{{Role::kReward}, {Role::kReward}};
  if (kind != "dpo") return std::nullopt;
  if (reference_free(r) || engine::actor_is_reference(r))
    return RoleUse{{Role::kActor}, {Role::kActor}};
  return RoleUse{{Role::kActor, Role::kRef}, {Role::kActor}};
}

std::string why_unused(const json& r, Role role) {
  if (role != Role::kRef || !reference_free(r)) return "";
  return r.at(spec_pointer("algo.dpo.loss")).get<std::string>() + " needs no reference";
}

}  // namespace

SpecSection spec_section() {
  SpecSection s;
  s.owner = "dpo";
  s.keys = [](KeyTable& t) {
    t.choice("algo.dpo.loss", "sigmoid", {"sigmoid", "ipo", "hinge", "simpo", "orpo", "kto"},
             "DPO-family loss; simpo and orpo need no reference model; kto trains on unpaired rows "
             "(data.prompt_key, data.output_key, data.label_key: true for desirable).");
    t.number("algo.dpo.beta", 0.1, 0, kUnbounded,
             "DPO beta: strength of the implicit KL to the reference.", true);
    t.number("algo.dpo.label_smoothing", 0.0, 0, 0.5, "cDPO label smoothing.");
    t.number("algo.dpo.simpo_gamma", 0.5, 0, kUnbounded, "SimPO target reward margin gamma.");
    t.number("algo.dpo.orpo_lambda", 0.1, 0, kUnbounded,
             "ORPO weight lambda of the odds-ratio term added to the chosen NLL (TRL's beta).");
    t.number("algo.dpo.kto_desirable_weight", 1.0, 0, kUnbounded,
             "KTO weight lambda_D of the desirable rows' loss.");
    t.number("algo.dpo.kto_undesirable_weight", 1.0, 0, kUnbounded,
             "KTO weight lambda_U of the undesirable rows' loss.");
    t.number("algo.dpo.nll_loss_coef", 0.0, 0, kUnbounded,
             "Weight of the NLL loss on chosen responses.");
    t.choice("algo.rm.loss", "sigmoid", {"sigmoid", "logexp"}, "Pairwise reward-model loss.");
  };
  s.roles = roles;
  s.why_unused = why_unused;
  return s;
}

}  // namespace rlhf::dpo
