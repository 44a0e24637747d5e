// A generative judge end to end (issue 44.2): grpo_tiny with a judge source beside its letters
// rule, the judge a real chat-completions server in this process; every sample is judged once
// per step, the judge's scores reach the reward as weighted, and its unparsed replies are
// counted in metrics.jsonl; `rlhf reward --verbose` shows the raw verdicts; a judge entry
// without its endpoint is refused by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <fstream>
#include <iostream>
#include <sstream>

#include "tests/ppo/ppo_job.h"
#include "tests/support/chat_server.h"

namespace rlhf::ppo::job_test {
namespace {

// The server's rule, on the rendered prompt (the template is the bare response): "yes" for an
// even length, "no" for an odd one, an unreadable reply for an empty response. It counts its
// verdicts, so the test knows what the job must have logged.
struct Verdicts {
  std::atomic<int64_t> yes{0}, no{0}, unreadable{0};
  std::vector<std::string> operator()(const std::string& response, int64_t n) {
    const char* verdict = response.empty()           ? "I cannot tell."
                          : response.size() % 2 == 0 ? "yes"
                                                     : "no";
    (response.empty() ? unreadable : response.size() % 2 == 0 ? yes : no) += n;
    return std::vector<std::string>(static_cast<size_t>(n), verdict);
  }
};

class JudgeJob : public PpoJob {
 protected:
  void SetUp() override {
    PpoJob::SetUp();
    std::ofstream(dir_ / "judge.jinja") << "{{ response }}";
  }
  std::string sources(const std::string& url) const {
    return R"(reward.sources=[{"rule": "letters"}, {"name": "parity", "weight": 0.5, "judge": )"
           R"({"url": ")" +
           url + R"(", "template": ")" + (dir_ / "judge.jinja").string() +
           R"(", "score": "choice:yes,no"}}])";
  }
};

TEST_F(JudgeJob, EverySampleIsJudgedAndUnparsedRepliesAreCounted) {
  Verdicts verdicts;
  test::ChatServer server([&](const std::string& c, int64_t n) { return verdicts(c, n); });
  Result r =
      run("judged",
          {"--set", "reward.rule=", "--set", sources(server.url()), "--set", "train.max_steps=3"},
          "examples/grpo_tiny.json");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto m = read_metrics(run_dir("judged") / "metrics.jsonl");
  ASSERT_EQ(m.size(), 3u);
  double yes = 0;
  int64_t unparsed = 0;
  for (const json& step : m) {
    // 8 prompts x 8 samples, one vote each.
    EXPECT_EQ(step["judge"]["parity"]["votes"], 64) << step.dump();
    unparsed += step["judge"]["parity"]["unparsed"].get<int64_t>();
    yes += step["reward"]["parity"].get<double>() * 64;
    // The reward is letters + 0.5 x the judge's score.
    EXPECT_NEAR(
        step["reward_mean"].get<double>(),
        step["reward"]["letters"].get<double>() + 0.5 * step["reward"]["parity"].get<double>(),
        1e-5);
  }
  EXPECT_EQ(verdicts.yes + verdicts.no + verdicts.unreadable, 3 * 64);
  EXPECT_NEAR(yes, static_cast<double>(verdicts.yes), 1e-3);
  EXPECT_EQ(unparsed, verdicts.unreadable.load());
}

