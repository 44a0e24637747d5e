// `rlhf generate` end to end: a model written by `rlhf init-model` (byte tokenizer), prompts
// from --prompt and --input, JSON lines out; greedy output equals the library's Generator on
// the same checkpoint; the same seed reproduces the file; bad options are input errors.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "models/pretrained.h"
#include "rollout/generator.h"
#include "tests/support/run_cli.h"

namespace rlhf {
namespace {

using test::run_cli;

std::vector<nlohmann::json> lines_of(const std::string& text) {
  std::vector<nlohmann::json> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line));
  return out;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

class GenerateCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(test::write_temp("gen-model-dummy", "") + "-model");
    auto r = run_cli({"init-model", "--preset", "tiny", "--out", *dir_, "--dtype", "fp32", "--seed",
                      "3", "--force"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  static std::string* dir_;
};
std::string* GenerateCli::dir_ = nullptr;

TEST_F(GenerateCli, GreedyEqualsTheLibraryAndSeedsReproduce) {
  const std::string out1 = test::write_temp("gen1.jsonl", ""),
                    out2 = test::write_temp("gen2.jsonl", "");
  const std::string input =
      test::write_temp("prompts.jsonl", "{\"prompt\": \"hello\"}\n\"a longer prompt\"\n");
  auto r = run_cli({"generate", "--model", *dir_, "--input", input, "--n", "2", "--max-new-tokens",
                    "5", "--seed", "4", "--top-k", "20", "--output", out1});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run_cli({"generate", "--model", *dir_, "--input", input, "--n", "2", "--max-new-tokens", "5",
               "--seed", "4", "--top-k", "20", "--output", out2});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto a = lines_of(slurp(out1));
  ASSERT_EQ(a.size(), 4u);
  EXPECT_EQ(slurp(out1), slurp(out2));
  EXPECT_EQ(a[0]["prompt"], "hello");
  EXPECT_EQ(a[3]["prompt"], "a longer prompt");
  EXPECT_EQ(a[3]["sample"], 1);
  for (const auto& j : a) EXPECT_LE(j["response_ids"].size(), 5u);

  r = run_cli({"generate", "--model", *dir_, "--prompt", "hello", "--temperature", "0",
               "--max-new-tokens", "6", "--output", out1});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto greedy = lines_of(slurp(out1));
  ASSERT_EQ(greedy.size(), 1u);
  // The library on the same checkpoint, with the prompt ids `rlhf tokenize` gives (this
  // test does not link the tokenizer library: see CMakeLists.txt).
  auto model = models::load_pretrained(*dir_);
  r = run_cli({"tokenize", "--tokenizer", *dir_, "--text", "hello", "--add-special"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto ids = nlohmann::json::parse(r.out).get<std::vector<int64_t>>();
  rollout::GenerationConfig config;
  config.max_new_tokens = 6;
  config.stop_token_ids = {model->config().eos_token_id};
  rollout::Generator generator(model, config);
  rollout::SamplingParams params;
  params.temperature = 0;
  auto prompt = torch::tensor(ids, torch::kInt64).unsqueeze(0);
  auto out = generator.generate(prompt, torch::ones_like(prompt), params);
  std::vector<int64_t> expected;
  for (int64_t t = 0; t < out.response_lengths[0].item<int64_t>(); ++t)
    expected.push_back(out.sequences[0][out.prompt_length + t].item<int64_t>());
  EXPECT_EQ(greedy[0]["response_ids"].get<std::vector<int64_t>>(), expected);
}

// Issue 40.2: `rlhf generate` runs the engine a job runs. Without --spec: the spec's defaults
// (the paged KV cache in blocks of rollout.kv_block_size's 16 tokens; before, the contiguous
// cache no job runs); with --spec: that job's rollout section (grpo_tiny's 8 samples per
// prompt, here blocks of 32 and 3 new tokens by --set), the options overriding it.
TEST_F(GenerateCli, RunsTheEngineAJobRuns) {
  auto r = run_cli({"generate", "--model", *dir_, "--prompt", "hello", "--max-new-tokens", "4"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("paged KV cache, blocks of 16 tokens (the job spec's defaults)"),
            std::string::npos)
      << r.err;
  const std::string out = test::write_temp("gen-spec.jsonl", "");
  r = run_cli({"generate", "--model", *dir_, "--prompt", "hello", "--spec",
               "examples/grpo_tiny.json", "--set", "rollout.kv_block_size=32", "--set",
               "rollout.max_new_tokens=3", "--output", out});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("1 prompt x 8 samples, at most 3 new tokens; paged KV cache, blocks of 32 "
                       "tokens (the rollout section of examples/grpo_tiny.json)"),
            std::string::npos)
      << r.err;
  const auto lines = lines_of(slurp(out));
  ASSERT_EQ(lines.size(), 8u);
  for (const auto& j : lines) EXPECT_LE(j["response_ids"].size(), 3u);
  r = run_cli({"generate", "--model", *dir_, "--prompt", "hi", "--set", "rollout.top_k=3"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--set needs --spec"), std::string::npos) << r.err;
}

TEST_F(GenerateCli, TextOutputForOnePromptAndInputErrors) {
  auto r = run_cli(
      {"generate", "--model", *dir_, "--prompt", "hi", "--n", "2", "--max-new-tokens", "3"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("--- sample 0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--- sample 1"), std::string::npos) << r.out;
  r = run_cli({"generate", "--model", *dir_, "--prompt", "hi", "--top-p", "1.5"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("top_p"), std::string::npos) << r.err;
  r = run_cli({"generate", "--model", *dir_});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--prompt"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace rlhf
