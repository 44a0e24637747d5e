// The real `rlhf` binary: exit codes and output of validate, plan, spec and --help.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "test_paths.h"
#include "tests/support/run_cli.h"

namespace rlhf::test {
namespace {

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(Cli, HelpListsCommandsAndExitCodes) {
  CliResult r = run_cli({"--help"});
  EXPECT_EQ(r.exit_code, 0);
  for (const char* word :
       {"validate", "plan", "spec", "exit codes: 0 success, 1 runtime failure, 2 bad input"})
    EXPECT_TRUE(contains(r.out, word)) << word << "\n" << r.out;
}

TEST(Cli, NoArgumentsOrUnknownCommandIsBadInput) {
  EXPECT_EQ(run_cli({}).exit_code, 2);
  CliResult r = run_cli({"frobnicate"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "unknown command 'frobnicate'")) << r.err;
}

TEST(Cli, EverySubcommandHasHelp) {
  for (const char* cmd : {"validate", "plan", "spec"}) {
    CliResult r = run_cli({cmd, "--help"});
    EXPECT_EQ(r.exit_code, 0) << cmd;
    EXPECT_TRUE(contains(r.out, std::string("usage: rlhf ") + cmd)) << r.out;
  }
}

TEST(Cli, ExamplesValidate) {
  for (const char* example :
       {"ppo_tiny.json", "grpo_tiny.json", "dpo_tiny.json", "sft_tiny.json", "rm_tiny.json",
        "ppo_8gpu.json", "ppo_70b.json", "grpo_moe_tiny.json", "grpo_qwen3_30b_a3b.json"}) {
    // --no-files: the examples' models (runs/models) and the 8-GPU job's files and GPUs
    // are not on every machine; checks_test.cpp covers what validate says about them.
    CliResult r = run_cli({"validate", std::string("examples/") + example, "--no-files"});
    EXPECT_EQ(r.exit_code, 0) << example << "\n" << r.err;
    EXPECT_TRUE(contains(r.out, std::string("ok: examples/") + example)) << r.out;
  }
  // The 70B layout: 72 GPUs, the rollout's 8 as two tensor-parallel engines.
  CliResult big = run_cli({"validate", "examples/ppo_70b.json", "--no-files"});
  EXPECT_TRUE(contains(big.out,
                       "72 workers on 9 nodes (actor 32, critic 16, reward 8, ref 8, "
                       "rollout 8 as 2 engines of tensor parallel size 4)"))
      << big.out;
}

TEST(Cli, ValidateReportsEveryProblemAndExits2) {
  std::string spec = write_temp(
      "bad.json", R"({"train": {"batch_size": 0}, "rollout": {"n_sample_per_prompt": 2}})");
  CliResult r = run_cli({"validate", spec});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, spec + ": ")) << r.err;
  EXPECT_TRUE(contains(r.err, "train.batch_size: expected an integer >= 1, found 0")) << r.err;
  EXPECT_TRUE(contains(r.err, "did you mean rollout.n_samples_per_prompt?")) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
}

TEST(Cli, MalformedJsonNamesLine) {
  std::string spec = write_temp("broken.json", "{\n  \"kind\": \"ppo\"\n  \"name\": \"x\"\n}\n");
  CliResult r = run_cli({"validate", spec});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "malformed JSON at line 3")) << r.err;
}

