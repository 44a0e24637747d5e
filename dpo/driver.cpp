#include "dpo/driver.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>

#include "core/errors.h"
#include "core/timing.h"
#include "dpo/losses.h"
#include "dpo/offline_job.h"
#include "dpo/ref_cache.h"
#include "scheduler/role_group.h"
#include "scheduler/scheduler.h"

namespace rlhf::dpo {

namespace fs = std::filesystem;
using nlohmann::json;
using runtime::fixed;

namespace {

double num(const json& j, const char* key) {
  return j.contains(key) && j[key].is_number() ? j[key].get<double>() : 0.0;
}

// Interleaved rows [2P] -> (chosen [P], rejected [P]).
std::pair<torch::Tensor, torch::Tensor> split_pairs(const torch::Tensor& rows) {
  return {rows.slice(0, 0, rows.size(0), 2), rows.slice(0, 1, rows.size(0), 2)};
}

RowLayout dpo_layout(const JobSpec& spec) {
  return parse_dpo_loss(spec.get_string("algo.dpo.loss")) == DpoLossType::kKto
             ? RowLayout::kUnpairedWithKl
             : RowLayout::kPairs;
}

// DPO family: the actor trains on pairs (for kto: a labelled row and its mismatched KL
// row); the reference group's log-probs of every row (training and held-out) are computed
// once and cached under <run_dir>/ref_cache.
class DpoJob : public OfflineJob {
 public:
  DpoJob(const JobSpec& spec, OfflineDriverOptions options)
      : OfflineJob(spec, options, Role::kActor, dpo_layout(spec)) {
    config_.type = parse_dpo_loss(spec.get_string("algo.dpo.loss"));
    kto_.beta = spec.get_float("algo.dpo.beta");
    kto_.desirable_weight = spec.get_float("algo.dpo.kto_desirable_weight");
    kto_.undesirable_weight = spec.get_float("algo.dpo.kto_undesirable_weight");
    config_.beta = spec.get_float("algo.dpo.beta");
    config_.label_smoothing = spec.get_float("algo.dpo.label_smoothing");
    config_.simpo_gamma = spec.get_float("algo.dpo.simpo_gamma");
    config_.orpo_lambda = spec.get_float("algo.dpo.orpo_lambda");
    config_.nll_loss_coef = spec.get_float("algo.dpo.nll_loss_coef");
    // A LoRA actor on the reference's model is its own reference: no ref workers (issue 30.2;
    // core/spec_rules.cpp used_roles).
    ref_from_actor_ = needs_reference(config_.type) && !spec.uses(Role::kRef);
  }

 protected:
  void prepare(Scheduler& s, std::ostream& out) override {
    if (!needs_reference(config_.type)) return;
    ref_train_ = reference_log_probs(s, train_data(), "train", out);
    if (!eval_data().empty()) ref_eval_ = reference_log_probs(s, eval_data(), "eval", out);
  }

  bool kto() const { return config_.type == DpoLossType::kKto; }
  std::vector<Answered<ops::OfflineStepReply>> train_call(
      RoleGroup& group, int64_t micro_batch_size,
      const std::vector<NamedTensor>& tensors) const override {
    if (kto()) return group.call_all(ops::TrainKto{micro_batch_size, kto_}, tensors);
    return group.call_all(ops::TrainDpo{micro_batch_size, config_}, tensors);
  }

  void add_step_tensors(const std::vector<int64_t>& index,
                        std::vector<NamedTensor>& tensors) const override {
    if (!needs_reference(config_.type)) return;
    std::vector<int64_t> rows;
    for (int64_t i : index) rows.insert(rows.end(), {2 * i, 2 * i + 1});
    tensors.push_back({"ref_log_probs",
                       ref_train_.index_select(0, torch::tensor(rows, torch::kLong)).contiguous()});
    if (kto()) tensors.push_back({"desirable", desirable(train_data(), index)});
  }

