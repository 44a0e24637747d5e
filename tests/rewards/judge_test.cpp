// Generative judges (issue 44.2, rewards/judge.h): the template's placeholders and refusals,
// the verdict parsers (a regular expression, choices), votes averaged with unparsed replies at
// the default and counted, and the chat-completions exchange with a real HTTP server on
// 127.0.0.1 (what it was sent, its failures named), through RewardSources as a job uses it.
#include "rewards/judge.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "core/errors.h"
#include "rewards/reward_sources.h"
#include "tests/support/chat_server.h"

namespace rlhf::rewards {
namespace {

namespace fs = std::filesystem;
namespace http = boost::beast::http;
using nlohmann::json;
using test::ChatServer;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(JudgeTemplate, FillsThePlaceholdersAndRefusesWhatItCannotRender) {
  const auto t = JudgeTemplate::parse(
      "Q: {{prompt}}\nA: {{ response }}\nReference: {{  label }}. Correct?", "judge.jinja");
  EXPECT_EQ(t.render("What is 2+2?", "4", "4"), "Q: What is 2+2?\nA: 4\nReference: 4. Correct?");
  EXPECT_EQ(JudgeTemplate::parse("no placeholders", "x").render("p", "r", "l"), "no placeholders");
  EXPECT_EQ(error_of([] { JudgeTemplate::parse("line 1\n{{ answer }}", "judge.jinja"); }),
            "judge.jinja:2: unknown placeholder {{ answer }} (expected prompt, response or label)");
  EXPECT_NE(error_of([] {
              JudgeTemplate::parse("{% if label %}x{% endif %}", "t.jinja");
            }).find("t.jinja:1: a Jinja statement"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              JudgeTemplate::load("/nonexistent/judge.jinja");
            }).find("/nonexistent/judge.jinja: cannot read"),
            std::string::npos);
}

TEST(VerdictParser, ChoicesScoreByPositionAndARegexReadsItsGroup) {
  const VerdictParser yes_no("choice:yes,no");
  EXPECT_EQ(yes_no.parse("Yes, the answer is right."), 1.0);
  EXPECT_EQ(yes_no.parse("NO."), 0.0);
  EXPECT_EQ(yes_no.parse("No, not yes."), 0.0);                      // the earliest choice wins
  EXPECT_EQ(yes_no.parse("Eyes open: nobody knows"), std::nullopt);  // whole words only
  const VerdictParser grades("choice:A,B,C");
  EXPECT_EQ(grades.parse("Grade: B"), 0.5);
  EXPECT_EQ(grades.parse("C"), 0.0);
  const VerdictParser score("Score: ([0-9.]+)");
  EXPECT_EQ(score.parse("Reasoning... Score: 7.5 out of 10"), 7.5);
  EXPECT_EQ(score.parse("I cannot decide."), std::nullopt);
  EXPECT_EQ(VerdictParser("[0-9]+").parse("rated 8"), 8.0);  // no group: the whole match
  EXPECT_NE(error_of([] { VerdictParser("choice:yes"); }).find("at least two choices"),
            std::string::npos);
  EXPECT_NE(error_of([] { VerdictParser("Score: ([0-9"); }).find("not a regular expression"),
            std::string::npos);
}

class JudgeSource : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("rlhf-judge-" + std::to_string(getpid()));
    fs::create_directories(dir_);
    std::ofstream(dir_ / "judge.jinja") << "Question: {{ prompt }}\nAnswer: {{ response }}\n"
                                           "Correct answer: {{ label }}\nIs it right?";
  }
  void TearDown() override { fs::remove_all(dir_); }
  // A reward.sources list of one judge (and the letters rule beside it).
  RewardSourcesConfig config(const std::string& url, json extra = json::object()) const {
    json judge = {{"url", url},
                  {"template", (dir_ / "judge.jinja").string()},
                  {"score", "choice:yes,no"},
                  {"model", "smol-judge"}};
    judge.update(extra);
    RewardSourcesConfig c;
    c.sources = json::array(
        {{{"kind", "judge"}, {"name", "judge"}, {"weight", 2.0}, {"judge", judge}},
         {{"kind", "rule"}, {"name", "letters"}, {"weight", 1.0}, {"rule", "letters"}}});
    c.remote_timeout_s = 5;
    return c;
  }
  fs::path dir_;
};

