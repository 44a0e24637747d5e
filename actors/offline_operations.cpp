#include "actors/offline_operations.h"

#include <algorithm>
#include <map>

#include "core/errors.h"
#include "dpo/losses.h"
#include "dpo/worker_ops.h"
#include "models/lora.h"
#include "transport/collective_group.h"

namespace rlhf {

using nlohmann::json;

namespace {

struct RowBatch {
  torch::Tensor sequences;       // [N, T] int64, right-padded
  torch::Tensor attention_mask;  // [N, T]
  torch::Tensor loss_mask;  // [N, T-1] 1 where token t+1 is a response token (undefined for scores)

  int64_t rows() const { return sequences.size(0); }
  RowBatch slice(int64_t begin, int64_t end) const {
    return {sequences.slice(0, begin, end), attention_mask.slice(0, begin, end),
            loss_mask.defined() ? loss_mask.slice(0, begin, end) : torch::Tensor()};
  }
};

// The request's rows on `device` (the worker's).
RowBatch read_rows(const Message& req, bool need_loss_mask, torch::Device device) {
  RowBatch b;
  b.sequences = req.tensor("sequences").to(device, torch::kLong);
  b.attention_mask = req.tensor("attention_mask").to(device, torch::kLong);
  TORCH_CHECK(b.sequences.dim() == 2 && b.sequences.size(1) >= 2 &&
                  b.sequences.sizes() == b.attention_mask.sizes(),
              req.op, ": expected sequences and attention_mask [N, T] with T >= 2, got ",
              b.sequences.sizes(), " and ", b.attention_mask.sizes());
  if (need_loss_mask) {
    b.loss_mask = req.tensor("loss_mask").to(device, torch::kFloat32);
    TORCH_CHECK(b.loss_mask.dim() == 2 && b.loss_mask.size(0) == b.rows() &&
                    b.loss_mask.size(1) == b.sequences.size(1) - 1,
                req.op, ": expected loss_mask [N, T-1] = [", b.rows(), ", ",
                b.sequences.size(1) - 1, "], got ", b.loss_mask.sizes());
  }
  return b;
}

// Rows [begin, end) of this rank when `rows` split evenly over the group in units of
// `unit` rows (2 for interleaved pairs, so a pair never straddles two ranks).
std::pair<int64_t, int64_t> share(int64_t rows, int64_t unit, const WorkerIdentity& self,
                                  const std::string& op) {
  if (rows % (unit * self.world_size) != 0)
    throw InputError(op + ": " + std::to_string(rows) + " rows do not split into units of " +
                     std::to_string(unit) + " over " + std::to_string(self.world_size) + " ranks");
  const int64_t per = rows / self.world_size;
  return {self.rank * per, (self.rank + 1) * per};
}

// Sums over response tokens of log pi(y_t | x, y_<t): [N] (FP32, with a graph when grad is on).
torch::Tensor response_log_prob_sums(models::CausalLM& model, const RowBatch& b) {
  torch::Tensor hidden = model.forward(b.sequences, b.attention_mask);
  torch::Tensor lp = model.next_token_log_probs(hidden, b.sequences);  // [N, T-1]
  return (lp * b.loss_mask).sum(1);
}

// Reward per row: the value head at each row's last attended token, [N] FP32.
torch::Tensor row_scores(models::CausalLM& model, const RowBatch& b) {
  return models::last_token_values(model.values(model.forward(b.sequences, b.attention_mask)),
                                   b.attention_mask)
      .to(torch::kFloat32);
}

// The rows this call works on: all of them (a scatter'd micro batch), or this rank's
// share (rank_share, for call_all on a trained, possibly ZeRO-3, group).
RowBatch requested_rows(const Message& req, const ops::RowSelection& selection,
                        const WorkerIdentity& self, bool need_loss_mask, torch::Device device) {
  RowBatch all = read_rows(req, need_loss_mask, device);
  if (!selection.rank_share) return all;
  auto [begin, end] = share(all.rows(), 1, self, req.op);
  return all.slice(begin, end);
}

// f(chunk) for chunks of `chunk` rows (0: all at once), concatenated.
template <typename F>
torch::Tensor by_chunks(const RowBatch& b, int64_t chunk, F f) {
  if (chunk <= 0) chunk = std::max<int64_t>(1, b.rows());
  std::vector<torch::Tensor> parts;
  for (int64_t s = 0; s < b.rows(); s += chunk)
    parts.push_back(f(b.slice(s, std::min(b.rows(), s + chunk))));
  return torch::cat(parts, 0);
}

// sequence_log_probs: sums over each row's response; args.reference: with the LoRA adapters
// off (a LoRA actor is its own reference, issue 30.2).
Message sequence_log_probs(ModelRole& role, const ops::SequenceLogProbs& op, const Message& req,
                           const WorkerIdentity& self) {
  torch::NoGradGuard no_grad;
  models::CausalLM& model = role.checked_model(req.op);
  if (op.reference && !model.has_adapters())
    throw RuntimeError(req.op + ": reference asked of a model without LoRA adapters");
  const models::AdaptersOff base_model(model, op.reference);
  RowBatch b = requested_rows(req, op.rows, self, true, role.device);
  Message reply = reply_message(ops::SequenceLogProbsReply{});
  reply.add("log_probs", by_chunks(b, op.rows.chunk, [&](const RowBatch& c) {
                           return response_log_prob_sums(model, c);
                         }).contiguous());
  reply.add("tokens", b.loss_mask.sum(1).contiguous());
  return reply;
}

Message sequence_scores(ModelRole& role, const ops::SequenceScores& op, const Message& req,
                        const WorkerIdentity& self) {
  torch::NoGradGuard no_grad;
  models::CausalLM& model = role.checked_model(req.op);
  RowBatch b = requested_rows(req, op.rows, self, false, role.device);
  Message reply = reply_message(ops::SequenceScoresReply{});
  reply.add("scores", by_chunks(b, op.rows.chunk, [&](const RowBatch& c) {
                        return row_scores(model, c);
                      }).contiguous());
  return reply;
}

// Means of named scalars over the micro batches of one step (this rank).
class MicroMeans {
 public:
  void add(const std::string& key, double v) {
    sums_[key] += v;
    counts_[key] += 1;
  }
  std::map<std::string, double> means() const {
    std::map<std::string, double> out;
    for (const auto& [k, s] : sums_) out[k] = s / static_cast<double>(counts_.at(k));
    return out;
  }