TEST_F(JudgeJob, RlhfRewardShowsTheVerdictsAndAMissingEndpointIsNamed) {
  Verdicts verdicts;
  test::ChatServer server([&](const std::string& c, int64_t n) { return verdicts(c, n); });
  const fs::path rows = dir_ / "rows.jsonl";
  std::ofstream(rows) << R"({"prompt": "p", "response": "ab", "label": ""})"
                      << "\n"
                      << R"({"prompt": "p", "response": "", "label": ""})"
                      << "\n";
  Result r = rlhf({"reward", "examples/grpo_tiny.json", "--set", "reward.rule=", "--set",
                   sources(server.url()), "--input", rows.string(), "--verbose"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<json> lines;
  std::istringstream out(r.out);
  for (std::string line; std::getline(out, line);) lines.push_back(json::parse(line));
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0]["sources"]["parity"], 1.0);
  EXPECT_EQ(lines[0]["judges"]["parity"], json::array({"yes"}));
  EXPECT_EQ(lines[1]["sources"]["parity"], 0.0);  // unreadable: the default
  EXPECT_EQ(lines[1]["judges"]["parity"], json::array({"I cannot tell."}));
  EXPECT_NE(r.err.find("judge \"parity\": 1 of 2 replies did not parse"), std::string::npos)
      << r.err;

  // Without a url the judge runs on the job's judge group: judge.model is then required, and
  // "model" (the endpoint's model name) means nothing.
  Result bad =
      rlhf({"validate", "examples/grpo_tiny.json", "--no-files", "--set", "reward.rule=", "--set",
            R"(reward.sources=[{"judge": {"template": "t.jinja", "score": "x", "model": "m"}}])"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("judge.model: required for a ppo job: the generative judge's model"),
            std::string::npos)
      << bad.err;
  EXPECT_NE(bad.err.find("reward.sources[0].judge.model: names the endpoint's model, but this "
                         "judge has no url"),
            std::string::npos)
      << bad.err;
}

TEST_F(JudgeJob, AJudgeWithoutAUrlRunsOnTheJobsJudgeGroup) {
  // The tiny model judges on a fourth device through rlhf's paged engine, greedily: its verdict
  // is the first digit it writes (a number 0-9; none: the default 0, counted). The letters rule
  // is measured at weight 0, so each logged sample's reward is the judge's score, which `rlhf
  // generate` of the same model on the same text (greedy, FP32, the same 8 tokens) reproduces.
  // The template shows the judge the prompt: an untrained actor's responses are arbitrary bytes,
  // which samples.jsonl stores with invalid UTF-8 replaced, so they could not be re-judged.
  const fs::path tiny = dir_ / "tiny";
  std::ofstream(dir_ / "prompt.jinja") << "Is this a word? {{ prompt }}";
  const std::vector<std::string> judged = {
      "--set",
      R"(cluster.nodes=[{"name":"local","kind":"cpu","devices":4,"memory_gb":4}])",
      "--set",
      "judge.model=" + tiny.string(),
      "--set",
      "judge.devices=[3]",
      "--set",
      "judge.dtype=fp32",
      "--set",
      "reward.rule=",
      "--set",
      R"(reward.sources=[{"rule": "letters", "weight": 0}, {"name": "digit", "judge": )"
      R"({"template": ")" +
          (dir_ / "prompt.jinja").string() + R"J(", "score": "([0-9])", "max_tokens": 8}}])J"};
  auto run_args = judged;
  run_args.insert(run_args.end(),
                  {"--set", "train.max_steps=2", "--set", "logger.samples_per_step=64"});
  Result r = run("local", run_args, "examples/grpo_tiny.json");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto m = read_metrics(run_dir("local") / "metrics.jsonl");
  ASSERT_EQ(m.size(), 2u);
  for (const json& step : m) {
    EXPECT_EQ(step["judge"]["digit"]["votes"], 64) << step.dump();  // 8 prompts x 8 samples
    EXPECT_LE(step["judge"]["digit"]["unparsed"].get<int64_t>(), 64);
    EXPECT_EQ(step["memory"]["judge"].size(), 1u) << step["memory"].dump();
  }
  // The logged samples' rewards against the same model's greedy replies via `rlhf generate`.
  std::vector<json> rows;
  {
    std::ofstream in(dir_ / "judge_prompts.jsonl");
    for (const json& row : test::read_jsonl((run_dir("local") / "samples.jsonl").string())) {
      if (row.value("split", "") == "eval") continue;
      rows.push_back(row);
      in << json{{"prompt", "Is this a word? " + row["prompt"].get<std::string>()}}.dump() << "\n";
    }
  }
  ASSERT_FALSE(rows.empty());
  Result g =
      rlhf({"generate", "--model", tiny.string(), "--input",
            (dir_ / "judge_prompts.jsonl").string(), "--temperature", "0", "--max-new-tokens", "8",
            "--dtype", "fp32", "--output", (dir_ / "verdicts.jsonl").string()});
  ASSERT_EQ(g.exit_code, 0) << g.err;
  const auto replies = test::read_jsonl((dir_ / "verdicts.jsonl").string());
  ASSERT_EQ(replies.size(), rows.size());
  int parsed = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const std::string reply = replies[i]["response"].get<std::string>();
    const auto digit = std::find_if(reply.begin(), reply.end(), ::isdigit);
    const double want = digit == reply.end() ? 0.0 : static_cast<double>(*digit - '0');
    parsed += digit != reply.end();
    EXPECT_NEAR(rows[i]["reward"].get<double>(), want, 1e-6) << rows[i].dump() << " " << reply;
  }
  std::cout << "[ measured ] local judge: " << parsed << " of " << rows.size()
            << " logged verdicts held a digit" << std::endl;
  EXPECT_GT(parsed, 0);  // some verdicts parse, so the scores are not all the default

  // `rlhf reward --verbose` runs the same judge in its own process: the same replies.
  {
    std::ofstream in(dir_ / "reward_rows.jsonl");
    for (const json& row : rows)
      in << json{{"prompt", row["prompt"]}, {"response", "x"}}.dump() << "\n";
  }
  std::vector<std::string> reward_args = {"reward", "examples/grpo_tiny.json"};
  reward_args.insert(reward_args.end(), judged.begin(), judged.end());
  reward_args.insert(reward_args.end(),
                     {"--input", (dir_ / "reward_rows.jsonl").string(), "--verbose"});
  Result scored = rlhf(reward_args);
  ASSERT_EQ(scored.exit_code, 0) << scored.err;
  std::istringstream lines(scored.out);
  size_t i = 0;
  for (std::string line; std::getline(lines, line); ++i) {
    ASSERT_LT(i, rows.size());
    const json j = json::parse(line);
    EXPECT_EQ(j["judges"]["digit"], json::array({replies[i]["response"]})) << line;
    EXPECT_NEAR(j["sources"]["digit"].get<double>(), rows[i]["reward"].get<double>(), 1e-6);
  }
  EXPECT_EQ(i, rows.size());
}

}  // namespace
}  // namespace rlhf::ppo::job_test