TEST(Cli, SetOverridesAreAppliedAndChecked) {
  // --no-files: the example's models are made by scripts/demo, not present in a fresh clone.
  CliResult ok =
      run_cli({"validate", "examples/ppo_tiny.json", "--no-files", "--set",
               "rollout.n_samples_per_prompt=2", "--set=train.batch_size=16", "--print"});
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  auto resolved = nlohmann::json::parse(ok.out);
  EXPECT_EQ(resolved["rollout"]["n_samples_per_prompt"], 2);
  EXPECT_EQ(resolved["train"]["batch_size"], 16);

  // 16 prompts x 3 samples = 48 is not a multiple of the example's train batch of 32.
  CliResult bad =
      run_cli({"validate", "examples/ppo_tiny.json", "--set", "rollout.n_samples_per_prompt=3"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_TRUE(contains(bad.err, "48 samples is not a multiple of train.batch_size (32)"))
      << bad.err;

  CliResult typo =
      run_cli({"validate", "examples/ppo_tiny.json", "--set", "rollout.temprature=0.5"});
  EXPECT_EQ(typo.exit_code, 2);
  EXPECT_TRUE(contains(typo.err, "did you mean rollout.temperature?")) << typo.err;
}

TEST(Cli, UsageErrorsExit2) {
  CliResult r = run_cli({"validate", "examples/ppo_tiny.json", "--bogus"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "unknown option --bogus")) << r.err;
  EXPECT_EQ(run_cli({"validate"}).exit_code, 2);
  CliResult missing = run_cli({"validate", "no/such/spec.json"});
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_TRUE(contains(missing.err, "no/such/spec.json: 1 problem")) << missing.err;
}

TEST(Cli, PlanShowsEveryWorker) {
  CliResult r = run_cli({"plan", "examples/ppo_8gpu.json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "0-3 actor+rollout, 4-5 critic, 6 reward, 7 ref")) << r.out;
  EXPECT_TRUE(contains(r.out, "CUDA_VISIBLE_DEVICES=5")) << r.out;

  CliResult j = run_cli({"plan", "examples/ppo_8gpu.json", "--json"});
  ASSERT_EQ(j.exit_code, 0) << j.err;
  auto workers = nlohmann::json::parse(j.out)["workers"];
  ASSERT_EQ(workers.size(), 12u);
  int rollout = 0;
  for (const auto& w : workers)
    if (w["role"] == "rollout") {
      EXPECT_EQ(w["colocated_with"], "actor");
      EXPECT_EQ(w["env"]["RLHF_WORLD_SIZE"], "4");
      ++rollout;
    }
  EXPECT_EQ(rollout, 4);
}

// A job is sized before any download: roles may name an architecture (preset:NAME); plan
// prints its memory, validate --no-files accepts it, and validate and run refuse it (no
// weights), exit 2, once per model.
TEST(Cli, ArchitecturePresetsArePlannedAndValidatedButNotRun) {
  const std::vector<std::string> llama = {"--set", "actor.model=preset:llama-3-8b",
                                          "--set", "critic.model=preset:llama-3-8b",
                                          "--set", "reward.model=preset:llama-3-8b"};
  std::vector<std::string> plan = {"plan", "examples/ppo_8gpu.json", "--json"};
  plan.insert(plan.end(), llama.begin(), llama.end());
  CliResult p = run_cli(plan);
  ASSERT_EQ(p.exit_code, 0) << p.err;
  const auto memory = nlohmann::json::parse(p.out)["memory"];
  EXPECT_TRUE(memory["fits"].get<bool>()) << memory.dump(1);
  // 8.03B parameters in BF16, whole on the reference GPU.
  EXPECT_EQ(memory["roles"]["ref"]["weights"], 2 * int64_t{8030261248});

  // validate refuses what run refuses; --no-files sizes the job without its files.
  CliResult v =
      run_cli({"validate", "examples/ppo_tiny.json", "--set", "actor.model=preset:llama-3-8b"});
  EXPECT_EQ(v.exit_code, 2) << v.err;
  EXPECT_TRUE(contains(v.err,
                       "actor.model (also ref, rollout): preset:llama-3-8b is an "
                       "architecture without weights"))
      << v.out << v.err;
  CliResult sized = run_cli({"validate", "examples/ppo_tiny.json", "--no-files", "--set",
                             "actor.model=preset:llama-3-8b"});
  EXPECT_EQ(sized.exit_code, 0) << sized.err;
  CliResult r = run_cli({"run", "examples/ppo_tiny.json", "--set", "actor.model=preset:llama-3-8b",
                         "--set", "logger.run_dir=" + std::string(RLHF_BINARY_DIR) + "/test-runs"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "a run needs a model directory")) << r.err;
}

// A rollout KV budget below one sequence (data.prompt_max_len + max_new_tokens in blocks) is
// bad input in the plan, which `rlhf run` makes before any worker starts: exit 2, one line.
TEST(Cli, KvBudgetBelowOnePromptIsBadInput) {
  const std::vector<std::string> spec = {
      "plan",  "examples/ppo_tiny.json",         "--set", "actor.model=preset:llama-3-8b",
      "--set", "critic.model=preset:llama-3-8b", "--set", "rollout.kv_cache_memory_gb=0.001"};
  CliResult paged = run_cli(spec);
  EXPECT_EQ(paged.exit_code, 2) << paged.out << paged.err;
  EXPECT_TRUE(contains(paged.err, "rollout.kv_cache_memory_gb: 0.001")) << paged.err;
  EXPECT_TRUE(contains(paged.err, "holds less than one sequence")) << paged.err;
}

TEST(Cli, PlanOfBadSpecExits2) {
  CliResult r = run_cli({"plan", "examples/ppo_tiny.json", "--set", "critic.devices=[0]"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "also used by actor")) << r.err;
}

TEST(Cli, SpecMarkdownIsTheCommittedReference) {
  CliResult r = run_cli({"spec", "--markdown"});
  ASSERT_EQ(r.exit_code, 0);
  std::ifstream in(std::string(RLHF_SOURCE_DIR) + "/docs/job-spec.md");
  std::stringstream committed;
  committed << in.rdbuf();
  EXPECT_EQ(r.out, committed.str());
  EXPECT_EQ(run_cli({"spec"}).exit_code, 2);
}

}  // namespace
}  // namespace rlhf::test
