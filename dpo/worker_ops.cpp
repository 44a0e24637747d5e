// dpo/worker_ops.h's wire forms: loss types by their spec names.
#include "dpo/worker_ops.h"

#include "core/json_fields.h"

namespace rlhf::dpo {

void to_json(nlohmann::json& j, const DpoLossConfig& c) {
  j = {{"type", dpo_loss_name(c.type)},        {"beta", c.beta},
       {"label_smoothing", c.label_smoothing}, {"simpo_gamma", c.simpo_gamma},
       {"orpo_lambda", c.orpo_lambda},         {"nll_loss_coef", c.nll_loss_coef}};
}

void from_json(const nlohmann::json& j, DpoLossConfig& c) {
  JsonFields f(j, "dpo loss");
  c.type = parse_dpo_loss(f.get<std::string>("type"));
  f.read("beta", c.beta);
  f.read("label_smoothing", c.label_smoothing);
  f.read("simpo_gamma", c.simpo_gamma);
  f.read("orpo_lambda", c.orpo_lambda);
  f.read("nll_loss_coef", c.nll_loss_coef);
  f.finish();
}

}  // namespace rlhf::dpo

namespace rlhf::ops {

void to_json(nlohmann::json& j, const TrainRm& r) {
  j = {{"micro_batch_size", r.micro_batch_size}, {"loss", dpo::rm_loss_name(r.loss)}};
}

void from_json(const nlohmann::json& j, TrainRm& r) {
  JsonFields f(j, TrainRm::kName);
  f.read("micro_batch_size", r.micro_batch_size);
  r.loss = dpo::parse_rm_loss(f.get<std::string>("loss"));
  f.finish();
}

}  // namespace rlhf::ops
