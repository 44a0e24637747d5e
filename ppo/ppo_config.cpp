#include "ppo/ppo_config.h"

#include "core/errors.h"

namespace rlhf::ppo {

PpoConfig PpoConfig::from_spec(const JobSpec& spec) {
  PpoConfig c;
  c.rollout_batch_size = spec.get_int("rollout.batch_size");
  c.rollout_micro_batch_size = spec.get_int("rollout.micro_batch_size");
  c.tensor_parallel_size = static_cast<int>(spec.get_int("rollout.tensor_parallel_size"));
  c.n_samples_per_prompt = spec.get_int("rollout.n_samples_per_prompt");
  c.max_new_tokens = spec.get_int("rollout.max_new_tokens");
  c.temperature = spec.get_float("rollout.temperature");
  c.top_p = spec.get_float("rollout.top_p");
  c.top_k = spec.get_int("rollout.top_k");
  c.stop_token_ids = spec.at("rollout.stop_token_ids").get<std::vector<int64_t>>();
  c.max_turns = spec.get_int("rollout.max_turns");
  // env.* keys come with the environments (envs/); read from the resolved spec so this
  // builds and runs without them.
  const auto& resolved = spec.json();
  if (resolved.contains("env") && resolved.at("env").is_object()) {
    const auto& env = resolved.at("env");
    for (const char* key : {"builtin", "python", "url"})
      if (env.contains(key) && env.at(key).is_string() && !env.at(key).get<std::string>().empty())
        c.environment = env;
  }
  if (c.max_turns > 1 && c.environment.is_null())
    throw InputError("rollout.max_turns " + std::to_string(c.max_turns) +
                     " needs an environment to answer the turns: set env.builtin, env.python "
                     "or env.url");
  c.prompt_max_len = spec.get_int("data.prompt_max_len");
  c.train_batch_size = spec.get_int("train.batch_size");
  c.train_micro_batch_size = spec.get_int("train.micro_batch_size");
  c.max_tokens_per_micro_batch = spec.get_int("train.max_tokens_per_micro_batch");
  c.packing_samples = spec.get_bool("train.packing_samples");
  c.max_epochs = spec.get_int("train.max_epochs");
  c.num_episodes = spec.get_int("train.num_episodes");
  c.max_steps = spec.get_int("train.max_steps");
  c.seed = static_cast<uint64_t>(spec.get_int("train.seed"));
  c.advantage.estimator = parse_advantage_estimator(spec.get_string("algo.advantage.estimator"));
  c.advantage.gamma = spec.get_float("algo.advantage.gamma");
  c.advantage.lambd = spec.get_float("algo.advantage.lambd");
  c.advantage.n_samples_per_prompt = c.n_samples_per_prompt;
  auto clip = spec.get_float_list("reward.clip_range");
  c.advantage.reward_clip_low = clip[0];
  c.advantage.reward_clip_high = clip[1];
  c.kl_estimator = parse_kl_estimator(spec.get_string("algo.kl.estimator"));
  c.kl_init_coef = spec.get_float("algo.kl.init_coef");
  c.kl_target = spec.get_float("algo.kl.target");
  c.kl_horizon = spec.get_int("algo.kl.horizon");
  c.kl_use_loss = spec.get_bool("algo.kl.use_loss");
  c.distill_coef = spec.get_float("algo.distill.coef");
  c.gkd_coef = spec.get_float("algo.distill.gkd.coef");
  c.gkd_beta = spec.get_float("algo.distill.gkd.beta");
  c.gkd_top_k = spec.get_int("algo.distill.gkd.top_k");
  c.gkd_lambda = spec.get_float("algo.distill.gkd.lambda");
  const double eps = spec.get_float("actor.eps_clip");
  const double low = spec.get_float("actor.eps_clip_low"),
               high = spec.get_float("actor.eps_clip_high");
  c.policy.clip_low = low > 0 ? low : eps;
  c.policy.clip_high = high > 0 ? high : eps;
  c.policy.dual_clip = spec.get_float("actor.dual_clip");
  c.policy.ratio = parse_policy_ratio(spec.get_string("actor.policy_loss"));
  c.policy.aggregation = parse_loss_aggregation(resolve_loss_aggregation(
      spec.get_string("actor.loss_agg"), spec.get_string("algo.advantage.estimator")));
  c.policy.norm_len = c.max_new_tokens;
  c.policy.correction.mode = parse_rollout_correction(spec.get_string("algo.rollout_correction"));
  c.policy.correction.cap = spec.get_float("algo.rollout_correction_cap");
  c.value_clip = spec.get_float("critic.value_clip");
  c.overlong_buffer_len = spec.get_int("reward.overlong_buffer_len");
  c.overlong_penalty_factor = spec.get_float("reward.overlong_penalty_factor");
  c.dynamic_sampling = spec.get_bool("algo.dynamic_sampling");
  c.max_staleness = spec.get_int("algo.max_staleness");
  c.partial_rollout = spec.get_bool("rollout.partial_rollout");
  c.streaming = spec.get_bool("rollout.streaming");
  c.max_refill_batches = spec.get_int("rollout.max_refill_batches");
  c.routing_replay = spec.get_bool("algo.routing_replay");
  c.aux_loss_coef = spec.get_float("actor.aux_loss_coef");
  c.routing_stats = c.routing_replay || spec.get_bool("algo.routing_stats");
  return c;
}

}  // namespace rlhf::ppo
