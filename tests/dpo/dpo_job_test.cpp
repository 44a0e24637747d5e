// End-to-end dpo, sft and rm jobs through the real `rlhf` binary: the trained role and (for
// DPO) the reference model each in their own worker process, metrics and held-out figures
// on disk, the reference log-probs computed once and reused, resume continuing the same
// trajectory, and an rm export serving as PPO's reward model. Tiny models come from
// `rlhf init-model` in a fresh directory per test.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>

#include "engine/memory_check.h"
#include "test_paths.h"
#include "tests/support/plan_check.h"
#include "tests/support/run_cli.h"

namespace rlhf::dpo {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using Result = test::CliResult;
using test::slurp;

// `rlhf ARGS` (from the source directory, killed after 300 s).
Result rlhf(const std::vector<std::string>& args) {
  return test::run_cli(args);
}

// metrics.jsonl split into step records and held-out records ("split": "eval").
struct Metrics {
  std::vector<json> steps, evals;
};
Metrics read_metrics(const fs::path& file) {
  Metrics m;
  for (const json& j : test::read_jsonl(file))
    (j.value("split", "") == "eval" ? m.evals : m.steps).push_back(j);
  return m;
}

std::set<std::string> worker_roles(const fs::path& run_dir, size_t* pids = nullptr) {
  auto workers = json::parse(slurp(run_dir / "workers.json"));
  std::set<std::string> roles;
  std::set<int> distinct;
  for (const auto& w : workers) {
    roles.insert(w["role"].get<std::string>());
    distinct.insert(w["pid"].get<int>());
  }
  if (pids) *pids = distinct.size();
  return roles;
}

class OfflineRun : public testing::Test {
 protected:
  void SetUp() override { dir_ = test::tiny_models_dir("dpo"); }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }
  // `rlhf run EXAMPLE` with this test's models and run directory.
  Result run(const std::string& example, const std::string& name, std::vector<std::string> extra) {
    const bool rm = example.find("rm_") != std::string::npos;
    std::vector<std::string> args = {"run",
                                     example,
                                     "--set",
                                     (rm ? "reward.model=" + (dir_ / "tiny-value").string()
                                         : "actor.model=" + (dir_ / "tiny").string()),
                                     "--set",
                                     "logger.run_dir=" + (dir_ / "runs").string(),
                                     "--set",
                                     "name=" + name,
                                     "--set",
                                     "logger.logging_steps=1"};
    args.insert(args.end(), extra.begin(), extra.end());
    return rlhf(args);
  }
  fs::path run_dir(const std::string& name) const { return dir_ / "runs" / name; }
  fs::path dir_;
};

// The reference sharded ZeRO-3 style over 2 workers (ref.zero_stage 3) gives the reference
// log-probs of the whole model: the same losses, step for step. 1e-6: the same weights and
// kernels, identical in practice; printing of doubles only.
TEST_F(OfflineRun, DpoWithAShardedReferenceMatchesTheWholeOne) {
  Result whole = run("examples/dpo_tiny.json", "whole", {"--set", "data.max_samples=32"});
  ASSERT_EQ(whole.exit_code, 0) << whole.out << whole.err;
  Result sharded =
      run("examples/dpo_tiny.json", "sharded",
          {"--set", "data.max_samples=32", "--set",
           R"(cluster.nodes=[{"name":"local","kind":"cpu","devices":3,"memory_gb":4}])", "--set",
           "ref.devices=[1,2]", "--set", "ref.zero_stage=3"});
  ASSERT_EQ(sharded.exit_code, 0) << sharded.out << sharded.err;
  Metrics a = read_metrics(run_dir("whole") / "metrics.jsonl");
  Metrics b = read_metrics(run_dir("sharded") / "metrics.jsonl");
  ASSERT_EQ(a.steps.size(), 4u);
  ASSERT_EQ(b.steps.size(), 4u);
  for (size_t i = 0; i < 4; ++i)
    for (const char* key : {"loss", "margin", "grad_norm"})
      EXPECT_NEAR(a.steps[i][key].get<double>(), b.steps[i][key].get<double>(), 1e-6)
          << key << " step " << i + 1;
  EXPECT_EQ(b.steps[0]["memory"]["ref"].size(), 2u);
}

