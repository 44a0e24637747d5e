// LoRA beyond the SFT actor (issue 30.1, 30.2) through the real `rlhf` binary: a reward model
// trained with adapters (its value head trained whole beside them) learns, checkpoints only
// adapters and head, and exports a PEFT adapter that PEFT loads on
// AutoModelForSequenceClassification to rlhf's scores; a DPO job with a LoRA actor starts no
// ref workers (the actor with its adapters off is the reference: zero implicit rewards at
// step 1) and learns.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <set>

#include "models/lora.h"
#include "models/pretrained.h"
#include "models/safetensors.h"
#include "test_paths.h"
#include "tests/support/checkpoint_counts.h"
#include "tests/support/plan_check.h"
#include "tests/support/run_cli.h"

namespace rlhf::dpo {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Result = test::CliResult;

struct Records {
  std::vector<json> steps, evals;
};
Records records(const fs::path& metrics) {
  Records r;
  for (const json& j : test::read_jsonl(metrics.string()))
    (j.value("split", "") == "eval" ? r.evals : r.steps).push_back(j);
  return r;
}

std::set<std::string> worker_roles(const fs::path& run_dir) {
  std::set<std::string> roles;
  for (const auto& w : json::parse(test::slurp((run_dir / "workers.json").string())))
    roles.insert(w["role"].get<std::string>());
  return roles;
}

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// rlhf's scores (the value head at the last token) of `sequences` under the value model
// `base` with the adapter directory `adapter` (FP32, one sequence at a time).
std::vector<double> rlhf_scores(const fs::path& base, const fs::path& adapter,
                                const std::vector<std::vector<int64_t>>& sequences) {
  models::LoadOptions load;
  load.dtype = torch::kFloat32;
  load.head = models::HeadKind::kValue;
  auto model = models::load_pretrained(base.string(), load);
  if (!adapter.empty()) models::load_adapter(*model, adapter.string());
  model->eval();
  torch::NoGradGuard no_grad;
  std::vector<double> out;
  for (const auto& seq : sequences) {
    auto ids = torch::tensor(seq, torch::kLong).unsqueeze(0);
    auto mask = torch::ones_like(ids);
    out.push_back(
        models::last_token_values(model->values(model->forward(ids, mask)), mask).item<double>());
  }
  return out;
}

class LoraRoles : public testing::Test {
 protected:
  void SetUp() override { dir_ = test::tiny_models_dir("lora-roles"); }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }
  Result run(const std::string& example, const std::string& name, std::vector<std::string> extra) {
    std::vector<std::string> args = {
        "run",   example,        "--set", "logger.run_dir=" + (dir_ / "runs").string(),
        "--set", "name=" + name, "--set", "logger.logging_steps=1"};
    args.insert(args.end(), extra.begin(), extra.end());
    return test::run_cli(args);
  }
  fs::path run_dir(const std::string& name) const { return dir_ / "runs" / name; }
  fs::path dir_;
};

