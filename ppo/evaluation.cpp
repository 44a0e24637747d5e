// Held-out evaluation (data.eval_dataset): every held-out prompt once, greedy (and
// eval.n_samples sampled), scored by the job's reward sources; accuracy is the accuracy
// source at its full score. Writes an eval record and a console line.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>

#include "ppo/ppo_job.h"
#include "report/metrics.h"
#include "rewards/reward_sources.h"
#include "scheduler/role_group.h"
#include "scheduler/scheduler.h"

namespace rlhf::ppo::job {

using nlohmann::json;

Rollout PpoJob::eval_rollout(Scheduler& s, const PromptBatch& batch, double temperature,
                             int64_t n) {
  Rollout r = generate_with(s, batch, temperature, n, c_.seed * 7919 + 104729);
  torch::Tensor model_scores;
  if (has_reward_model_)
    model_scores =
        s.group(Role::kReward)
            .scatter(ops::Score{{c_.max_tokens_per_micro_batch, c_.rollout_micro_batch_size * n}},
                     sequence_tensors(r), c_.rollout_micro_batch_size * n,
                     settings_.dispatch.at(Role::kReward))
            .tensor("scores");
  score_rewards(r, model_scores);
  return r;
}

bool PpoJob::evaluated_at(int64_t step) const {
  std::ifstream in(std::filesystem::path(run_dir_) / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const json rec = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (rec.is_object() && rec.value("split", "") == "eval" &&
        rec.value("step", int64_t{-1}) == step)
      return true;
  }
  return false;
}

void PpoJob::evaluate(Scheduler& s, int64_t step, MetricsSink& metrics, std::ostream& out) {
  const auto t0 = Clock::now();
  const int64_t count = static_cast<int64_t>(eval_prompts_.size());
  s.progress().begin("evaluating " + std::to_string(count) + " held-out prompts");
  // Every held-out prompt once, in one left-padded batch, scattered micro batch by micro batch.
  PromptStream stream(eval_prompts_, pad_id_, c_.seed);
  const PromptBatch batch = stream.next(count);
  // Correct: the accuracy source (eval.accuracy_source, else the first) at its full score.
  const auto& names = rewards_->names();
  const int64_t source =
      eval_accuracy_source_.empty()
          ? 0
          : std::find(names.begin(), names.end(), eval_accuracy_source_) - names.begin();
  auto correct = [&](const Rollout& r) { return (r.source_scores[source] >= 1.0 - 1e-9); };
  const Rollout greedy = eval_rollout(s, batch, 0.0, 1);
  const auto right = correct(greedy);
  json rec = {
      {"step", step},
      {"split", "eval"},
      {"prompts", count},
      {"accuracy", right.to(torch::kFloat64).mean().item<double>()},
      {"correct", right.sum().item<int64_t>()},
      {"reward", greedy.scores.mean().item<double>()},
      {"sources", source_means(greedy.source_scores, names)},
      {"response_length", greedy.action_mask.sum(1).to(torch::kFloat64).mean().item<double>()}};
  if (greedy.turns.defined()) {  // multi-turn: how the held-out trajectories used the tools
    rec["turns_mean"] = greedy.turns.to(torch::kFloat64).mean().item<double>();
    rec["tool_call_rate"] = (greedy.tool_calls > 0).to(torch::kFloat64).mean().item<double>();
    rec["tool_errors"] = greedy.tool_errors.sum().item<int64_t>();
  }
  if (eval_samples_ > 0) {
    const Rollout sampled = eval_rollout(s, batch, c_.temperature, eval_samples_);
    const auto ok = correct(sampled).to(torch::kFloat64).reshape({count, eval_samples_});
    rec["accuracy_sampled"] = ok.mean().item<double>();  // mean over samples
    rec["pass_at_n"] = (ok.amax(1) > 0).to(torch::kFloat64).mean().item<double>();
  }
  rec["time_s"] = seconds_since(t0);
  metrics.write(rec);
  json rows = json::array();
  for (int64_t i = 0; i < std::min<int64_t>(count, settings_.logged_samples); ++i)
    rows.push_back({{"split", "eval"},
                    {"prompt", greedy.prompts[static_cast<size_t>(i)]},
                    {"response", greedy.responses[static_cast<size_t>(i)]},
                    {"label", greedy.labels[static_cast<size_t>(i)]},
                    {"reward", greedy.scores[i].item<double>()}});
  if (!rows.empty()) metrics.samples(step, rows);
  s.progress().end();
  out << "eval after step " << step << " | accuracy " << fmt(rec["accuracy"]) << " ("
      << rec["correct"].get<int64_t>() << "/" << count << ")"
      << (eval_samples_ > 0 ? " | sampled " + fmt(rec["accuracy_sampled"]) + ", pass@" +
                                  std::to_string(eval_samples_) + " " + fmt(rec["pass_at_n"])
                            : std::string())
      << (rec.contains("tool_call_rate") ? " | tool calls " + fmt(rec["tool_call_rate"]) : "")
      << " | reward " << fmt(rec["reward"]) << " | len " << fmt(rec["response_length"], 1) << " | "
      << fmt(rec["time_s"], 1) << " s" << std::endl;
}

}  // namespace rlhf::ppo::job
