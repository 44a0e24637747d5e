// GKD (issue 44.1): the generalised JSD of ppo/kl.h against its whole-vocabulary formula
// (TRL's generalized_jsd_loss; values and gradients for every beta), the top-k lumping's
// bound, and end to end on tiny models: pure GKD from a GRPO-trained teacher teaches the
// letters task without a reward, the top-k approximation's error measured on those models'
// own samples, and packed training rows giving the padded rows' loss.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "models/pretrained.h"
#include "ppo/kl.h"
#include "tests/ppo/ppo_job.h"
#include "tests/support/jsd_reference.h"

namespace rlhf::ppo::job_test {
namespace {

// gkd_divergence as the job computes it: the teacher's top k tokens, their log-probs and the
// log mass of the others (as models::head_top_k sends them), the student's log-probs of the
// same tokens.
torch::Tensor top_k_jsd(const torch::Tensor& student_logits, const torch::Tensor& teacher_logits,
                        int64_t k, double beta) {
  const auto logp = torch::log_softmax(teacher_logits.to(torch::kFloat32), -1);
  auto [top, ids] = logp.topk(k, -1);
  const auto rest = logp.scatter(-1, ids, -std::numeric_limits<float>::infinity()).logsumexp(-1);
  const auto student = torch::log_softmax(student_logits.to(torch::kFloat32), -1).gather(-1, ids);
  return gkd_divergence(student, top, rest, beta, teacher_logits.size(-1));
}

TEST(Gkd, EqualsTheWholeVocabularyFormulaAtKEqualsV) {
  torch::manual_seed(7);
  const auto zs = (torch::randn({3, 5, 11}) * 2).requires_grad_();
  const auto zt = torch::randn({3, 5, 11}) * 2;
  for (double beta : {0.0, 0.1, 0.5, 0.9, 1.0}) {
    const auto ours = top_k_jsd(zs, zt, 11, beta);
    const auto zs64 = zs.detach().to(torch::kFloat64).requires_grad_();
    const auto whole = test::whole_jsd(zs64, zt, beta);
    EXPECT_GT(whole.min().item<double>(), 1e-3) << beta;  // not a vanishing case
    // FP32 log-probs against FP64 ones: 1e-6 of the largest divergence (0.5-5 here).
    const double scale = whole.abs().max().item<double>();
    EXPECT_LT((ours.to(torch::kFloat64) - whole).abs().max().item<double>(), 1e-6 * scale) << beta;
    const auto g = torch::autograd::grad({ours.sum()}, {zs})[0].to(torch::kFloat64);
    const auto g_whole = torch::autograd::grad({whole.sum()}, {zs64})[0];
    EXPECT_LT((g - g_whole).abs().max().item<double>(), 1e-6 * scale) << beta;
  }
  // The symmetric JSD is at most log 2.
  EXPECT_LE(test::whole_jsd(zs.detach(), zt, 0.5).max().item<double>(), std::log(2.0));
}

TEST(Gkd, LumpingTheTeachersTailNeverRaisesTheDivergence) {
  // k + 1 outcomes (the top k, "any other") are a coarsening of k + 2: the divergence grows
  // with k up to the whole-vocabulary value, reached at k = V.
  torch::manual_seed(8);
  const auto zs = torch::randn({4, 6, 50}) * 3, zt = torch::randn({4, 6, 50}) * 3;
  for (double beta : {0.0, 0.5, 1.0}) {
    const auto whole = test::whole_jsd(zs, zt, beta);
    torch::Tensor previous = torch::zeros_like(whole);
    for (int64_t k : {1, 5, 20, 49, 50}) {
      const auto lumped = top_k_jsd(zs, zt, k, beta).to(torch::kFloat64);
      // FP32 rounding: 1e-5 absolute.
      EXPECT_TRUE((lumped <= whole + 1e-5).all().item<bool>()) << beta << " k " << k;
      EXPECT_TRUE((lumped >= previous - 1e-5).all().item<bool>()) << beta << " k " << k;
      previous = lumped;
    }
    EXPECT_LT((previous - whole).abs().max().item<double>(), 1e-5) << beta;
  }
  // The student equal to the teacher: 0 at any k.
  EXPECT_LT(top_k_jsd(zt, zt, 5, 0.5).abs().max().item<double>(), 1e-6);
}

class GkdJob : public TeacherJob {
 protected:
  // GKD (algo.distill.gkd.coef 1) alone: the letters rule is measured with weight 0 (no reward
  // reaches the advantages).
  Result gkd(const std::string& name, const fs::path& teacher,
             const std::vector<std::string>& extra) {
    return with_teacher(name, teacher,
                        concat({"--set", "algo.distill.gkd.coef=1", "--set", "reward.rule=",
                                "--set", R"(reward.sources=[{"rule": "letters", "weight": 0}])"},
                               extra));
  }
};

// Logits [1, T, V] of `model` on one sequence.
torch::Tensor logits_of(models::CausalLM& model, const std::vector<int64_t>& ids) {
  torch::NoGradGuard no_grad;
  const auto seq = torch::tensor(ids, torch::kLong).unsqueeze(0);
  return model.logits(model.forward(seq, torch::ones_like(seq)));
}

// The mean whole-vocabulary JSD (beta 0.5) over the response positions of logged samples,
// and the top-k value for each k, between the teacher's and the student's exports.
struct Approximation {
  double whole = 0;
  std::vector<double> top;  // per k
};
Approximation measure_top_k(const fs::path& student_dir, const fs::path& teacher_dir,
                            const std::vector<json>& rows, const std::vector<int64_t>& ks) {
  models::LoadOptions fp32;  // the untrained tiny model is stored in BF16
  fp32.dtype = torch::kFloat32;
  auto student = models::load_pretrained(student_dir.string(), fp32);
  auto teacher = models::load_pretrained(teacher_dir.string(), fp32);
  Approximation a;
  a.top.assign(ks.size(), 0.0);
  int64_t positions = 0;
  for (const json& row : rows) {
    const auto ids = row["distill"]["input_ids"].get<std::vector<int64_t>>();
    const auto n = static_cast<int64_t>(row["distill"]["teacher_log_probs"].size());
    const auto t = static_cast<int64_t>(ids.size());
    // The states before each response token: positions T-1-n .. T-2.
    const auto zs = logits_of(*student, ids).narrow(1, t - 1 - n, n);
    const auto zt = logits_of(*teacher, ids).narrow(1, t - 1 - n, n);
    a.whole += test::whole_jsd(zs, zt, 0.5).sum().item<double>();
    for (size_t i = 0; i < ks.size(); ++i)
      a.top[i] += top_k_jsd(zs, zt, std::min(ks[i], zt.size(-1)), 0.5).sum().item<double>();
    positions += n;
  }
  a.whole /= static_cast<double>(positions);
  for (double& v : a.top) v /= static_cast<double>(positions);
  return a;
}

TEST_F(GkdJob, PureGkdFromAGrpoTeacherTeachesTheTaskWithoutAReward) {
  // The teacher: grpo_tiny's 30 steps on the letters task (its export); the student: the
  // untrained tiny model, trained on GKD's JSD (beta 0.5) to the teacher's top 64 tokens of
  // 288, on its own samples, with no reward and no reverse-KL advantage.
  Result teach =
      run("teacher",
          {"--set", "actor.dtype=fp32", "--set", "rollout.dtype=fp32", "--set", "ref.dtype=fp32"},
          "examples/grpo_tiny.json");
  ASSERT_EQ(teach.exit_code, 0) << teach.out << teach.err;
  const fs::path teacher = run_dir("teacher") / "export" / "actor";
  Result r = gkd("student", teacher, {});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("| gkd "), std::string::npos) << r.out;
  const auto m = read_metrics(run_dir("student") / "metrics.jsonl");
  ASSERT_EQ(m.size(), 30u);
  for (const json& step : m) EXPECT_EQ(step["reward_mean"].get<double>(), 0.0);
  const json::json_pointer letters("/reward/letters"), jsd("/distill/gkd");
  const double jsd_first = mean_of(m, jsd, 0, 5), jsd_last = mean_of(m, jsd, 25, 30);
  const double got_first = mean_of(m, letters, 0, 5), got_last = mean_of(m, letters, 25, 30);
  std::cout << "[ measured ] pure GKD (top 64): JSD " << jsd_first << " -> " << jsd_last
            << ", letters reward " << got_first << " -> " << got_last << std::endl;
  // The student moves toward the teacher (the JSD at least halves) and picks up the task it
  // was never rewarded for, by the letters criterion's margin (tests/support/learning.h).
  EXPECT_LT(jsd_last, 0.5 * jsd_first);
  EXPECT_GT(got_last - got_first, 0.1);