 private:
  std::map<std::string, double> sums_;
  std::map<std::string, int64_t> counts_;
};

// Runs one optimizer step over this rank's share of the global batch, in micro batches of
// micro_batch_size units (pairs for pair jobs: 2 rows each), loss_fn(rows, begin).
template <typename LossFn>
Message train_units(ModelRole& role, const Message& req, int64_t micro_batch_size,
                    const WorkerIdentity& self, int64_t unit, bool need_loss_mask, LossFn loss_fn) {
  if (!role.trainer) throw RuntimeError(req.op + ": this worker's role is not trained");
  RowBatch all = read_rows(req, need_loss_mask, role.device);
  auto [begin, end] = share(all.rows(), unit, self, req.op);
  const int64_t micro = micro_batch_size * unit;
  MicroMeans means;
  auto metrics = role.trainer->train_step([&](int64_t i) {
    const int64_t b0 = begin + i * micro, b1 = std::min(end, b0 + micro);
    TORCH_CHECK(b0 < b1, req.op, ": micro batch ", i, " is empty: this rank holds ", end - begin,
                " rows, fewer than grad_accum_steps x micro_batch_size");
    return loss_fn(all.slice(b0, b1), b0, means);
  });
  return reply_message(
      ops::OfflineStepReply{ops::step_figures(metrics), end - begin, means.means()});
}

// train_dpo: rows interleaved chosen/rejected; tensors ref_log_probs [N] (sums over the
// response, absent for simpo and orpo). SimPO and ORPO compare length-normalised averages
// (SimPO eq. 4; ORPO eq. 4).
Message train_dpo(ModelRole& role, const ops::TrainDpo& op, const Message& req,
                  const WorkerIdentity& self) {
  const dpo::DpoLossConfig& config = op.loss;
  const bool ref = dpo::needs_reference(config.type);
  TORCH_CHECK(!ref || req.has_tensor("ref_log_probs"), "train_dpo: the ",
              dpo::dpo_loss_name(config.type), " loss needs ref_log_probs [N]");
  return train_units(role, req, op.micro_batch_size, self, 2, true,
                     [&](const RowBatch& mb, int64_t b0, MicroMeans& means) {
                       torch::Tensor sums = response_log_prob_sums(*role.model, mb);  // [2P]
                       torch::Tensor tokens = mb.loss_mask.sum(1).clamp_min(1);       // [2P]
                       torch::Tensor logps =
                           dpo::uses_mean_log_probs(config.type) ? sums / tokens : sums;
                       dpo::PairLogProbs lp;
                       lp.chosen = logps.slice(0, 0, logps.size(0), 2);
                       lp.rejected = logps.slice(0, 1, logps.size(0), 2);
                       lp.chosen_tokens = tokens.slice(0, 0, tokens.size(0), 2);
                       if (ref) {
                         torch::Tensor r = req.tensor("ref_log_probs")
                                               .slice(0, b0, b0 + mb.rows())
                                               .to(role.device, torch::kFloat32);
                         lp.ref_chosen = r.slice(0, 0, r.size(0), 2);
                         lp.ref_rejected = r.slice(0, 1, r.size(0), 2);
                       }
                       dpo::DpoLossResult out = dpo::dpo_loss(config, lp);
                       means.add("accuracy", out.accuracy.item<double>());
                       means.add("chosen_reward", out.chosen_rewards.mean().item<double>());
                       means.add("rejected_reward", out.rejected_rewards.mean().item<double>());
                       means.add("margin", out.margin.item<double>());
                       means.add("chosen_log_prob", lp.chosen.detach().mean().item<double>());
                       means.add("rejected_log_prob", lp.rejected.detach().mean().item<double>());
                       return out.loss;
                     });
}

// Rows first, first + 2, ... of `b`: one side of interleaved rows.
RowBatch alternate_rows(const RowBatch& b, int64_t first) {
  auto pick = [&](const torch::Tensor& t) { return t.slice(0, first, b.rows(), 2).contiguous(); };
  return {pick(b.sequences), pick(b.attention_mask), pick(b.loss_mask)};
}

// KTO's reference point for this optimizer step, one value for the whole global batch:
// z0 = max(0, mean of log pi(y_j|x_i) - log pi_ref(y_j|x_i) over the KL rows of every micro
// batch of every rank) (dpo::kto_reference_point). OpenRLHF's KTOLoss all-reduces a micro
// batch's mean over ranks; averaging the global batch also keeps z0 from depending on
// micro_batch_size. The policy's side comes from a no-grad pass over this rank's KL rows in
// micro batches before the step changes any weight, so it is what the training pass would
// compute. Collective over the trained group.
torch::Tensor kto_global_reference_point(ModelRole& role, const Message& req,
                                         int64_t micro_batch_size, const WorkerIdentity& self) {
  if (!role.trainer || !role.group)
    throw RuntimeError(req.op + ": this worker's role is not trained");
  torch::NoGradGuard no_grad;
  RowBatch all = read_rows(req, true, role.device);
  auto [begin, end] = share(all.rows(), 2, self, req.op);
  RowBatch kl_rows = alternate_rows(all.slice(begin, end), 1);
  const int64_t micro = micro_batch_size;
  // [P] each: the policy's and the reference's log-probs of this rank's KL rows.
  torch::Tensor policy_kl = by_chunks(
      kl_rows, micro, [&](const RowBatch& c) { return response_log_prob_sums(*role.model, c); });
  torch::Tensor ref_kl = req.tensor("ref_log_probs").slice(0, begin + 1, end, 2);
  torch::Tensor kl = policy_kl.to(torch::kFloat64) - ref_kl.to(role.device, torch::kFloat64);
  // The sum and the count, in FP64: the mean does not depend on how rows split over ranks.
  torch::Tensor sum_count =
      torch::stack({kl.sum(), torch::full({}, static_cast<double>(kl.numel()), kl.options())});
  role.group->all_reduce(sum_count, transport::ReduceOp::kSum);
  return dpo::kto_reference_point(sum_count[0] / sum_count[1]);
}

// train_kto: rows interleaved (labelled row, mismatched KL row); tensors ref_log_probs [N]
// (sums over the response, same order) and desirable [N/2] (1 desirable, 0 undesirable).
// z0 is the global batch's (kto_global_reference_point); the micro batches then train on
// their labelled rows, the only ones with a gradient (z0 is detached).
Message train_kto(ModelRole& role, const ops::TrainKto& op, const Message& req,
                  const WorkerIdentity& self) {
  const dpo::KtoLossConfig& config = op.loss;
  TORCH_CHECK(req.has_tensor("ref_log_probs") && req.has_tensor("desirable"),
              "train_kto: needs ref_log_probs [N] and desirable [N/2]");
  const torch::Tensor z0 = kto_global_reference_point(role, req, op.micro_batch_size, self);
  return train_units(
      role, req, op.micro_batch_size, self, 2, true,
      [&](const RowBatch& mb, int64_t b0, MicroMeans& means) {
        dpo::KtoLogProbs lp;
        lp.policy = response_log_prob_sums(*role.model, alternate_rows(mb, 0));  // [P]
        const int64_t p = lp.policy.size(0);
        lp.ref = req.tensor("ref_log_probs")
                     .slice(0, b0, b0 + mb.rows(), 2)
                     .to(role.device, torch::kFloat32);
        lp.desirable = req.tensor("desirable").slice(0, b0 / 2, b0 / 2 + p).to(role.device).gt(0.5);
        lp.z0 = z0;
        dpo::KtoLossResult out = dpo::kto_loss(config, lp);
        means.add("kl", out.kl.item<double>());
        if (out.chosen_rewards.numel() > 0)
          means.add("chosen_reward", out.chosen_rewards.mean().item<double>());
        if (out.rejected_rewards.numel() > 0)
          means.add("rejected_reward", out.rejected_rewards.mean().item<double>());
        return out.loss;
      });
}

// train_sft: the mean NLL of the response tokens of each micro batch (dpo::sft_loss).
Message train_sft(ModelRole& role, const ops::TrainSft& op, const Message& req,
                  const WorkerIdentity& self) {
  return train_units(role, req, op.micro_batch_size, self, 1, true,
                     [&](const RowBatch& mb, int64_t, MicroMeans& means) {
                       torch::Tensor hidden = role.model->forward(mb.sequences, mb.attention_mask);
                       torch::Tensor lp =
                           role.model->next_token_log_probs(hidden, mb.sequences);  // [B, T-1]
                       means.add("tokens", mb.loss_mask.sum().item<double>());
                       return dpo::sft_loss(lp, mb.loss_mask);
                     });
}

// train_rm: rows interleaved chosen/rejected; optional tensor margin [N/2] per pair.
Message train_rm(ModelRole& role, const ops::TrainRm& op, const Message& req,
                 const WorkerIdentity& self) {
  const dpo::RmLossType type = op.loss;
  return train_units(
      role, req, op.micro_batch_size, self, 2, false,
      [&](const RowBatch& mb, int64_t b0, MicroMeans& means) {
        torch::Tensor scores = row_scores(*role.model, mb);  // [2P]
        torch::Tensor chosen = scores.slice(0, 0, scores.size(0), 2);
        torch::Tensor rejected = scores.slice(0, 1, scores.size(0), 2);
        torch::Tensor margin;
        if (req.has_tensor("margin"))
          margin = req.tensor("margin").slice(0, b0 / 2, b0 / 2 + chosen.size(0)).to(role.device);
        means.add("accuracy", (chosen > rejected).to(torch::kFloat32).mean().item<double>());
        means.add("chosen_reward", chosen.detach().mean().item<double>());
        means.add("rejected_reward", rejected.detach().mean().item<double>());
        means.add("margin", (chosen - rejected).detach().mean().item<double>());
        return dpo::rm_loss(type, chosen, rejected, margin);
      });
}

// Registers operation Op whose handler is f(role, op, request, self).
template <typename Op, typename F>
void add_role_operation(OperationRegistry& registry, const std::shared_ptr<ModelRole>& role, F f) {
  registry.add<Op>([role, f](const Op& op, const Message& req, const WorkerIdentity& self) {
    return f(*role, op, req, self);
  });
}

}  // namespace

void add_offline_operations(OperationRegistry& registry, std::shared_ptr<ModelRole> role) {
  add_role_operation<ops::SequenceLogProbs>(registry, role, sequence_log_probs);
  add_role_operation<ops::SequenceScores>(registry, role, sequence_scores);
  add_role_operation<ops::TrainDpo>(registry, role, train_dpo);
  add_role_operation<ops::TrainKto>(registry, role, train_kto);
  add_role_operation<ops::TrainSft>(registry, role, train_sft);
  add_role_operation<ops::TrainRm>(registry, role, train_rm);
}

}  // namespace rlhf