  // Held-out KTO: z0 over all held-out KL rows; rewards beta * log-ratio by label.
  json evaluate_kto(Scheduler& s) {
    RowTensors rows = rows_of(eval_data());
    auto [policy, policy_kl] = split_pairs(gather_log_probs(s, rows));
    KtoLogProbs lp;
    lp.policy = policy;
    lp.policy_kl = policy_kl;
    std::tie(lp.ref, lp.ref_kl) = split_pairs(ref_eval_);
    lp.desirable = desirable(eval_data(), {}).gt(0.5);
    KtoLossResult r = kto_loss(kto_, lp);
    auto mean_or_0 = [](const torch::Tensor& t) {
      return t.numel() > 0 ? t.mean().item<double>() : 0.0;
    };
    const double c = mean_or_0(r.chosen_rewards), u = mean_or_0(r.rejected_rewards);
    return {{"eval_loss", r.loss.item<double>()},
            {"eval_kl", r.kl.item<double>()},
            {"eval_chosen_reward", c},
            {"eval_rejected_reward", u},
            {"eval_margin", c - u}};
  }

  // Preference accuracy of the implicit rewards on held-out pairs, and the loss there.
  json evaluate(Scheduler& s) override {
    if (kto()) return evaluate_kto(s);
    RowTensors rows = rows_of(eval_data());
    torch::Tensor sums = gather_log_probs(s, rows);
    torch::Tensor tokens = rows.loss_mask.sum(1).clamp_min(1);
    PairLogProbs lp;
    std::tie(lp.chosen, lp.rejected) =
        split_pairs(uses_mean_log_probs(config_.type) ? sums / tokens : sums);
    lp.chosen_tokens = split_pairs(tokens).first;
    if (needs_reference(config_.type))
      std::tie(lp.ref_chosen, lp.ref_rejected) = split_pairs(ref_eval_);
    DpoLossResult r = dpo_loss(config_, lp);
    return {{"eval_loss", r.loss.item<double>()},
            {"eval_accuracy", r.accuracy.item<double>()},
            {"eval_chosen_reward", r.chosen_rewards.mean().item<double>()},
            {"eval_rejected_reward", r.rejected_rewards.mean().item<double>()},
            {"eval_margin", r.margin.item<double>()}};
  }

  std::string step_line(const json& rec) const override {
    if (kto())
      return "loss " + fixed(num(rec, "loss")) + " | kl " + fixed(num(rec, "kl")) +
             " | reward desirable " + fixed(num(rec, "chosen_reward")) + " undesirable " +
             fixed(num(rec, "rejected_reward"));
    return "loss " + fixed(num(rec, "loss")) + " | acc " + fixed(num(rec, "accuracy"), 2) +
           " | reward chosen " + fixed(num(rec, "chosen_reward")) + " rejected " +
           fixed(num(rec, "rejected_reward")) + " margin " + fixed(num(rec, "margin"));
  }
  std::string eval_line(const json& f) const override {
    if (kto())
      return "loss " + fixed(num(f, "eval_loss")) + ", kl " + fixed(num(f, "eval_kl")) +
             ", reward margin desirable - undesirable " + fixed(num(f, "eval_margin"));
    return "preference accuracy " + fixed(num(f, "eval_accuracy")) + ", loss " +
           fixed(num(f, "eval_loss")) + ", margin " + fixed(num(f, "eval_margin"));
  }