// The server's verdict for a rendered prompt: "yes" when the answer equals the correct one,
// "no" when it differs, and a reply that names neither for the answer "?".
std::vector<std::string> grade(const std::string& content, int64_t n) {
  const auto line = [&](const std::string& key) {
    const size_t at = content.find(key) + key.size();
    return content.substr(at, content.find('\n', at) - at);
  };
  const std::string answer = line("Answer: "), truth = line("Correct answer: ");
  std::vector<std::string> out;
  for (int64_t v = 0; v < n; ++v)
    out.push_back(answer == "?" ? "I am not sure." : answer == truth ? "Yes." : "No, it is not.");
  return out;
}

TEST_F(JudgeSource, ScoresEverySampleAndSendsTheRenderedPrompt) {
  ChatServer server(grade);
  RewardSources sources(config(server.url()));
  const auto scored = sources.score({"2+2?", "3*3?", "1+1?"}, {"4", "8", "?"}, {"4", "9", "2"});
  ASSERT_EQ(scored.sources.size(), 2u);
  const SourceScores& judge = scored.sources[0];
  EXPECT_EQ(judge.scores, (std::vector<double>{1.0, 0.0, 0.0}));  // "?" unparsed: the default 0
  EXPECT_EQ(judge.votes, 3);
  EXPECT_EQ(judge.unparsed, 1);
  EXPECT_EQ(judge.replies[2], (std::vector<std::string>{"I am not sure."}));
  EXPECT_EQ(scored.sources[1].unparsed, -1);  // not a judge
  // The weighted sum: 2 x judge + letters.
  EXPECT_DOUBLE_EQ(scored.total[0], 2.0 + scored.sources[1].scores[0]);
  // One request per sample, greedy by default, with the template rendered.
  const auto requests = server.requests();
  ASSERT_EQ(requests.size(), 3u);
  bool seen = false;
  for (const json& r : requests) {
    EXPECT_EQ(r["model"], "smol-judge");
    EXPECT_EQ(r["n"], 1);
    EXPECT_EQ(r["temperature"], 0.0);
    EXPECT_EQ(r["max_tokens"], 64);
    seen |=
        r["messages"][0]["content"] == "Question: 3*3?\nAnswer: 8\nCorrect answer: 9\nIs it right?";
  }
  EXPECT_TRUE(seen);
}

TEST_F(JudgeSource, VotesAreAveragedWithUnparsedOnesAtTheDefault) {
  // Three sampled votes per sample: yes, no, unreadable -> (1 + 0 + 0.5) / 3 at default 0.5.
  ChatServer server([](const std::string&, int64_t n) {
    std::vector<std::string> out = {"yes", "no", "maybe"};
    out.resize(static_cast<size_t>(n), "yes");
    return out;
  });
  RewardSources sources(
      config(server.url(), {{"votes", 3}, {"temperature", 0.8}, {"default", 0.5}}));
  const auto scored = sources.score({"p", "q"}, {"r", "s"}, {"", ""});
  EXPECT_NEAR(scored.sources[0].scores[0], 1.5 / 3, 1e-12);
  EXPECT_NEAR(scored.sources[0].scores[1], 1.5 / 3, 1e-12);
  EXPECT_EQ(scored.sources[0].votes, 6);
  EXPECT_EQ(scored.sources[0].unparsed, 2);
  EXPECT_EQ(server.requests()[0]["n"], 3);
  EXPECT_EQ(server.requests()[0]["temperature"], 0.8);
}

TEST_F(JudgeSource, FailuresNameTheJudgeAndItsEndpoint) {
  {
    ChatServer server(grade, http::status::service_unavailable);
    RewardSources sources(config(server.url()));
    const std::string e = error_of([&] { sources.score({"p"}, {"r"}, {"l"}); });
    EXPECT_NE(e.find("judge \"judge\" " + server.url() + ": HTTP 503: overloaded"),
              std::string::npos)
        << e;
  }
  {
    ChatServer server([](const std::string&, int64_t) { return std::vector<std::string>{}; });
    RewardSources sources(config(server.url()));
    const std::string e = error_of([&] { sources.score({"p"}, {"r"}, {"l"}); });
    EXPECT_NE(e.find("asked for 1 replies (n), got 0"), std::string::npos) << e;
  }
  EXPECT_NE(error_of([&] {
              RewardSources sources(config("https://judge.example/v1"));
            }).find("judge.url: expected http://host[:port][/path]"),
            std::string::npos);
}

}  // namespace
}  // namespace rlhf::rewards
