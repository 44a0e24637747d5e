// A mixture of experts end to end (issue 43.6): examples/grpo_moe_tiny.json, GRPO on the
// letters task with a tiny Qwen3-MoE (`rlhf init-model --preset tiny-moe`) as actor,
// reference and rollout, learns as grpo_tiny's dense model does, and its HF export, one
// tensor per expert as published, loads in transformers with rlhf's logits.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "models/causal_lm.h"
#include "models/pretrained.h"
#include "models/safetensors.h"
#include "test_paths.h"
#include "tests/ppo/ppo_job.h"

namespace rlhf::ppo::job_test {
namespace {

using test::expect_learned;

// rlhf's and transformers' FP32 logits of the same export: max |difference| 1e-4, the bound
// of tests/models/hf_parity_test.cpp (summation order only, ~1e-6 measured).
constexpr double kExportTolerance = 1e-4;

TEST_F(PpoJob, GrpoOnATinyMixtureOfExpertsLearnsAndItsExportLoadsInTransformers) {
  const fs::path model = dir_ / "tiny-moe";
  ASSERT_EQ(rlhf({"init-model", "--preset", "tiny-moe", "--out", model.string()}).exit_code, 0);
  Result r = rlhf({"run", "examples/grpo_moe_tiny.json", "--set", "actor.model=" + model.string(),
                   "--set", "logger.run_dir=" + (dir_ / "runs").string(), "--set", "name=moe"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto m = read_metrics(run_dir("moe") / "metrics.jsonl");
  ASSERT_EQ(m.size(), 30u);
  // The letters task's criterion (tests/support/learning.h): +0.1 reward from the first 5
  // steps to the last 5; grpo_tiny's dense model gains ~0.37 over the same 30 steps.
  expect_learned(m);

  // The export holds every expert as its own tensor, named as Qwen3-MoE checkpoints are.
  const fs::path exported = run_dir("moe") / "export" / "actor";
  models::CheckpointReader file(exported.string());
  const auto names = file.names();
  const std::set<std::string> saved(names.begin(), names.end());
  EXPECT_TRUE(saved.count("model.layers.1.mlp.experts.7.down_proj.weight"));
  EXPECT_TRUE(saved.count("model.layers.0.mlp.gate.weight"));

  // transformers' logits of the export against rlhf's (both FP32).
  torch::NoGradGuard no_grad;
  const auto ids = torch::randint(0, 256, {2, 12}, torch::kInt64);
  const auto mask = torch::ones_like(ids);
  const std::string inputs = (dir_ / "inputs.safetensors").string();
  const std::string hf_out = (dir_ / "hf_logits.safetensors").string();
  models::save_safetensors(inputs, {{"input_ids", ids}, {"attention_mask", mask}});
  const std::string error = test::run_python_reference(
      std::string(RLHF_SOURCE_DIR) + "/tests/models/hf_reference.py",
      "logits --model " + test::shell_quote(exported.string()) + " --inputs " +
          test::shell_quote(inputs) + " --out " + test::shell_quote(hf_out),
      (dir_ / "hf_logits.log").string(), "run scripts/setup to install transformers");
  ASSERT_TRUE(error.empty()) << error;
  models::LoadOptions options;
  options.dtype = torch::kFloat32;
  auto lm = models::load_pretrained(exported.string(), options);
  const auto logits = lm->logits(lm->forward(ids, mask));
  const auto hf_logits = models::SafetensorsFile(hf_out).view("logits");
  const double diff = (logits - hf_logits).abs().max().item<double>();
  std::cout << "[ measured ] tiny MoE export, rlhf vs transformers logits: max abs error " << diff
            << std::endl;
  EXPECT_LE(diff, kExportTolerance);
}

TEST_F(PpoJob, MixtureOfExpertsTrainsWithZero3OverTwoRanksAsPlanned) {
  // Experts are parameters like any other to ZeRO: sharded over the actor's 2 ranks, gathered
  // a layer at a time, an expert no token of a micro batch reached gets a zero gradient. Each
  // rank's tracked tensor peak equals the plan's (the planner counts the experts).
  const fs::path model = dir_ / "tiny-moe";
  ASSERT_EQ(rlhf({"init-model", "--preset", "tiny-moe", "--out", model.string()}).exit_code, 0);
  Result r =
      rlhf({"run",   "examples/grpo_moe_tiny.json",
            "--set", "actor.model=" + model.string(),
            "--set", "logger.run_dir=" + (dir_ / "runs").string(),
            "--set", "name=moe3",
            "--set", R"(cluster.nodes=[{"name":"local","kind":"cpu","devices":4,"memory_gb":4}])",
            "--set", "actor.devices=[0,1]",
            "--set", "actor.zero_stage=3",
            "--set", "ref.devices=[2]",
            "--set", "rollout.devices=[3]",
            "--set", "train.max_steps=3"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto m = read_metrics(run_dir("moe3") / "metrics.jsonl");
  ASSERT_EQ(m.size(), 3u);
  for (const auto& step : m) {
    EXPECT_GT(step["grad_norm"].get<double>(), 0.0);
    const auto& ranks = step["memory"]["actor"];
    ASSERT_EQ(ranks.size(), 2u);
    for (const auto& rank : ranks)
      EXPECT_EQ(rank["peak_tensor_bytes"], rank["planned_tensor_bytes"]) << rank.dump();
  }
}

}  // namespace
}  // namespace rlhf::ppo::job_test
