// Held-out evaluation (data.eval_dataset): every held-out prompt once, greedy (and
// eval.n_samples sampled), scored by the job's reward sources; accuracy is the accuracy
// source at its full score. Writes an eval record and a console line.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>

#include "core/timing.h"
#include "ppo/phases.h"
#include "report/metrics.h"
#include "runtime/job_runtime.h"
#include "scheduler/progress.h"
#include "scheduler/role_group.h"

namespace rlhf::ppo::job {

using nlohmann::json;
using runtime::fixed;

Evaluator::Evaluator(EvalSettings settings, std::vector<TokenizedPrompt> prompts,
                     ExperienceMaker& maker, const std::vector<std::string>& source_names,
                     RoleGroup* reward, PhaseProgress& progress)
    : s_(std::move(settings)),
      prompts_(std::move(prompts)),
      maker_(maker),
      names_(source_names),
      reward_(reward),
      progress_(progress) {}

bool Evaluator::due(int64_t step, int64_t total_steps) const {
  return !prompts_.empty() && ((s_.steps > 0 && step % s_.steps == 0) || step == total_steps);
}

Rollout Evaluator::rollout(const PromptBatch& batch, double temperature, int64_t n) {
  Rollout r = maker_.generate_with(batch, temperature, n, s_.seed * 7919 + 104729);
  torch::Tensor model_scores;
  if (reward_)
    model_scores =
        reward_
            ->scatter(ops::Score{{s_.max_tokens_per_micro_batch, s_.micro_batch_size * n}},
                      sequence_tensors(r), s_.micro_batch_size * n, s_.reward_dispatch)
            .tensor("scores");
  maker_.score_rewards(r, model_scores);
  return r;
}

bool Evaluator::evaluated_at(int64_t step) const {
  std::ifstream in(std::filesystem::path(s_.run_dir) / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const json rec = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (rec.is_object() && rec.value("split", "") == "eval" &&
        rec.value("step", int64_t{-1}) == step)
      return true;
  }
  return false;
}

void Evaluator::evaluate(int64_t step, report::MetricsSink& metrics, std::ostream& out) {
  const auto t0 = Clock::now();
  const int64_t count = static_cast<int64_t>(prompts_.size());
  progress_.begin("evaluating " + std::to_string(count) + " held-out prompts");
  // Every held-out prompt once, in one left-padded batch, scattered micro batch by micro batch.
  PromptStream stream(prompts_, s_.pad_id, s_.seed);
  const PromptBatch batch = stream.next(count);
  // Correct: the accuracy source (eval.accuracy_source, else the first) at its full score.
  const auto& names = names_;
  const int64_t source =
      s_.accuracy_source.empty()
          ? 0
          : std::find(names.begin(), names.end(), s_.accuracy_source) - names.begin();
  auto correct = [&](const Rollout& r) { return (r.source_scores[source] >= 1.0 - 1e-9); };
  const Rollout greedy = rollout(batch, 0.0, 1);
  json rec = {
      {"step", step},
      {"split", "eval"},
      {"prompts", count},
      {"reward", greedy.scores.mean().item<double>()},
      {"sources", source_means(greedy.source_scores, names)},
      {"response_length", greedy.action_mask.sum(1).to(torch::kFloat64).mean().item<double>()}};
  // Pure distillation (a teacher, no reward source) has no accuracy to report.
  const bool scored = !names.empty();
  if (scored) {
    const auto right = correct(greedy);
    rec["accuracy"] = right.to(torch::kFloat64).mean().item<double>();
    rec["correct"] = right.sum().item<int64_t>();
  }
  if (!greedy.judges.is_null()) rec["judge"] = greedy.judges;
  if (s_.teacher)  // the held-out replies' reverse KL to the teacher (on-policy distillation)
    rec["distill"] = {{"reverse_kl", maker_.teacher_reverse_kl(greedy)}};
  if (greedy.turns.defined()) {  // multi-turn: how the held-out trajectories used the tools
    rec["turns_mean"] = greedy.turns.to(torch::kFloat64).mean().item<double>();
    rec["tool_call_rate"] = (greedy.tool_calls > 0).to(torch::kFloat64).mean().item<double>();
    rec["tool_errors"] = greedy.tool_errors.sum().item<int64_t>();
  }
  if (s_.n_samples > 0 && scored) {
    const Rollout sampled = rollout(batch, s_.temperature, s_.n_samples);
    const auto ok = correct(sampled).to(torch::kFloat64).reshape({count, s_.n_samples});
    rec["accuracy_sampled"] = ok.mean().item<double>();  // mean over samples
    rec["pass_at_n"] = (ok.amax(1) > 0).to(torch::kFloat64).mean().item<double>();
  }
  rec["time_s"] = seconds_since(t0);
  metrics.write(rec);
  json rows = json::array();
  for (int64_t i = 0; i < std::min<int64_t>(count, s_.logged_samples); ++i)
    rows.push_back({{"split", "eval"},
                    {"prompt", greedy.prompts[static_cast<size_t>(i)]},
                    {"response", greedy.responses[static_cast<size_t>(i)]},
                    {"label", greedy.labels[static_cast<size_t>(i)]},
                    {"reward", greedy.scores[i].item<double>()}});
  if (!rows.empty()) metrics.samples(step, rows);
  progress_.end();
  out << "eval after step " << step
      << (scored ? " | accuracy " + fixed(rec["accuracy"]) + " (" +
                       std::to_string(rec["correct"].get<int64_t>()) + "/" + std::to_string(count) +
                       ")"
                 : std::string())
      << (rec.contains("distill") ? " | reverse kl " + fixed(rec["distill"]["reverse_kl"], 4)
                                  : std::string())
      << (rec.contains("accuracy_sampled")
              ? " | sampled " + fixed(rec["accuracy_sampled"]) + ", pass@" +
                    std::to_string(s_.n_samples) + " " + fixed(rec["pass_at_n"])
              : std::string())
      << (rec.contains("tool_call_rate") ? " | tool calls " + fixed(rec["tool_call_rate"]) : "")
      << " | reward " << fixed(rec["reward"]) << " | len " << fixed(rec["response_length"], 1)
      << " | " << fixed(rec["time_s"], 1) << " s" << std::endl;
}

}  // namespace rlhf::ppo::job