 private:
  // log pi_ref summed over each row's response [2P] of `data`: from the cache when this
  // exact data and reference model were seen before, else from the reference group (then
  // cached). Rows are built kChunkPairs pairs at a time (padded per chunk: with right
  // padding and causal attention a row's sum does not depend on it), never all at once.
  torch::Tensor reference_log_probs(Scheduler& s, const std::vector<TokenizedExample>& data,
                                    const char* split, std::ostream& out) {
    constexpr int64_t kChunkPairs = 1024;
    const int64_t pairs = static_cast<int64_t>(data.size());
    auto chunk = [&](int64_t begin) {
      std::vector<int64_t> index;
      for (int64_t i = begin; i < std::min(pairs, begin + kChunkPairs); ++i) index.push_back(i);
      return rows_of(data, index);
    };
    const std::string& ref_model = settings().ref_model;
    RowsKey hasher;
    for (int64_t b = 0; b < pairs; b += kChunkPairs) hasher.add(chunk(b));
    const std::string key = hasher.hex(
        model_identity(ref_model, ref_from_actor_ ? settings().actor_dtype : settings().ref_dtype));
    RefLogProbCache cache((fs::path(run_dir()) / "ref_cache").string());
    const auto t0 = std::chrono::steady_clock::now();
    if (auto hit = cache.find(key, 2 * pairs)) {
      out << "dpo: reference log-probs of " << pairs << " " << split << " pairs loaded from "
          << cache.file(key) << " in " << fixed(seconds_since(t0), 4) << " s" << std::endl;
      return *hit;
    }
    s.progress().begin("reference log-probs of " + std::to_string(pairs) + " " + split + " pairs");
    std::vector<torch::Tensor> parts;
    for (int64_t b = 0; b < pairs; b += kChunkPairs) {
      RowTensors rows = chunk(b);
      torch::Tensor lp = chunk_reference_log_probs(s, rows);
      TORCH_CHECK(lp.dim() == 1 && lp.size(0) == rows.rows(), "dpo: the reference returned ",
                  lp.sizes(), " log-probs for ", rows.rows(), " rows");
      parts.push_back(lp);
    }
    torch::Tensor lp = torch::cat(parts, 0).contiguous();
    s.progress().end();
    const double seconds = seconds_since(t0);
    const std::string file =
        cache.store(key, lp,
                    {{"split", split},
                     {"dataset", std::string(split) == "train" ? settings().train_data.source
                                                               : settings().eval_data.source},
                     {"ref_model", ref_model}});
    out << "dpo: reference log-probs of " << pairs << " " << split << " pairs computed on the "
        << (ref_from_actor_ ? "actor group (LoRA adapters off)" : "ref group") << " in "
        << fixed(seconds, 2) << " s, cached in " << file << std::endl;
    return lp;
  }

  // log pi_ref of `rows` [N]: from the ref group, or from the actor's own workers with the
  // adapters off (each rank its share: the actor may be ZeRO-3).
  torch::Tensor chunk_reference_log_probs(Scheduler& s, const RowTensors& rows) {
    if (ref_from_actor_) return gather_log_probs(s, rows, true).to(torch::kFloat32);
    Message reply =
        s.group(Role::kRef)
            .scatter(ops::SequenceLogProbs{},
                     {{"sequences", rows.sequences},
                      {"attention_mask", rows.attention_mask},
                      {"loss_mask", rows.loss_mask}},
                     2 * settings().micro_batch_size, settings().dispatch.at(Role::kRef));
    return reply.tensor("log_probs").to(torch::kFloat32);
  }

  // [P] float 1/0: the labels of `data`'s examples `index` (all when empty).
  static torch::Tensor desirable(const std::vector<TokenizedExample>& data,
                                 const std::vector<int64_t>& index) {
    std::vector<float> d;
    if (index.empty())
      for (const auto& e : data) d.push_back(e.desirable ? 1.0f : 0.0f);
    for (int64_t i : index) d.push_back(data[static_cast<size_t>(i)].desirable ? 1.0f : 0.0f);
    return torch::tensor(d);
  }

  DpoLossConfig config_;
  KtoLossConfig kto_;            // used when config_.type is kto
  torch::Tensor ref_train_;      // [2N] log pi_ref summed over each training row's response
  torch::Tensor ref_eval_;       // [2M] the same for the held-out pairs
  bool ref_from_actor_ = false;  // the LoRA actor with its adapters off is the reference
};

// SFT: next-token loss on the response tokens (padded or packed rows).
class SftJob : public OfflineJob {
 public:
  SftJob(const JobSpec& spec, OfflineDriverOptions options)
      : OfflineJob(spec, options, Role::kActor, RowLayout::kSingle) {}

 protected:
  std::vector<Answered<ops::OfflineStepReply>> train_call(
      RoleGroup& group, int64_t micro_batch_size,
      const std::vector<NamedTensor>& tensors) const override {
    return group.call_all(ops::TrainSft{micro_batch_size}, tensors);
  }