TEST_F(LoraRoles, RewardModelWithLoraLearnsAndExportsAPeftClassifier) {
  const fs::path base = dir_ / "tiny-value";
  Result r = run(
      "examples/rm_tiny.json", "rm",
      {"--set", "reward.model=" + base.string(), "--set", "reward.dtype=fp32", "--set",
       "reward.lora.rank=8", "--set", "reward.lora.alpha=16", "--set", "reward.adam.lr=3e-3",
       "--set", "data.max_samples=128", "--set", "reward.lora.export_merged=true",
       // Issue 41.1: ZeRO-3 over two ranks, the frozen base sharded between them.
       "--set", R"(cluster.nodes=[{"name": "local", "kind": "cpu", "devices": 2, "memory_gb": 4}])",
       "--set", "reward.devices=[0,1]", "--set", "reward.zero_stage=3"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(worker_roles(run_dir("rm")), (std::set<std::string>{"reward"}));
  const Records m = records(run_dir("rm") / "metrics.jsonl");
  ASSERT_EQ(m.evals.size(), 2u);
  std::cout << "[ measured ] LoRA RM held-out accuracy " << m.evals[0]["eval_accuracy"] << " -> "
            << m.evals[1]["eval_accuracy"] << std::endl;
  // 256 held-out pairs: chance is 0.5 +- 0.031, so 0.75 is 8 sigma (as the full RM test).
  EXPECT_GT(m.evals[1]["eval_accuracy"].get<double>(), 0.75) << m.evals[1].dump();
  EXPECT_GT(m.evals[1]["eval_accuracy"].get<double>(), m.evals[0]["eval_accuracy"].get<double>());
  // The plan counts the frozen base, the adapters' and the head's states as the tracker does.
  const auto phases = test::expect_tracked_phases_match(run_dir("rm").string());
  EXPECT_EQ(phases.count("reward") ? phases.at("reward").count("train") : 0u, 1u);

  // The export: PEFT's adapter directory with the value head saved whole as PEFT saves a
  // sequence classifier's score (modules_to_save, task_type SEQ_CLS).
  const fs::path adapter = run_dir("rm") / "export" / "reward";
  ASSERT_TRUE(fs::exists(adapter / "adapter_config.json"));
  EXPECT_FALSE(fs::exists(adapter / "model.safetensors"));
  const json config = json::parse(test::slurp((adapter / "adapter_config.json").string()));
  EXPECT_EQ(config["task_type"], "SEQ_CLS");
  EXPECT_EQ(config["modules_to_save"], json::array({"score"}));
  models::SafetensorsFile weights((adapter / "adapter_model.safetensors").string());
  int64_t exported = 0;
  for (const auto& info : weights.tensors()) exported += numel(info.shape);
  EXPECT_EQ(weights.tensors().size(), 2u * 7 * 2 + 1);  // 2 layers x 7 x (A, B), the head
  const auto head = weights.view("base_model.model.score.weight");
  models::SafetensorsFile base_file((base / "model.safetensors").string());
  EXPECT_GT((head - base_file.view("score.weight").to(torch::kFloat32)).abs().max().item<double>(),
            0.0)
      << "the value head was not trained";

  // Only adapters and head are checkpointed: master = exported elements over the two ranks
  // (each unit's even count halves exactly), 3x in all (FP32).
  fs::path shard;
  for (const auto& f : fs::recursive_directory_iterator(run_dir("rm")))
    if (f.path().filename() == "rank_00000.safetensors") shard = f.path();
  ASSERT_FALSE(shard.empty()) << "no checkpoint written";
  const auto counts = test::fp32_elements(shard.string());
  EXPECT_EQ(counts.master, exported / 2);
  EXPECT_EQ(counts.total, 3 * exported / 2);

  // PEFT loads the export on AutoModelForSequenceClassification and scores as rlhf does
  // (FP32 both; 1e-5 as the causal-LM adapter checks in lora_test.cpp).
  const std::vector<std::vector<int64_t>> sequences = {{1, 40, 41, 42, 58, 40, 41, 42, 2},
                                                       {1, 100, 7, 200, 33, 250, 9, 17}};
  const fs::path seqs = dir_ / "seqs.json", out = dir_ / "peft.json";
  std::ofstream(seqs) << json(sequences).dump();
  const auto ours = rlhf_scores(base, adapter, sequences);
  const auto untrained = rlhf_scores(base, {}, sequences);
  // The merged export (W + scale B A, the trained head) scores the same (FP32, 1e-5).
  const auto merged = rlhf_scores(fs::path(adapter.string() + "-merged"), {}, sequences);
  const std::string cmd = "OMP_NUM_THREADS=1 timeout 300 '" + std::string(RLHF_PYTHON) + "' '" +
                          RLHF_SOURCE_DIR + "/tests/models/peft_reference.py' values --model '" +
                          base.string() + "' --adapter '" + adapter.string() + "' --inputs '" +
                          seqs.string() + "' --out '" + out.string() + "' > '" +
                          (dir_ / "peft.log").string() + "' 2>&1";
  const int status = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << cmd << "\n"
      << test::slurp((dir_ / "peft.log").string());
  const auto peft = json::parse(test::slurp(out.string())).get<std::vector<double>>();
  ASSERT_EQ(peft.size(), ours.size());
  double error = 0, moved = 0;
  for (size_t i = 0; i < ours.size(); ++i) {
    EXPECT_NEAR(merged[i], ours[i], 1e-5) << "sequence " << i;
    error = std::max(error, std::abs(peft[i] - ours[i]));
    moved = std::max(moved, std::abs(untrained[i] - ours[i]));
  }
  std::cout << "[ measured ] PEFT vs rlhf scores of the LoRA RM: max abs error " << error
            << " (training moved them by up to " << moved << ")" << std::endl;
  EXPECT_LE(error, 1e-5);
  EXPECT_GT(moved, 1e-3);

  // The same adapter on a causal-LM role: its saved value head has nowhere to go, refused by
  // key and tensor before any worker starts.
  Result sft = run("examples/sft_tiny.json", "sft-with-rm-adapter",
                   {"--set", "actor.model=" + (dir_ / "tiny").string(), "--set",
                    "actor.lora.adapter=" + adapter.string()});
  EXPECT_NE(sft.exit_code, 0);
  for (const std::string& part :
       {std::string("actor.lora.adapter"), std::string("base_model.model.score.weight")})
    EXPECT_NE(sft.err.find(part), std::string::npos) << part << "\n" << sft.err;
  EXPECT_FALSE(fs::exists(run_dir("sft-with-rm-adapter") / "workers.json"));
}

TEST_F(LoraRoles, DpoWithALoraActorIsItsOwnReference) {
  Result r = run(
      "examples/dpo_tiny.json", "dpo",
      {"--set", "actor.model=" + (dir_ / "tiny").string(), "--set", "actor.dtype=fp32", "--set",
       "actor.lora.rank=16", "--set", "actor.lora.alpha=32", "--set", "actor.adam.lr=3e-3", "--set",
       "ref.devices=[]", "--set", "data.max_samples=64", "--set", "ckpt.export_hf=false",
       // Issue 41.1: ZeRO-3 over two ranks, so the reference reads the base sharded.
       "--set", "actor.devices=[0,1]", "--set", "actor.zero_stage=3"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  // No ref workers: the actor's own workers gave the reference log-probs, adapters off.
  EXPECT_EQ(worker_roles(run_dir("dpo")), (std::set<std::string>{"actor"}));
  EXPECT_NE(r.out.find("computed on the actor group (LoRA adapters off)"), std::string::npos)
      << r.out;
  const auto phases = test::expect_tracked_phases_match(run_dir("dpo").string());
  EXPECT_EQ(phases.count("ref"), 0u);
  const Records m = records(run_dir("dpo") / "metrics.jsonl");
  ASSERT_GE(m.steps.size(), 4u);
  ASSERT_EQ(m.evals.size(), 2u);
  // Step 1, before any update: B = 0, so the policy is the base model and each implicit
  // reward beta (log pi - log pi_ref) is exactly 0, not just small.
  EXPECT_EQ(m.steps[0]["chosen_reward"].get<double>(), 0.0) << m.steps[0].dump();
  EXPECT_EQ(m.steps[0]["rejected_reward"].get<double>(), 0.0) << m.steps[0].dump();
  EXPECT_EQ(m.steps[0]["margin"].get<double>(), 0.0) << m.steps[0].dump();
  EXPECT_NEAR(m.steps[0]["loss"].get<double>(), std::log(2.0), 1e-6);
  // It learns: the held-out preference accuracy and margin rise.
  std::cout << "[ measured ] LoRA DPO held-out accuracy " << m.evals[0]["eval_accuracy"] << " -> "
            << m.evals[1]["eval_accuracy"] << ", margin " << m.evals[1]["eval_margin"] << std::endl;
  EXPECT_GT(m.evals[1]["eval_accuracy"].get<double>(),
            m.evals[0]["eval_accuracy"].get<double>() + 0.1);
  EXPECT_GT(m.evals[1]["eval_margin"].get<double>(), 0.0);
}

}  // namespace
}  // namespace rlhf::dpo
