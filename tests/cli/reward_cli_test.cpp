// `rlhf reward`: the spec's reward sources (rules, the math verifier, the format rule, Python
// functions in rlhf's process pool) score rows without a job, and bad input is named (exit 2).
#include <gtest/gtest.h>

#include <sstream>

#include "tests/support/run_cli.h"

namespace rlhf::test {
namespace {

using nlohmann::json;

std::vector<json> lines_of(const std::string& out) {
  std::vector<json> rows;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) rows.push_back(json::parse(line));
  return rows;
}

// A ppo spec (the tiny model is not loaded by `rlhf reward`) with these reward keys.
std::string spec_with(const std::string& name, const json& reward) {
  json spec = {{"kind", "ppo"},
               {"actor", {{"model", "unused"}}},
               {"data", {{"prompt_dataset", "synthetic:arith"}}},
               {"rollout", {{"n_samples_per_prompt", 2}}},
               {"algo", {{"advantage", {{"estimator", "group_norm"}}}}},
               {"reward", reward}};
  return write_temp(name + ".json", spec.dump());
}

const std::string kRows =
    R"({"prompt": "What is 2 + 3?", "response": "<think>2 plus 3</think> The answer is 5.", )"
    R"("label": "5", "level": 1})"
    "\n"
    R"({"prompt": "What is 6 x 7?", "response": "It is \\boxed{42}", "label": "42", "level": 2})"
    "\n"
    R"({"prompt": "What is 9 - 4?", "response": "I think 6", "label": "5", "level": 3})"
    "\n";

TEST(RewardCli, WeightedSourcesScoreEachRowAndNameEachSource) {
  const std::string py =
      write_temp("rewards_ok.py",
                 "def short(prompts, completions, labels, **row):\n"
                 "    return [1.0 if len(c) < 20 else 0.0 for c in completions]\n"
                 "def level(completions, level, **kwargs):\n"
                 "    return [float(x) for x in level]\n");
  const json reward = {{"sources",
                        {{{"rule", "math"}, {"name", "correct"}},
                         {{"rule", "format"}, {"pattern", "<think>.*</think>.*"}, {"weight", 0.5}},
                         {{"python", py + ":short"}, {"weight", 0.25}},
                         {{"python", py + ":level"}, {"weight", 0.0}}}}};
  const auto r = run_cli({"reward", spec_with("reward-ok", reward), "--input",
                          write_temp("rows.jsonl", kRows), "--set", "reward.python_workers=2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto rows = lines_of(r.out);
  ASSERT_EQ(rows.size(), 3u);
  // Row 1: correct, formatted, long; row 2: correct, unformatted, short; row 3: wrong, short.
  const double want[3][4] = {{1, 1, 0, 1}, {1, 0, 1, 2}, {0, 0, 1, 3}};
  const char* names[4] = {"correct", "format", "short", "level"};
  for (size_t i = 0; i < 3; ++i) {
    double total = 0;
    const double weights[4] = {1, 0.5, 0.25, 0};
    for (int k = 0; k < 4; ++k) {
      EXPECT_DOUBLE_EQ(rows[i]["sources"][names[k]].get<double>(), want[i][k]) << i << names[k];
      total += weights[k] * want[i][k];
    }
    EXPECT_DOUBLE_EQ(rows[i]["reward"].get<double>(), total) << "row " << i;
  }
}

TEST(RewardCli, BadSourcesAreNamedWithExitTwo) {
  const std::string rows = write_temp("rows2.jsonl", kRows);
  // A Python file that does not exist.
  auto r = run_cli({"reward", spec_with("reward-missing", {{"python", "/nonexistent/r.py:f"}}),
                    "--input", rows});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("/nonexistent/r.py"), std::string::npos) << r.err;
  // A function with the wrong signature (no labels/**kwargs).
  const std::string py = write_temp("rewards_bad.py", "def two(a, b):\n    return [0.0]\n");
  r = run_cli({"reward", spec_with("reward-sig", {{"python", py + ":two"}}), "--input", rows});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find(py + ":two"), std::string::npos) << r.err;
  // A label the math verifier cannot read names the source and the sample.
  r = run_cli({"reward", spec_with("reward-label", {{"rule", "math"}}), "--input",
               write_temp("rows-bad-label.jsonl",
                          R"({"prompt": "p", "response": "42", "label": "42"}
{"prompt": "p", "response": "42", "label": ""}
)")});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("sample 2"), std::string::npos) << r.err;
  // Spec rules: two kinds in one entry, an unknown field, format without a pattern.
  r = run_cli({"reward",
               spec_with("reward-two", {{"sources", {{{"rule", "math"}, {"python", "a.py:f"}}}}}),
               "--input", rows});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("reward.sources[0]: expected exactly one of"), std::string::npos) << r.err;
  r = run_cli({"reward",
               spec_with("reward-field", {{"sources", {{{"rule", "math"}, {"wieght", 2}}}}}),
               "--input", rows});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("did you mean weight"), std::string::npos) << r.err;
  r = run_cli({"reward", spec_with("reward-format", {{"rule", "format"}}), "--input", rows});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("reward.format_pattern"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace rlhf::test