  // Mean NLL per response token on the held-out examples, and its perplexity.
  json evaluate(Scheduler& s) override {
    RowTensors rows = rows_of(eval_data());
    torch::Tensor sums = gather_log_probs(s, rows);
    const double loss = -(sums.sum() / rows.loss_mask.sum().clamp_min(1)).item<double>();
    return {{"eval_loss", loss}, {"eval_perplexity", std::exp(loss)}};
  }
  std::string step_line(const json& rec) const override {
    return "loss " + fixed(num(rec, "loss")) + " | grad norm " + fixed(num(rec, "grad_norm"));
  }
  std::string eval_line(const json& f) const override {
    return "loss " + fixed(num(f, "eval_loss")) + " per response token, perplexity " +
           fixed(num(f, "eval_perplexity"), 2);
  }
};

// Reward model: pairwise loss on the value head's score at each sequence's last token.
class RmJob : public OfflineJob {
 public:
  RmJob(const JobSpec& spec, OfflineDriverOptions options)
      : OfflineJob(spec, options, Role::kReward, RowLayout::kPairs) {
    type_ = parse_rm_loss(spec.get_string("algo.rm.loss"));
    use_margin_ = !spec.get_string("data.margin_key").empty();
  }

 protected:
  std::vector<Answered<ops::OfflineStepReply>> train_call(
      RoleGroup& group, int64_t micro_batch_size,
      const std::vector<NamedTensor>& tensors) const override {
    return group.call_all(ops::TrainRm{micro_batch_size, type_}, tensors);
  }

  void add_step_tensors(const std::vector<int64_t>& index,
                        std::vector<NamedTensor>& tensors) const override {
    if (!use_margin_) return;
    std::vector<float> m;
    for (int64_t i : index)
      m.push_back(static_cast<float>(train_data()[static_cast<size_t>(i)].margin));
    tensors.push_back({"margin", torch::tensor(m)});
  }

  json evaluate(Scheduler& s) override {
    auto [chosen, rejected] = split_pairs(gather_scores(s, rows_of(eval_data())));
    torch::Tensor margin;
    if (use_margin_) {
      std::vector<float> m;
      for (const auto& e : eval_data()) m.push_back(static_cast<float>(e.margin));
      margin = torch::tensor(m);
    }
    return {{"eval_loss", rm_loss(type_, chosen, rejected, margin).item<double>()},
            {"eval_accuracy", (chosen > rejected).to(torch::kFloat32).mean().item<double>()},
            {"eval_chosen_reward", chosen.mean().item<double>()},
            {"eval_rejected_reward", rejected.mean().item<double>()},
            {"eval_margin", (chosen - rejected).mean().item<double>()}};
  }
  std::string step_line(const json& rec) const override {
    return "loss " + fixed(num(rec, "loss")) + " | acc " + fixed(num(rec, "accuracy"), 2) +
           " | reward chosen " + fixed(num(rec, "chosen_reward")) + " rejected " +
           fixed(num(rec, "rejected_reward"));
  }
  std::string eval_line(const json& f) const override {
    return "preference accuracy " + fixed(num(f, "eval_accuracy")) + ", loss " +
           fixed(num(f, "eval_loss")) + ", margin " + fixed(num(f, "eval_margin"));
  }

 private:
  RmLossType type_ = RmLossType::kSigmoid;
  bool use_margin_ = false;  // data.margin_key: a per-pair margin in the sigmoid loss
};

}  // namespace

JobDriver offline_driver(const JobSpec& spec, OfflineDriverOptions options) {
  std::shared_ptr<OfflineJob> job;
  switch (spec.kind()) {
    case JobKind::kDpo:
      job = std::make_shared<DpoJob>(spec, options);
      break;
    case JobKind::kSft:
      job = std::make_shared<SftJob>(spec, options);
      break;
    case JobKind::kRm:
      job = std::make_shared<RmJob>(spec, options);
      break;
    default:
      throw InputError(std::string("offline_driver: not an offline job kind: ") +
                       job_kind_name(spec.kind()));
  }
  return [job](Scheduler& scheduler, std::ostream& out) { job->run(scheduler, out); };
}

}  // namespace rlhf::dpo