  // The top-k approximation on these models' own samples (the student's last 5 steps): at
  // k = V it is the whole-vocabulary JSD; below, never above it.
  std::vector<json> rows;
  for (const json& row : test::read_jsonl((run_dir("student") / "samples.jsonl").string()))
    if (row.value("split", "") != "eval" && row["step"].get<int64_t>() > 25) rows.push_back(row);
  ASSERT_FALSE(rows.empty());
  // The same before training (the untrained student) on the same samples.
  const std::vector<int64_t> ks = {1, 8, 64, 288};
  for (const auto& [when, student] : {std::pair<std::string, fs::path>{"before", dir_ / "tiny"},
                                      {"after", run_dir("student") / "export" / "actor"}}) {
    const Approximation a = measure_top_k(student, teacher, rows, ks);
    std::cout << "[ measured ] " << when << " training: JSD per response token " << a.whole
              << "; top-k lumped:";
    for (size_t i = 0; i < ks.size(); ++i)
      std::cout << " k=" << ks[i] << " " << a.top[i] << " (" << 100 * a.top[i] / a.whole << "%)";
    std::cout << std::endl;
    EXPECT_NEAR(a.top.back(), a.whole, 1e-5 * a.whole + 1e-7) << when;  // k = V: the same
    for (size_t i = 0; i + 1 < ks.size(); ++i) EXPECT_LE(a.top[i], a.whole * (1 + 1e-5)) << when;
  }
}

TEST_F(GkdJob, PackedRowsGiveThePaddedRowsLoss) {
  // train.packing_samples forwards the rows end to end; the teacher's top-k ids go to each
  // action's place in the packed row. Step 1's GKD loss (the same samples and weights) is
  // the padded rows' within FP32 summation order.
  const fs::path teacher = init_model("small", "teacher");
  // One update per step (train.batch_size = the 64 samples): step 1's loss is the initial
  // weights' on both.
  const std::vector<std::string> two = {
      "--set", "train.max_steps=2",         "--set", "train.batch_size=64",
      "--set", "algo.distill.gkd.top_k=16", "--set", "train.max_tokens_per_micro_batch=96"};
  Result padded = gkd("padded", teacher, two);
  ASSERT_EQ(padded.exit_code, 0) << padded.out << padded.err;
  auto packed_args = two;
  packed_args.insert(packed_args.end(), {"--set", "train.packing_samples=true"});
  Result packed = gkd("packed", teacher, packed_args);
  ASSERT_EQ(packed.exit_code, 0) << packed.out << packed.err;
  const auto a = read_metrics(run_dir("padded") / "metrics.jsonl");
  const auto b = read_metrics(run_dir("packed") / "metrics.jsonl");
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), 2u);
  const double pa = a[0]["distill"]["gkd"].get<double>(), pb = b[0]["distill"]["gkd"].get<double>();
  EXPECT_GT(pa, 1e-3);  // an untrained student and teacher differ
  EXPECT_NEAR(pa, pb, 1e-5 * pa);
}

