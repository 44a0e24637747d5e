// A step's samples (ExperienceMaker::sample): the prompt stream's next batch generated, or
// DAPO's dynamic sampling over a batch and its refills; with rollout.streaming the filter
// runs on each prompt group as the rollout sends it back, and only the groups it keeps go on
// to the scorers while the rollout still generates. GKD's dataset steps (algo.distill.gkd
// .lambda < 1) take the batch's dataset responses instead of generating.
#include <algorithm>
#include <random>
#include <vector>

#include "core/errors.h"
#include "core/timing.h"
#include "ppo/phases.h"
#include "ppo/reward_shaping.h"

namespace rlhf::ppo::job {

namespace {

std::vector<int64_t> to_vector(const torch::Tensor& t) {
  const auto c = t.to(torch::kLong).contiguous();
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

}  // namespace

Rollout ExperienceMaker::sample(int64_t step) {
  const auto start = Clock::now();
  Rollout out = sample_groups(step);
  out.consumed = stream_.consumed();
  out.generate_s = seconds_since(start);
  return out;
}

bool ExperienceMaker::on_policy_step(int64_t step) const {
  if (s_.gkd_lambda >= 1.0) return true;
  std::mt19937_64 rng(s_.seed * 1000003ull + static_cast<uint64_t>(step));
  return std::uniform_real_distribution<double>(0.0, 1.0)(rng) < s_.gkd_lambda;
}

Rollout ExperienceMaker::dataset_rollout(const PromptBatch& batch) const {
  const int64_t prompts = batch.prompt_ids.size(0), n = s_.n_samples_per_prompt;
  size_t longest = 1;
  for (const auto& ids : batch.response_ids) longest = std::max(longest, ids.size());
  const auto a = static_cast<int64_t>(longest);
  torch::Tensor response = torch::full({prompts, a}, s_.pad_id, torch::kLong);
  torch::Tensor mask = torch::zeros({prompts, a}, torch::kLong);
  for (int64_t i = 0; i < prompts; ++i) {
    const auto& ids = batch.response_ids[static_cast<size_t>(i)];
    if (ids.empty()) throw RuntimeError("GKD dataset step: a prompt without its response");
    const auto len = static_cast<int64_t>(ids.size());
    response[i].narrow(0, 0, len).copy_(torch::tensor(ids, torch::kLong));
    mask[i].narrow(0, 0, len).fill_(1);
  }
  const torch::Tensor rows = torch::arange(prompts, torch::kLong).repeat_interleave(n);
  Rollout r;
  r.from_dataset = true;
  r.sequences = torch::cat({batch.prompt_ids, response}, 1).index_select(0, rows).contiguous();
  r.attention_mask = torch::cat({batch.prompt_mask, mask}, 1).index_select(0, rows).contiguous();
  r.action_mask = mask.index_select(0, rows).contiguous();
  r.behaviour_log_probs = torch::zeros({prompts * n, a}, torch::kFloat32);  // set when scored
  r.token_versions = torch::zeros({prompts * n, a}, torch::kLong);
  std::vector<int64_t> prompt_of_row;
  for (int64_t i = 0; i < prompts * n; ++i) prompt_of_row.push_back(i / n);
  add_texts(r, batch, prompt_of_row);
  return r;
}

Rollout ExperienceMaker::sample_groups(int64_t step) {
  if (!on_policy_step(step)) return dataset_rollout(stream_.next(s_.batch_size));
  if (!s_.dynamic_sampling) return generate(stream_.next(s_.batch_size), step);
  if (s_.streaming) return sample_streamed_groups(step);
  return filter_groups(
      [&](int64_t refill) { return generate(stream_.next(s_.batch_size), step, refill); });
}

// DAPO dynamic sampling (algo.dynamic_sampling): groups whose samples all score the same are
// dropped (groups_with_distinct_scores); up to rollout.max_refill_batches more batches of
// rollout.batch_size prompts are generated until rollout.batch_size groups are kept, and
// extra kept groups are left out (as veRL's DAPO). If none is kept, the first batch is
// trained as it is: its group advantages are all 0.
Rollout ExperienceMaker::filter_groups(const std::function<Rollout(int64_t refill)>& draw) {
  const int64_t n = s_.n_samples_per_prompt, want = s_.batch_size;
  auto keep = [&](Rollout batch) {
    score_rewards(batch);
    return select_rows(batch, group_rows(groups_with_distinct_scores(batch.scores, n), n));
  };
  Rollout first = draw(0);
  score_rewards(first);
  Rollout kept = keep(first);
  double compute_s = first.compute_s;  // every generate call is on the step's critical path
  int64_t refills = 0;
  while (kept.sequences.size(0) < want * n && refills < s_.max_refill_batches) {
    ++refills;
    Rollout more = keep(draw(refills));
    compute_s += more.compute_s;
    kept = kept.sequences.size(0) == 0 ? more : concat_rollouts(kept, more, s_.pad_id);
  }
  const int64_t kept_groups = kept.sequences.size(0) / n;
  Rollout out = kept_groups == 0 ? first : kept;
  if (kept_groups > want) out = select_rows(out, torch::arange(want * n, torch::kLong));
  out.compute_s = compute_s;
  out.sampling = {{"groups_generated", want * (refills + 1)},
                  {"groups_kept", std::min(kept_groups, want)},
                  {"refill_batches", refills}};
  return out;
}

// Dynamic sampling on groups as they arrive (issue 42.1). Each streamed group is scored by
// the reward sources on arrival (dynamic sampling has no reward model) and its scores kept
// for the batch, so filter_groups decides on the same numbers without scoring again; a group
// with distinct scores goes to the early scorers at once, a dropped one costs no scoring.
// The step's batches share one StreamScorer: batch b's group g is slot b * want + g, so the
// kept groups in slot order are filter_groups' order (batch by batch, groups ascending) and
// its first `want` are the rows it keeps. Samples and decisions equal the unstreamed run's.
Rollout ExperienceMaker::sample_streamed_groups(int64_t step) {
  const int64_t n = s_.n_samples_per_prompt, want = s_.batch_size;
  StreamScorer early(early_calls(), want * (s_.max_refill_batches + 1) * n);
  std::vector<int64_t> streamed;  // slots sent to the scorers
  auto draw = [&](int64_t refill) {
    const PromptBatch batch = stream_.next(want);
    torch::Tensor scores = torch::zeros({want * n});
    torch::Tensor sources;  // [S, want * n]
    const GroupSink sink = [&](const torch::Tensor& prompts, const Message& part) {
      Rollout piece;
      piece.sequences = part.tensor("sequences").to(torch::kLong).contiguous();
      piece.attention_mask = part.tensor("attention_mask").to(torch::kLong).contiguous();
      piece.action_mask = part.tensor("action_mask").to(torch::kLong).contiguous();
      std::vector<int64_t> prompt_of_row;
      for (int64_t p : to_vector(prompts)) prompt_of_row.insert(prompt_of_row.end(), n, p);
      add_texts(piece, batch, prompt_of_row);
      score_rewards(piece);
      const torch::Tensor rows = group_rows(prompts, n);
      scores.index_copy_(0, rows, piece.scores);
      if (!sources.defined()) sources = torch::zeros({piece.source_scores.size(0), want * n});
      sources.index_copy_(1, rows, piece.source_scores);
      const torch::Tensor groups = groups_with_distinct_scores(piece.scores, n);
      if (groups.numel() == 0) return;
      const torch::Tensor slots = prompts.index_select(0, groups) + refill * want;
      const torch::Tensor kept = group_rows(groups, n);
      early.add(group_rows(slots, n), part_tensors(part, kept));
      for (int64_t s : to_vector(slots)) streamed.push_back(s);
    };
    Rollout r = generate_with(batch, s_.temperature, n, sample_seed(step, refill),
                              /*training=*/true, sink);
    r.scores = scores;
    r.source_scores = sources;
    return r;
  };
  Rollout out = filter_groups(draw);
  double early_s = 0;
  const std::map<Role, Message> replies = early.finish(early_s);
  out.sampling["groups_scored_early"] = static_cast<int64_t>(streamed.size());
  const int64_t kept = out.sampling["groups_kept"].get<int64_t>();
  if (kept == 0) return out;  // the first batch as it came: scored at the step
  std::sort(streamed.begin(), streamed.end());
  TORCH_CHECK(static_cast<int64_t>(streamed.size()) >= kept, "dynamic sampling: ", kept,
              " groups kept but ", streamed.size(), " streamed to the scorers");
  streamed.resize(static_cast<size_t>(kept));
  const torch::Tensor rows = group_rows(torch::tensor(streamed, torch::kLong), n);
  for (const auto& [role, reply] : replies) {
    Message& m = out.early[role];
    for (const NamedTensor& t : reply.tensors) m.add(t.name, t.tensor.index_select(0, rows));
  }
  out.early_compute_s = early_s;
  return out;
}

}  // namespace rlhf::ppo::job