TEST_F(OfflineRun, DpoWithTheReferenceInItsOwnProcess) {
  // 32 pairs, batch 16: 2 steps per epoch, 2 epochs.
  Result r = run("examples/dpo_tiny.json", "dpo", {"--set", "data.max_samples=32"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  size_t pids = 0;
  EXPECT_EQ(worker_roles(run_dir("dpo"), &pids), (std::set<std::string>{"actor", "ref"}));
  EXPECT_EQ(pids, 2u);
  Metrics m = read_metrics(run_dir("dpo") / "metrics.jsonl");
  ASSERT_EQ(m.steps.size(), 4u);
  for (size_t i = 0; i < m.steps.size(); ++i) {
    const json& s = m.steps[i];
    EXPECT_EQ(s["step"], static_cast<int>(i) + 1);
    EXPECT_EQ(s["epoch"], static_cast<int>(i) / 2 + 1);
    for (const char* key : {"loss", "accuracy", "chosen_reward", "rejected_reward", "margin",
                            "grad_norm", "tokens_per_s", "samples_per_s"})
      EXPECT_TRUE(s.contains(key) && s[key].is_number() && std::isfinite(s[key].get<double>()))
          << key << s.dump();
    EXPECT_NEAR(s["margin"].get<double>(),
                s["chosen_reward"].get<double>() - s["rejected_reward"].get<double>(), 1e-5);
    for (const char* role : {"actor", "ref"}) {
      ASSERT_TRUE(s["memory"].contains(role)) << role;
      EXPECT_GT(s["memory"][role][0]["peak_rss_bytes"].get<int64_t>(), 0) << role;
      EXPECT_GT(s["memory"][role][0]["peak_tensor_bytes"].get<int64_t>(), 0) << role;
    }
  }
  // Before the first update the policy is the reference: rewards ~0, loss = ln 2. The
  // tolerance covers BF16 forwards of the same weights in two processes (log-prob sums of
  // ~10 tokens differ by ~1e-2, times beta 0.1); a misaligned or missing reference log-prob
  // would put the loss far from ln 2.
  EXPECT_NEAR(m.steps[0]["loss"].get<double>(), std::log(2.0), 0.02);
  EXPECT_NEAR(m.steps[0]["margin"].get<double>(), 0.0, 0.05);
  // The reference runs once per pair: train and held-out sets, then never again.
  EXPECT_EQ(test::count_of(r.out, "computed on the ref group"), 2u) << r.out;
  EXPECT_EQ(test::count_of(r.out, "loaded from"), 0u) << r.out;
  EXPECT_TRUE(fs::exists(run_dir("dpo") / "ref_cache" / "index.json"));
  ASSERT_EQ(m.evals.size(), 2u);
  EXPECT_EQ(m.evals[0]["when"], "before");
  EXPECT_EQ(m.evals[1]["when"], "after");
  EXPECT_EQ(m.evals[1]["examples"], 256);
  EXPECT_TRUE(fs::exists(run_dir("dpo") / "export" / "actor" / "model.safetensors"));
  // Issue 28: per phase (the held-out scoring before training is the actor's score phase),
  // the plan's tracked bytes as measured.
  const auto compared = test::expect_tracked_phases_match(run_dir("dpo").string());
  EXPECT_EQ(compared.at("actor"), (std::set<std::string>{"load", "score", "train"}));
  EXPECT_EQ(compared.at("ref"), (std::set<std::string>{"load", "score"}));
}

TEST_F(OfflineRun, DpoResumeContinuesAndReusesTheReferenceCache) {
  const std::vector<std::string> data = {"--set", "data.max_samples=32"};
  auto with = [&](std::vector<std::string> a) {
    a.insert(a.end(), data.begin(), data.end());
    return a;
  };
  ASSERT_EQ(
      run("examples/dpo_tiny.json", "straight", with({"--set", "train.max_steps=3"})).exit_code, 0);
  Result first = run("examples/dpo_tiny.json", "resumed",
                     with({"--set", "train.max_steps=2", "--set", "ckpt.save_steps=1"}));
  ASSERT_EQ(first.exit_code, 0) << first.err;
  std::vector<fs::path> cache_files;
  for (const auto& f : fs::directory_iterator(run_dir("resumed") / "ref_cache"))
    if (f.path().extension() == ".safetensors") cache_files.push_back(f.path());
  ASSERT_EQ(cache_files.size(), 2u);  // train and held-out
  std::vector<fs::file_time_type> mtimes;
  for (const auto& f : cache_files) mtimes.push_back(fs::last_write_time(f));

  Result second =
      run("examples/dpo_tiny.json", "resumed",
          with({"--set", "train.max_steps=3", "--set", "ckpt.save_steps=1", "--resume"}));
  ASSERT_EQ(second.exit_code, 0) << second.out << second.err;
  EXPECT_NE(second.out.find("resumed after step 2"), std::string::npos) << second.out;
  // The resumed job asks the reference group nothing: both sets come from the cache files,
  // which are not rewritten.
  EXPECT_EQ(test::count_of(second.out, "loaded from"), 2u) << second.out;
  EXPECT_EQ(test::count_of(second.out, "computed on the ref group"), 0u) << second.out;
  for (size_t i = 0; i < cache_files.size(); ++i)
    EXPECT_EQ(fs::last_write_time(cache_files[i]), mtimes[i]);

  Metrics a = read_metrics(run_dir("straight") / "metrics.jsonl");
  Metrics b = read_metrics(run_dir("resumed") / "metrics.jsonl");
  ASSERT_EQ(a.steps.size(), 3u);
  ASSERT_EQ(b.steps.size(), 3u);
  // Same batch order (fixed by the step number), weights and optimizer state: the resumed
  // step 3 reproduces the uninterrupted one. 1e-4: single-threaded CPU kernels are
  // deterministic; the margin covers printing of doubles.
  EXPECT_EQ(b.steps[2]["step"], 3);
  for (const char* key : {"loss", "accuracy", "margin", "grad_norm"})
    EXPECT_NEAR(a.steps[2][key].get<double>(), b.steps[2][key].get<double>(), 1e-4) << key;
}

TEST_F(OfflineRun, DpoOnTwoZero3RanksMatchesOneRank) {
  // The same 4 steps with the actor on one rank (2 micro batches of 8 pairs accumulated) and
  // sharded ZeRO-3 over two ranks (one micro batch each: the same 8-pair groups). Tolerance
  // 1e-3: only the order of the gradient reduction differs (BF16 compute, FP32 masters).
  const std::vector<std::string> common = {"--set", "data.max_samples=32", "--set",
                                           "ckpt.export_hf=false"};
  auto with = [&](std::vector<std::string> a) {
    a.insert(a.end(), common.begin(), common.end());
    return a;
  };
  ASSERT_EQ(run("examples/dpo_tiny.json", "one", with({})).exit_code, 0);
  Result two =
      run("examples/dpo_tiny.json", "two",
          with({"--set",
                R"(cluster.nodes=[{"name": "local", "kind": "cpu", "devices": 3, "memory_gb": 4}])",
                "--set", "actor.devices=[0,1]", "--set", "ref.devices=[2]", "--set",
                "actor.zero_stage=3"}));
  ASSERT_EQ(two.exit_code, 0) << two.out << two.err;
  Metrics a = read_metrics(run_dir("one") / "metrics.jsonl"),
          b = read_metrics(run_dir("two") / "metrics.jsonl");
  ASSERT_EQ(a.steps.size(), 4u);
  ASSERT_EQ(b.steps.size(), 4u);
  for (size_t i = 0; i < 4; ++i)
    for (const char* key : {"loss", "margin", "chosen_reward", "rejected_reward"})
      EXPECT_NEAR(a.steps[i][key].get<double>(), b.steps[i][key].get<double>(), 1e-3)
          << key << " step " << i + 1;
  EXPECT_EQ(b.steps[0]["memory"]["actor"].size(), 2u);
  // Issue 41.3: each actor rank's collectives in a step (counted in its Gloo group) are the
  // plan's, byte for byte: one rank (no gradient all-reduce over one rank) and ZeRO-3 over two
  // (gathers in every forward and recompute, reduce-scatters in every backward).
  for (const Metrics* m : {&a, &b}) {
    for (const auto& rank : m->steps.back()["memory"]["actor"]) {
      ASSERT_TRUE(rank.contains("step_collectives")) << rank.dump();
      ASSERT_TRUE(rank.contains("planned_step_collectives")) << rank.dump();
      for (const char* kind : {"all_gather", "reduce_scatter", "all_reduce", "calls"})
        EXPECT_EQ(rank["step_collectives"][kind], rank["planned_step_collectives"][kind])
            << kind << ": " << rank.dump();
    }
  }
  EXPECT_GT(b.steps.back()["memory"]["actor"][0]["step_collectives"]["reduce_scatter"], 0);
  // `rlhf plan --check`'s rows say the same (payload per step, every kind).
  for (const auto& row : rlhf::engine::check_run_memory(run_dir("two").string())) {
    if (row.role == "actor") {
      EXPECT_GT(row.measured_collectives, 0);
      EXPECT_EQ(row.planned_collectives, row.measured_collectives);
    }
  }
  // Issue 28 at ZeRO-3: the held-out scoring gathers one unit at a time.
  const auto compared = test::expect_tracked_phases_match(run_dir("two").string());
  EXPECT_EQ(compared.at("actor"), (std::set<std::string>{"load", "score", "train"}));
  ASSERT_EQ(b.evals.size(), 2u);
  EXPECT_NEAR(a.evals[1]["eval_loss"].get<double>(), b.evals[1]["eval_loss"].get<double>(), 1e-3);
}

TEST_F(OfflineRun, EachDpoLossReachesTheWorker) {
  // At step 1 the policy is the reference (h = 0 up to BF16 noise |h| < 0.1: sums of ~10
  // token log-probs computed in two processes), so each loss has a known value:
  //   ipo (beta 0.1):  (h - 1 / (2 beta))^2 = 25, within 2 x 5 x 0.1 = 1
  //   hinge:           relu(1 - beta h) = 1, within 0.01
  //   sigmoid + label_smoothing 0.2: ln 2 whatever the smoothing, within 0.01
  //   + nll_loss_coef 1: adds the chosen responses' NLL per token, ~ln 288 = 5.66 for a
  //     random model (within 0.5), so the loss is ln 2 + ~5.66.
  struct Case {
    std::vector<std::string> sets;
    double expect, tolerance;
  };
  const std::vector<Case> cases = {
      {{"algo.dpo.loss=ipo"}, 25.0, 1.0},
      {{"algo.dpo.loss=hinge"}, 1.0, 0.01},
      {{"algo.dpo.label_smoothing=0.2"}, std::log(2.0), 0.01},
      {{"algo.dpo.nll_loss_coef=1.0"}, std::log(2.0) + std::log(288.0), 0.5},
  };
  int n = 0;
  for (const auto& c : cases) {
    std::vector<std::string> extra = {"--set", "data.max_samples=16", "--set", "train.max_steps=1",
                                      "--set", "ckpt.export_hf=false"};
    for (const auto& s : c.sets) extra.insert(extra.end(), {"--set", s});
    const std::string name = "loss" + std::to_string(n++);
    Result r = run("examples/dpo_tiny.json", name, extra);
    ASSERT_EQ(r.exit_code, 0) << c.sets[0] << "\n" << r.out << r.err;
    Metrics m = read_metrics(run_dir(name) / "metrics.jsonl");
    ASSERT_EQ(m.steps.size(), 1u);
    EXPECT_NEAR(m.steps[0]["loss"].get<double>(), c.expect, c.tolerance) << c.sets[0];
  }
}

TEST_F(OfflineRun, SimpoRunsWithoutAReferenceGroup) {
  Result r =
      run("examples/dpo_tiny.json", "simpo",
          {"--set", "algo.dpo.loss=simpo", "--set", "ref.devices=[]", "--set",
           "data.max_samples=32", "--set", "train.max_steps=2", "--set", "ckpt.export_hf=false"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(worker_roles(run_dir("simpo")), (std::set<std::string>{"actor"}));
  Metrics m = read_metrics(run_dir("simpo") / "metrics.jsonl");
  ASSERT_EQ(m.steps.size(), 2u);
  // SimPO at step 1 compares length-normalised log-probs of a random policy: loss =
  // -log sigmoid(beta (avg_c - avg_r) - gamma) with |beta (avg_c - avg_r)| small (beta 0.1,
  // averages within ~1 nat of each other), so near -log sigmoid(-0.5) = 0.974.
  EXPECT_NEAR(m.steps[0]["loss"].get<double>(), 0.974, 0.1);
  EXPECT_FALSE(fs::exists(run_dir("simpo") / "ref_cache"));
}

TEST_F(OfflineRun, OrpoRunsWithoutAReferenceGroup) {
  Result r = run("examples/dpo_tiny.json", "orpo",
                 {"--set", "algo.dpo.loss=orpo", "--set", "algo.dpo.orpo_lambda=1", "--set",
                  "ref.devices=[]", "--set", "data.max_samples=32", "--set", "train.max_steps=2",
                  "--set", "ckpt.export_hf=false"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(worker_roles(run_dir("orpo")), (std::set<std::string>{"actor"}));
  EXPECT_FALSE(fs::exists(run_dir("orpo") / "ref_cache"));
  Metrics m = read_metrics(run_dir("orpo") / "metrics.jsonl");
  ASSERT_EQ(m.steps.size(), 2u);
  // Step 1 of a random policy: the NLL per chosen token is near ln(vocab) = ln 288 = 5.66
  // (as the SFT test's start), and loss - NLL = lambda * -log sigmoid(log odds difference),
  // with per-token averages of a random policy within ~1 nat of each other: near ln 2 = 0.69.
  const double loss = m.steps[0]["loss"].get<double>();
  const double nll = -m.steps[0]["chosen_log_prob"].get<double>();
  EXPECT_NEAR(nll, std::log(288.0), 0.5);
  EXPECT_NEAR(loss - nll, std::log(2.0), 0.5);
  EXPECT_GT(loss - nll, 0.0);  // the odds-ratio term is a positive addition to the NLL
}

TEST_F(OfflineRun, KtoTrainsOnUnpairedRowsAgainstTheReference) {
  // synthetic:preferences split into unpaired rows: each pair's chosen response labelled
  // desirable, its rejected one undesirable; 64 rows, batch 16: 4 steps per epoch, 2 epochs.
  Result r = run("examples/dpo_tiny.json", "kto",
                 {"--set", "algo.dpo.loss=kto", "--set", "data.max_samples=64", "--set",
                  "ckpt.export_hf=false"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(worker_roles(run_dir("kto")), (std::set<std::string>{"actor", "ref"}));
  EXPECT_TRUE(fs::exists(run_dir("kto") / "ref_cache"));
  Metrics m = read_metrics(run_dir("kto") / "metrics.jsonl");
  ASSERT_EQ(m.steps.size(), 8u);
  // Step 1: the policy is the reference (log-ratios within BF16 noise, |r| < 0.1, beta 0.1),
  // so z0 = max(0, ~0) < 0.01 and every row loses 1 - sigmoid(~0) = 0.5, within 0.01.
  EXPECT_NEAR(m.steps[0]["loss"].get<double>(), 0.5, 0.01);
  EXPECT_LT(m.steps[0]["kl"].get<double>(), 0.01);
  EXPECT_GE(m.steps[0]["kl"].get<double>(), 0.0);
  // Training separates the labels: the held-out reward margin (desirable - undesirable)
  // starts at ~0 and ends positive, and the held-out loss falls below 0.5.
  ASSERT_EQ(m.evals.size(), 2u);
  EXPECT_NEAR(m.evals[0]["eval_margin"].get<double>(), 0.0, 0.01);
  EXPECT_GT(m.evals[1]["eval_margin"].get<double>(), 0.05);
  EXPECT_LT(m.evals[1]["eval_loss"].get<double>(), m.evals[0]["eval_loss"].get<double>());
}

TEST_F(OfflineRun, KtoReferencePointIsOneValuePerGlobalBatch) {
  // The same 4 steps of 16 rows as one micro batch on one rank, as 4 micro batches of 4 on
  // one rank, and as 2 micro batches of 4 on each of two ZeRO-3 ranks. z0 is the mean KL of
  // all 16 mismatched rows, clamped at 0, in each, so the logged kl and loss agree step for
  // step. lr 5e-3 moves the policy off the reference at once; a z0 taken per micro batch or
  // per rank does not agree (measured: kl off by 0.025, 0.06, 0.43 at steps 2-4, loss by
  // 6e-3 and 1e-2 at steps 3-4). Tolerances: only the batching of the forwards and the order
  // of the gradient reduction differ (BF16 compute, FP32 masters): loss 1e-3, as in
  // DpoOnTwoZero3RanksMatchesOneRank (measured <= 3e-5); kl, a sum over ~30 tokens of BF16
  // log-prob differences, 1e-2 (measured <= 5e-3).
  // chosen_reward and rejected_reward are means of micro-batch means: not compared.
  const std::vector<std::string> common = {
      "--set", "algo.dpo.loss=kto",  "--set", "data.max_samples=64", "--set", "train.max_steps=4",
      "--set", "actor.adam.lr=5e-3", "--set", "ckpt.export_hf=false"};
  auto with = [&](std::vector<std::string> a) {
    a.insert(a.end(), common.begin(), common.end());
    return a;
  };
  Result whole =
      run("examples/dpo_tiny.json", "whole", with({"--set", "train.micro_batch_size=16"}));
  ASSERT_EQ(whole.exit_code, 0) << whole.out << whole.err;
  Result micro =
      run("examples/dpo_tiny.json", "micro", with({"--set", "train.micro_batch_size=4"}));
  ASSERT_EQ(micro.exit_code, 0) << micro.out << micro.err;
  Result ranks =
      run("examples/dpo_tiny.json", "ranks",
          with({"--set",
                R"(cluster.nodes=[{"name": "local", "kind": "cpu", "devices": 3, "memory_gb": 4}])",
                "--set", "actor.devices=[0,1]", "--set", "ref.devices=[2]", "--set",
                "actor.zero_stage=3", "--set", "train.micro_batch_size=4"}));
  ASSERT_EQ(ranks.exit_code, 0) << ranks.out << ranks.err;
  Metrics a = read_metrics(run_dir("whole") / "metrics.jsonl");
  ASSERT_EQ(a.steps.size(), 4u);
  EXPECT_GT(a.steps[3]["kl"].get<double>(), 0.1) << "the policy left the reference";
  for (const char* name : {"micro", "ranks"}) {
    Metrics b = read_metrics(run_dir(name) / "metrics.jsonl");
    ASSERT_EQ(b.steps.size(), 4u) << name;
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_NEAR(b.steps[i]["kl"].get<double>(), a.steps[i]["kl"].get<double>(), 1e-2)
          << name << ": kl at step " << i + 1;
      EXPECT_NEAR(b.steps[i]["loss"].get<double>(), a.steps[i]["loss"].get<double>(), 1e-3)
          << name << ": loss at step " << i + 1;
    }
  }
}

TEST_F(OfflineRun, KtoLogsRewardsWhenARankHasRowsOfOneLabelOnly) {
  // 16 rows, one of them undesirable, the whole file each step (2 epochs: 2 steps), over two
  // ZeRO-3 ranks: one rank's share has no undesirable row, so it reports no rejected_reward.
  // The step's record must still carry both rewards (the mean over the ranks that have
  // them). Before the fix the driver took the keys of rank 0's reply only: it stopped with
  // "key 'rejected_reward' not found" when rank 0 held the undesirable row and dropped the
  // key when rank 1 did.
  const fs::path data = dir_ / "kto_one_undesirable.jsonl";
  {
    std::ofstream f(data);
    for (int i = 0; i < 16; ++i)
      f << R"({"prompt": "w)" << char('a' + i) << R"(:", "output": ")" << (i == 7 ? "X1Y2" : "abcd")
        << R"(", "label": )" << (i == 7 ? "false" : "true") << "}\n";
  }
  Result r = run(
      "examples/dpo_tiny.json", "kto_one",
      {"--set", "algo.dpo.loss=kto", "--set", "data.dataset=" + data.string(), "--set",
       "train.batch_size=16", "--set", "train.micro_batch_size=4", "--set", "ckpt.export_hf=false",
       "--set", R"(cluster.nodes=[{"name": "local", "kind": "cpu", "devices": 3, "memory_gb": 4}])",
       "--set", "actor.devices=[0,1]", "--set", "ref.devices=[2]", "--set", "actor.zero_stage=3"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  Metrics m = read_metrics(run_dir("kto_one") / "metrics.jsonl");
  ASSERT_EQ(m.steps.size(), 2u);
  for (const auto& s : m.steps) {
    ASSERT_TRUE(s.contains("rejected_reward")) << s.dump();
    ASSERT_TRUE(s.contains("chosen_reward")) << s.dump();
    EXPECT_TRUE(std::isfinite(s["rejected_reward"].get<double>())) << s.dump();
  }
}

TEST_F(OfflineRun, SftHeldOutLossFallsAndPackingRuns) {
  // 128 examples, batch 16, 6 epochs: 48 steps; held-out evaluation before, every 16 steps
  // (eval.steps) and after: at steps 0, 16, 32 and 48.
  Result r = run("examples/sft_tiny.json", "sft",
                 {"--set", "data.max_samples=128", "--set", "eval.steps=16"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  Metrics m = read_metrics(run_dir("sft") / "metrics.jsonl");
  ASSERT_EQ(m.steps.size(), 48u);
  ASSERT_EQ(m.evals.size(), 4u);
  const std::vector<std::pair<std::string, int>> when = {
      {"before", 0}, {"during", 16}, {"during", 32}, {"after", 48}};
  for (size_t i = 0; i < when.size(); ++i) {
    EXPECT_EQ(m.evals[i]["when"], when[i].first) << i;
    EXPECT_EQ(m.evals[i]["step"], when[i].second) << i;
  }
  EXPECT_EQ(test::count_of(r.out, "held-out, during training"), 2u) << r.out;
  const double before = m.evals[0]["eval_loss"], after = m.evals[3]["eval_loss"];
  EXPECT_LT(m.evals[1]["eval_loss"].get<double>(), before);
  // A random tiny model starts near ln(vocab) = ln 288 = 5.66 nats per token; 48 steps at
  // lr 3e-3 take it well below (a fall of 1 nat is far beyond step-to-step noise).
  EXPECT_NEAR(before, std::log(288.0), 0.5);
  EXPECT_LT(after, before - 1.0) << "before " << before << " after " << after;
  EXPECT_LT(m.steps.back()["loss"].get<double>(), m.steps.front()["loss"].get<double>());

  Result packed = run("examples/sft_tiny.json", "packed",
                      {"--set", "data.packing=true", "--set", "train.max_steps=2", "--set",
                       "ckpt.export_hf=false"});
  ASSERT_EQ(packed.exit_code, 0) << packed.out << packed.err;
  Metrics p = read_metrics(run_dir("packed") / "metrics.jsonl");
  ASSERT_EQ(p.steps.size(), 2u);
  // 16 examples of at most 10+9 tokens packed into rows of 32: fewer rows than examples,
  // and a multiple of the 2 micro batches of the step.
  EXPECT_LT(p.steps[0]["rows"].get<int>(), 16);
  EXPECT_EQ(p.steps[0]["rows"].get<int>() % 2, 0);
  EXPECT_TRUE(std::isfinite(p.steps[0]["loss"].get<double>()));
}

// FP16 (issue 41.2): the same SFT job with actor.dtype fp16 learns as the FP32 one does; each
// record carries the loss scale (2^16 at first, halved per overflowing step, which is skipped
// and counted) and the held-out loss falls by more than a nat.
TEST_F(OfflineRun, SftInFp16ScalesItsLossAndLearns) {
  Result r = run("examples/sft_tiny.json", "fp16",
                 {"--set", "data.max_samples=128", "--set", "actor.dtype=fp16", "--set",
                  "logger.logging_steps=1", "--set", "ckpt.export_hf=false"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  Metrics m = read_metrics(run_dir("fp16") / "metrics.jsonl");
  ASSERT_EQ(m.steps.size(), 48u);
  double skipped_before = 0;
  for (const auto& s : m.steps) {
    ASSERT_TRUE(s.contains("loss_scale")) << s.dump();
    // The scale a step used: 2^16 halved once per earlier overflow (this step's, if it
    // overflowed, is already counted in skipped_steps).
    const double scale = s["loss_scale"], skipped = s["skipped_steps"];
    EXPECT_EQ(scale, std::ldexp(65536.0, -static_cast<int>(skipped_before))) << s.dump();
    EXPECT_GE(skipped, skipped_before);
    skipped_before = skipped;
    EXPECT_TRUE(std::isfinite(s["loss"].get<double>())) << s.dump();
  }
  EXPECT_LE(m.steps.back()["skipped_steps"].get<double>(), 3);
  ASSERT_EQ(m.evals.size(), 2u);
  const double before = m.evals[0]["eval_loss"], after = m.evals[1]["eval_loss"];
  EXPECT_LT(after, before - 1.0) << "before " << before << " after " << after;
}

// SFT on whole conversations (data.multiturn, issue 31): the loss covers the assistant turns
// only. Each conversation's tool turn is 32 random letters (ln 26 = 3.3 nats a letter, which
// no model can learn); both assistant turns are fixed words. Trained on the assistant turns
// alone the held-out loss falls near 0; were the tool's letters in the loss, they would hold
// it above 32 * 3.3 / (32 + 13) = 2.3 nats per token, so < 1.0 tells the two apart.
TEST_F(OfflineRun, SftOnConversationsTrainsOnlyTheAssistantTurns) {
  auto write = [&](const fs::path& file, int rows, unsigned seed) {
    std::mt19937 rng(seed);
    std::ofstream out(file);
    for (int i = 0; i < rows; ++i) {
      std::string noise;
      for (int k = 0; k < 32; ++k) noise += static_cast<char>('a' + rng() % 26);
      out << json{{"messages",
                   {{{"role", "user"}, {"content", "look up " + noise.substr(0, 4)}},
                    {{"role", "assistant"}, {"content", "lookup"}},
                    {{"role", "tool"}, {"content", noise}},
                    {{"role", "assistant"}, {"content", "done"}}}}}
                 .dump()
          << "\n";
    }
  };
  write(dir_ / "convs.jsonl", 128, 1);
  write(dir_ / "convs_eval.jsonl", 32, 2);
  const std::vector<std::string> conversation_keys = {
      "--set", "data.dataset=" + (dir_ / "convs.jsonl").string(),
      "--set", "data.eval_dataset=" + (dir_ / "convs_eval.jsonl").string(),
      "--set", "data.multiturn=true",
      "--set", "data.prompt_key=messages",
      "--set", "data.apply_chat_template=true",
      "--set", "data.chat_template=chatml",
      "--set", "data.prompt_max_len=64",
      "--set", "data.max_len=160",
      "--set", "train.max_epochs=3",
      "--set", "ckpt.export_hf=false"};
  Result r = run("examples/sft_tiny.json", "convs", conversation_keys);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  Metrics m = read_metrics(run_dir("convs") / "metrics.jsonl");
  ASSERT_EQ(m.steps.size(), 24u);  // 128 conversations, batch 16, 3 epochs
  ASSERT_EQ(m.evals.size(), 2u);
  EXPECT_NEAR(m.evals[0]["eval_loss"].get<double>(), std::log(288.0), 0.5);
  EXPECT_LT(m.evals[1]["eval_loss"].get<double>(), 1.0) << m.evals[1].dump();

  // A conversation that does not end with the model's turn is named, file and line, before
  // any worker starts.
  std::ofstream(dir_ / "convs.jsonl", std::ios::app)
      << R"({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},)"
      << R"( {"role": "tool", "content": "c"}]})"
      << "\n";
  Result bad = run("examples/sft_tiny.json", "badconv", conversation_keys);
  EXPECT_EQ(bad.exit_code, 2) << bad.out << bad.err;
  EXPECT_NE(bad.err.find("convs.jsonl:129: conversation: message 2: expected the conversation "
                         "to end with an assistant turn"),
            std::string::npos)
      << bad.err;
  EXPECT_FALSE(fs::exists(run_dir("badconv") / "workers.json"));
  // Conversations are rendered with the chat template: without it the spec is refused.
  Result plain = run("examples/sft_tiny.json", "plainconv",
                     {"--set", "data.multiturn=true", "--set", "data.prompt_key=messages"});
  EXPECT_EQ(plain.exit_code, 2) << plain.out << plain.err;
  EXPECT_NE(plain.err.find("data.multiturn"), std::string::npos) << plain.err;
  EXPECT_NE(plain.err.find("data.apply_chat_template=true"), std::string::npos) << plain.err;
}

TEST_F(OfflineRun, RewardModelLearnsAndServesPpo) {
  Result r = run("examples/rm_tiny.json", "rm", {"--set", "data.max_samples=128"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(worker_roles(run_dir("rm")), (std::set<std::string>{"reward"}));
  Metrics m = read_metrics(run_dir("rm") / "metrics.jsonl");
  ASSERT_EQ(m.steps.size(), 8u);
  ASSERT_EQ(m.evals.size(), 2u);
  // 256 held-out pairs: chance is 0.5 +- 0.031 (one standard deviation), so 0.75 is 8 sigma.
  EXPECT_GT(m.evals[1]["eval_accuracy"].get<double>(), 0.75) << m.evals[1].dump();
  const fs::path exported = run_dir("rm") / "export" / "reward";
  ASSERT_TRUE(fs::exists(exported / "config.json"));
  // The export is a reward model PPO can load and score with.
  Result ppo =
      rlhf({"run", "examples/ppo_tiny.json", "--set", "actor.model=" + (dir_ / "tiny").string(),
            "--set", "critic.model=" + (dir_ / "tiny-value").string(), "--set",
            "reward.rule=", "--set", "reward.model=" + exported.string(), "--set",
            "train.max_steps=1", "--set", "logger.run_dir=" + (dir_ / "runs").string(), "--set",
            "name=ppo-with-rm", "--set", "ckpt.export_hf=false"});
  ASSERT_EQ(ppo.exit_code, 0) << ppo.out << ppo.err;
  EXPECT_NE(ppo.out.find("step 1/1 | reward"), std::string::npos) << ppo.out;
}

TEST_F(OfflineRun, BadPreferenceLineIsNamedBeforeAnyWorkerStarts) {
  const fs::path data = dir_ / "prefs.jsonl";
  std::ofstream(data) << R"({"prompt": "a:", "chosen": "b", "rejected": "C"})"
                      << "\n"
                      << R"({"prompt": "a:", "chosen": "b"})"
                      << "\n";
  Result r = run("examples/dpo_tiny.json", "bad", {"--set", "data.dataset=" + data.string()});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("prefs.jsonl:2"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("rejected"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(run_dir("bad") / "workers.json"));
}

TEST_F(OfflineRun, BadKtoLabelIsNamedBeforeAnyWorkerStarts) {
  const fs::path data = dir_ / "kto.jsonl";
  std::ofstream(data) << R"({"prompt": "a:", "output": "b", "label": true})"
                      << "\n"
                      << R"({"prompt": "a:", "output": "C", "label": "bad"})"
                      << "\n";
  Result r = run("examples/dpo_tiny.json", "badkto",
                 {"--set", "algo.dpo.loss=kto", "--set", "data.dataset=" + data.string()});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("kto.jsonl:2: expected true or false"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("data.label_key"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(run_dir("badkto") / "workers.json"));
}

}  // namespace
}  // namespace rlhf::dpo