TEST_F(GkdJob, ALambdaShareOfStepsTrainsOnTheDatasetsResponses) {
  // TRL's lmbda 0.5: each step is, by a draw from (train.seed, step), the student's own
  // samples or the prompts' dataset responses (data.output_key), here lowercase words that
  // the letters criterion scores 1. A dataset step's samples are those responses, not
  // sampled (no staleness, the actor's own log-probs as the sampler's), and GKD alone trains.
  const fs::path teacher = init_model("small", "teacher");
  const fs::path data = dir_ / "letters.jsonl";
  std::map<std::string, std::string> response_of;
  {
    std::ofstream f(data);
    const char* words[] = {"abc", "hello", "world", "tiny", "model", "letters", "gkd", "teach"};
    for (int i = 0; i < 64; ++i) {
      const std::string prompt = std::string(words[i % 8]) + std::to_string(i) + ":";
      response_of[prompt] = words[(i + 3) % 8];
      f << json{{"input", prompt}, {"output", response_of[prompt]}}.dump() << "\n";
    }
  }
  Result r = gkd("mixed", teacher,
                 {"--set", "data.prompt_dataset=" + data.string(), "--set", "train.max_steps=8",
                  "--set", "algo.distill.gkd.lambda=0.5"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto m = read_metrics(run_dir("mixed") / "metrics.jsonl");
  ASSERT_EQ(m.size(), 8u);
  std::set<int64_t> dataset_steps;
  for (const json& step : m) {
    const int64_t on = step["distill"]["on_policy"].get<int64_t>();
    EXPECT_GT(step["distill"]["gkd"].get<double>(), 0.0);
    if (on == 1) {
      EXPECT_TRUE(step.contains("staleness"));
      EXPECT_LT(step["reward"]["letters"].get<double>(), 1.0);  // an untrained student's bytes
      continue;
    }
    dataset_steps.insert(step["step"].get<int64_t>());
    EXPECT_FALSE(step.contains("staleness")) << step["step"];
    EXPECT_EQ(step["rollout_logprob_diff"]["mean"].get<double>(), 0.0);
    EXPECT_EQ(step["reward"]["letters"].get<double>(), 1.0);  // the dataset's own words
  }
  // Both kinds occur in these 8 draws (the seed fixes them).
  EXPECT_GT(dataset_steps.size(), 0u);
  EXPECT_LT(dataset_steps.size(), 8u);
  EXPECT_NE(r.out.find("(dataset responses)"), std::string::npos);
  for (const json& row : test::read_jsonl((run_dir("mixed") / "samples.jsonl").string()))
    if (dataset_steps.count(row["step"].get<int64_t>()))
      EXPECT_EQ(row["response"], response_of.at(row["prompt"].get<std::string>())) << row.dump();

  // A synthetic dataset has no responses; a row without one is named with its line.
  Result synthetic = gkd("synthetic", teacher, {"--set", "algo.distill.gkd.lambda=0.5"});
  EXPECT_EQ(synthetic.exit_code, 2);
  EXPECT_NE(synthetic.err.find("synthetic:letters has no responses"), std::string::npos)
      << synthetic.err;
  Result missing = gkd("missing", teacher,
                       {"--set", "data.prompt_dataset=" + data.string(), "--set",
                        "algo.distill.gkd.lambda=0.5", "--set", "data.output_key=answer"});
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.err.find(":1: missing string key \"answer\" (data.output_key"),
            std::string::npos)
      << missing.err;
}

}  // namespace
}  // namespace rlhf::ppo::job_test
