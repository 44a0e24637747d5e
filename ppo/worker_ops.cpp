// ppo/worker_ops.h's wire forms: the enums travel by their spec names.
#include "ppo/worker_ops.h"

#include "core/json_fields.h"

namespace rlhf::ppo {

void to_json(nlohmann::json& j, const PolicyLossConfig& c) {
  j = {{"ratio", policy_ratio_name(c.ratio)},
       {"clip_low", c.clip_low},
       {"clip_high", c.clip_high},
       {"dual_clip", c.dual_clip},
       {"aggregation", loss_aggregation_name(c.aggregation)},
       {"norm_len", c.norm_len},
       {"correction", rollout_correction_name(c.correction.mode)},
       {"correction_cap", c.correction.cap}};
}

void from_json(const nlohmann::json& j, PolicyLossConfig& c) {
  JsonFields f(j, "policy loss");
  c.ratio = parse_policy_ratio(f.get<std::string>("ratio"));
  f.read("clip_low", c.clip_low);
  f.read("clip_high", c.clip_high);
  f.read("dual_clip", c.dual_clip);
  c.aggregation = parse_loss_aggregation(f.get<std::string>("aggregation"));
  f.read("norm_len", c.norm_len);
  c.correction.mode = parse_rollout_correction(f.get<std::string>("correction"));
  f.read("correction_cap", c.correction.cap);
  f.finish();
}

}  // namespace rlhf::ppo

namespace rlhf::ops {

void to_json(nlohmann::json& j, const TrainActor& r) {
  j = {{"batching", r.batching},
       {"policy", r.policy},
       {"kl_loss_coef", r.kl_loss_coef},
       {"kl_estimator", ppo::kl_estimator_name(r.kl_estimator)},
       {"temperature", r.temperature},
       {"replay_routes", r.replay_routes},
       {"aux_loss_coef", r.aux_loss_coef},
       {"gkd_coef", r.gkd_coef},
       {"gkd_beta", r.gkd_beta}};
}

void from_json(const nlohmann::json& j, TrainActor& r) {
  JsonFields f(j, TrainActor::kName);
  f.read("batching", r.batching);
  f.read("policy", r.policy);
  f.read("kl_loss_coef", r.kl_loss_coef);
  r.kl_estimator = ppo::parse_kl_estimator(f.get<std::string>("kl_estimator"));
  f.read("temperature", r.temperature);
  f.read("replay_routes", r.replay_routes);
  f.read("aux_loss_coef", r.aux_loss_coef);
  f.read("gkd_coef", r.gkd_coef);
  f.read("gkd_beta", r.gkd_beta);
  f.finish();
}

void to_json(nlohmann::json& j, const TrainCritic& r) {
  j = {{"batching", r.batching},
       {"value_clip", r.value_clip},
       {"aggregation", ppo::loss_aggregation_name(r.aggregation)},
       {"norm_len", r.norm_len}};
}

void from_json(const nlohmann::json& j, TrainCritic& r) {
  JsonFields f(j, TrainCritic::kName);
  f.read("batching", r.batching);
  f.read("value_clip", r.value_clip);
  r.aggregation = ppo::parse_loss_aggregation(f.get<std::string>("aggregation"));
  f.read("norm_len", r.norm_len);
  f.finish();
}

}  // namespace rlhf::ops
