// train_actor and train_critic (ppo/worker_ops.h): one optimizer step of the PPO policy loss
// (with its KL, load-balancing and GKD terms) or of the value loss, over this rank's rows of
// the global batch, in micro batches and token-budget parts.
#include "actors/train_operations.h"

#include <optional>

#include "actors/model_batch.h"
#include "core/errors.h"
#include "engine/token_budget.h"
#include "models/routes.h"
#include "ppo/kl.h"
#include "ppo/losses.h"
#include "ppo/worker_ops.h"

namespace rlhf {

namespace {

using model_ops::at_temperature;
using model_ops::Batch;
using model_ops::rank_rows;
using model_ops::read_batch;
using model_ops::request_temperature;
using model_ops::rows;
using model_ops::slice;

// The parts of training micro batch rows [b0, b1) under the request's token budget
// (max_tokens, packing): rows of at most max_tokens (rows x padded length), or with packing
// consecutive rows whose tokens fit the budget (forwarded packed into one row). Packed
// parts depend on the data, so at ZeRO 2/3 (a reduce-scatter in every backward) and with
// expert parallelism (all-to-alls in every forward) every rank pads to the group's largest
// count with empty parts (run with weight 0).
std::vector<engine::RowRange> training_parts(const ModelRole& role,
                                             const ops::TrainBatching& batching, const Batch& all,
                                             int64_t b0, int64_t b1) {
  const int64_t max_tokens = batching.max_tokens;
  if (!(batching.packing && max_tokens > 0))
    return engine::budget_ranges(b1 - b0, all.sequences.size(1), max_tokens, 0);
  auto parts = engine::token_groups(all.attention_mask.slice(0, b0, b1), max_tokens);
  if (role.group && role.group->size() > 1 &&
      (role.trainer->config().zero_stage != engine::ZeroStage::kOptimizer || role.ep_group)) {
    auto count = torch::tensor({static_cast<int64_t>(parts.size())}, torch::kLong);
    role.group->all_reduce(count, transport::ReduceOp::kMax);
    while (static_cast<int64_t>(parts.size()) < count.item<int64_t>())
      parts.push_back({b1 - b0, b1 - b0});
  }
  return parts;
}

// Per-action results [n, A] of rows `b` through `f` (hidden [B, T, H] -> next-token results
// [B, T - 1]), forwarded as padded rows or, with `packed`, end to end in one row.
template <typename F>
torch::Tensor per_action(models::CausalLM& model, const Batch& b, const torch::Tensor& action_mask,
                         bool packed, F f) {
  if (!packed) {
    torch::Tensor r = f(model.forward(b.sequences, b.attention_mask), b.sequences);
    return r.slice(1, r.size(1) - b.action_len, r.size(1));
  }
  const auto rows = engine::pack_rows(b.sequences, b.attention_mask, b.action_len);
  return engine::unpack_actions(f(model.forward(rows.ids, rows.segments), rows.ids), rows,
                                action_mask);
}

// One part of a training micro batch (all of it without a token budget).
struct TrainPart {
  int64_t begin = 0, end = 0;  // rows of the request
  Batch batch;                 // those rows
  torch::Tensor action_mask;   // [n, A] on the device
  // Its action tokens (rows) over the micro batch's: a part's loss times its share adds up
  // to the micro batch's loss. 0 for a padding part (row 0 run for the collectives only).
  double token_share = 1.0;
  double row_share = 1.0;
};

// The policy's log-probs of a part's actions [n, A] and, given the teacher's top-k ids
// [n, A, k] (GKD), the policy's log-probs of those tokens [n, A, k] from the same head pass
// (models::head_log_probs with [.., 1 + k] labels).
struct PolicyForward {
  torch::Tensor log_probs;      // [n, A]
  torch::Tensor top_log_probs;  // [n, A, k]; undefined without top ids
};

PolicyForward policy_forward(models::CausalLM& model, const TrainPart& part, bool packed,
                             double temperature, const torch::Tensor& top_ids) {
  const Batch& b = part.batch;
  if (!top_ids.defined())
    return {per_action(model, b, part.action_mask, packed,
                       [&](const torch::Tensor& hidden, const torch::Tensor& ids) {
                         return model.next_token_log_probs(at_temperature(hidden, temperature),
                                                           ids);
                       }),
            {}};
  const int64_t n = top_ids.size(0), a = b.action_len, k = top_ids.size(2);
  if (!packed) {  // the head on the action positions alone (the states before each action)
    const int64_t t = b.sequences.size(1);
    torch::Tensor hidden = model.forward(b.sequences, b.attention_mask).narrow(1, t - 1 - a, a);
    torch::Tensor labels = torch::cat({b.sequences.narrow(1, t - a, a).unsqueeze(2), top_ids}, 2);
    torch::Tensor r = model.head_log_probs(at_temperature(hidden, temperature), labels).log_probs;
    return {r.select(2, 0), r.narrow(2, 1, k)};
  }
  // Packed: each action's labels at its prediction's place in the packed row.
  const auto pr = engine::pack_rows(b.sequences, b.attention_mask, a);
  const int64_t l = pr.ids.size(1);
  torch::Tensor labels = torch::zeros({l - 1, 1 + k}, pr.ids.options());
  labels.select(1, 0).copy_(pr.ids.squeeze(0).narrow(0, 1, l - 1));
  const torch::Tensor on = part.action_mask.reshape({-1}).nonzero().squeeze(1);
  const torch::Tensor at = pr.action_index.reshape({-1}).index_select(0, on);
  labels.narrow(1, 1, k).index_copy_(0, at, top_ids.reshape({n * a, k}).index_select(0, on));
  torch::Tensor hidden = model.forward(pr.ids, pr.segments).narrow(1, 0, l - 1);
  torch::Tensor r =
      model.head_log_probs(at_temperature(hidden, temperature), labels.unsqueeze(0)).log_probs;
  r = r.squeeze(0).index_select(0, pr.action_index.reshape({-1})).view({n, a, 1 + k});
  r = r.masked_fill(part.action_mask.unsqueeze(2) == 0, 0);
  return {r.select(2, 0), r.narrow(2, 1, k)};
}

// GKD's term of one part: the token mean over its action mask of the generalised JSD between
// the teacher's top-k and the policy's log-probs of the same tokens (ppo::gkd_divergence).
torch::Tensor gkd_mean(const ops::TrainActor& op, const torch::Tensor& student_top,
                       const torch::Tensor& teacher_top, const torch::Tensor& teacher_rest,
                       const torch::Tensor& action_mask, int64_t vocab_size) {
  const torch::Tensor d =
      ppo::gkd_divergence(student_top, teacher_top, teacher_rest, op.gkd_beta, vocab_size);
  const torch::Tensor mf = action_mask.to(torch::kFloat32);
  return (d * mf).sum() / mf.sum().clamp_min(1);
}

// One optimizer step over this rank's rows [begin, end): micro batches of
// batching.micro_batch_size, each in training_parts, trainer.backward(loss_fn(part)) for each.
template <typename F>
engine::StepMetrics train_in_parts(ModelRole& role, const Message& req,
                                   const ops::TrainBatching& batching, const Batch& all,
                                   int64_t begin, int64_t end, F loss_fn) {
  const int64_t micro = batching.micro_batch_size;
  auto& trainer = *role.trainer;
  for (int64_t i = 0; i < trainer.config().grad_accum_steps; ++i) {
    const int64_t b0 = begin + i * micro, b1 = std::min(end, b0 + micro);
    TORCH_CHECK(b0 < b1, req.op, ": micro batch ", i, " is empty: the batch holds ", end - begin,
                " rows for this rank, fewer than grad_accum_steps x micro_batch_size");
    const torch::Tensor mask = rows(req, "action_mask", b0, b1, all.sequences.device());
    const auto parts = training_parts(role, batching, all, b0, b1);
    const double tokens = parts.size() == 1 ? 0.0 : mask.sum().item<double>();
    for (size_t k = 0; k < parts.size(); ++k) {
      const bool empty = parts[k].first == parts[k].second;
      TrainPart part;
      const int64_t p0 = empty ? 0 : parts[k].first, p1 = empty ? 1 : parts[k].second;
      part.begin = b0 + p0;
      part.end = b0 + p1;
      part.batch = slice(all, part.begin, part.end);
      part.action_mask = mask.slice(0, p0, p1);
      if (empty) {
        part.token_share = part.row_share = 0.0;
      } else if (parts.size() > 1) {
        part.row_share = static_cast<double>(p1 - p0) / static_cast<double>(b1 - b0);
        part.token_share =
            tokens == 0 ? part.row_share : part.action_mask.sum().item<double>() / tokens;
      }
      trainer.backward(loss_fn(part), k + 1 == parts.size());
    }
  }
  return trainer.step();
}

// train_actor (ppo/worker_ops.h): one optimizer step of the PPO policy loss (plus the KL
// loss term when asked) over this rank's share of the global batch.
Message train_actor(ModelRole& role, const ops::TrainActor& op, const Message& req,
                    const WorkerIdentity& self) {
  if (!role.trainer) throw RuntimeError("train_actor: this worker's role is not trained");
  Batch all = read_batch(req, op.batching.action_len, role.device);
  auto [begin, end] = rank_rows(all.sequences.size(0), self, req.op);
  const ppo::PolicyLossConfig& pc = op.policy;
  const bool corrected = pc.correction.mode != ppo::RolloutCorrection::kNone;
  const double kl_coef = op.kl_loss_coef;
  const bool kl_loss = kl_coef > 0 && req.has_tensor("log_probs_ref");
  const bool packed = op.batching.packing && op.batching.max_tokens > 0;
  const double temperature = request_temperature(op.temperature, op.kName);
  double clip_sum = 0, kl_sum = 0, ppo_kl_sum = 0, gkd_sum = 0;
  const bool gkd = op.gkd_coef > 0;
  // Routing replay: each part's routes stay set through its backward (checkpointed layers
  // route again when they recompute); cleared when the step ends.
  models::RouteReplay replay(*role.model);
  if (op.replay_routes && !all.routes.defined())
    throw InputError("train_actor: replay_routes without the rollout's \"routes\"");
  // Mixtures of experts: the load-balancing loss of each part's forward, its gradient added
  // in the part's backward (models::AuxLoss), weighted as the KL term (token share).
  std::optional<models::AuxLossScope> aux;
  if (op.aux_loss_coef > 0) aux.emplace(*role.model);
  const bool balance = aux && aux->sparse();
  double aux_sum = 0;
  auto metrics =
      train_in_parts(role, req, op.batching, all, begin, end, [&](const TrainPart& part) {
        if (op.replay_routes)
          replay.set(models::forward_routes(part.batch.routes, part.batch.attention_mask, packed));
        if (balance)
          aux->loss().begin(
              packed ? torch::Tensor() : part.batch.attention_mask.reshape({-1}),
              op.aux_loss_coef * part.token_share * role.trainer->backward_multiplier());
        // Each part's loss is its share of the micro batch's: tokens for token means, rows for
        // sequence means and token_sum_norm (a sum over rows x a constant); the KL term and the
        // metrics are token means.
        const double share =
            pc.aggregation == ppo::LossAggregation::kTokenMean ? part.token_share : part.row_share;
        const torch::Tensor& m = part.action_mask;
        const PolicyForward f =
            policy_forward(*role.model, part, packed, temperature,
                           gkd ? rows(req, "teacher_top_ids", part.begin, part.end, role.device)
                               : torch::Tensor());
        const torch::Tensor& lp = f.log_probs;
        auto r = ppo::policy_loss(
            pc, lp, rows(req, "log_probs_old", part.begin, part.end, role.device),
            rows(req, "advantages", part.begin, part.end, role.device), m,
            corrected ? rows(req, "log_probs_behaviour", part.begin, part.end, role.device)
                      : torch::Tensor());
        torch::Tensor loss = share == 1.0 ? r.loss : r.loss * share;
        if (kl_loss) {
          // OpenRLHF use_kl_loss: loss += kl_coef * masked_mean(kl(log_probs, log_probs_ref)).
          torch::Tensor kl = ppo::approx_kl(
              lp, rows(req, "log_probs_ref", part.begin, part.end, role.device), op.kl_estimator);
          torch::Tensor mf = m.to(torch::kFloat32);
          torch::Tensor kl_mean = (kl * mf).sum() / mf.sum().clamp_min(1);
          loss = loss + kl_coef * part.token_share * kl_mean;
          kl_sum += part.token_share * kl_mean.item<double>();
        }
        if (gkd) {
          const torch::Tensor d =
              gkd_mean(op, f.top_log_probs,
                       rows(req, "teacher_top_log_probs", part.begin, part.end, role.device),
                       rows(req, "teacher_top_rest", part.begin, part.end, role.device), m,
                       role.model->config().vocab_size);
          loss = loss + op.gkd_coef * part.token_share * d;
          gkd_sum += part.token_share * d.item<double>();
        }
        if (balance) {  // the forward is done: its counts are final before backward
          aux->loss().seal();
          aux_sum += part.token_share * aux->loss().value();
        }
        clip_sum += part.token_share * r.clip_frac.item<double>();
        ppo_kl_sum += part.token_share * r.approx_kl.item<double>();
        return loss;
      });
  const double n = static_cast<double>(role.trainer->config().grad_accum_steps);
  return reply_message(ops::TrainActorReply{ops::step_figures(metrics), clip_sum / n,
                                            ppo_kl_sum / n, kl_sum / n, aux_sum / n, gkd_sum / n});
}

// train_critic: one optimizer step of the clipped value loss on this rank's rows.
Message train_critic(ModelRole& role, const ops::TrainCritic& op, const Message& req,
                     const WorkerIdentity& self) {
  if (!role.trainer) throw RuntimeError("train_critic: this worker's role is not trained");
  Batch all = read_batch(req, op.batching.action_len, role.device);
  auto [begin, end] = rank_rows(all.sequences.size(0), self, req.op);
  const bool packed = op.batching.packing && op.batching.max_tokens > 0;
  auto metrics =
      train_in_parts(role, req, op.batching, all, begin, end, [&](const TrainPart& part) {
        torch::Tensor v = per_action(*role.model, part.batch, part.action_mask, packed,
                                     [&](const torch::Tensor& hidden, const torch::Tensor&) {
                                       torch::Tensor values = role.model->values(hidden);  // [B, T]
                                       return values.narrow(1, 0, values.size(1) - 1);
                                     });
        torch::Tensor loss =
            ppo::value_loss(v, rows(req, "values_old", part.begin, part.end, role.device),
                            rows(req, "returns", part.begin, part.end, role.device),
                            part.action_mask, op.value_clip, op.aggregation, op.norm_len);
        // The part's share of the micro batch: of its tokens for a token mean, else of its rows.
        const double share =
            op.aggregation == ppo::LossAggregation::kTokenMean ? part.token_share : part.row_share;
        return share == 1.0 ? loss : loss * share;
      });
  return reply_message(ops::TrainCriticReply{ops::step_figures(metrics)});
}

}  // namespace

void add_train_operations(OperationRegistry& registry, const std::shared_ptr<ModelRole>& role) {
  registry.add<ops::TrainActor>(
      [role](const ops::TrainActor& op, const Message& req, const WorkerIdentity& self) {
        return train_actor(*role, op, req, self);
      });
  registry.add<ops::TrainCritic>(
      [role](const ops::TrainCritic& op, const Message& req, const WorkerIdentity& self) {
        return train_critic(*role, op, req, self);
      });
}

}  // namespace rlhf
