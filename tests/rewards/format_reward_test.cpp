// FormatReward: whole-response matching with DOTALL and UTF-8, compile errors, thread safety.
#include "rewards/format_reward.h"

#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "core/errors.h"

namespace rlhf::rewards {
namespace {

const char* const kThinkAnswer = R"(<think>.*?</think>\s*<answer>.*?</answer>)";

struct FormatCase {
  const char* pattern;
  std::string response;
  double expected;
};

TEST(FormatReward, ScoresWholeResponseMatches) {
  const std::vector<FormatCase> cases = {
      {kThinkAnswer, "<think>a</think><answer>4</answer>", 1.0},
      // DOTALL: '.' crosses newlines.
      {kThinkAnswer, "<think>line 1\nline 2</think>\n<answer>4\n</answer>", 1.0},
      // The whole response must match: text before or after the tags fails.
      {kThinkAnswer, "Sure! <think>a</think><answer>4</answer>", 0.0},
      {kThinkAnswer, "<think>a</think><answer>4</answer> trailing", 0.0},
      {kThinkAnswer, "<think>a</think>", 0.0},
      {kThinkAnswer, "", 0.0},
      {"", "", 1.0},
      {"", "x", 0.0},
      // UTF-8: one '.' is one character, not one byte.
      {"r.sum.", "r\xC3\xA9sum\xC3\xA9", 1.0},
      {"r.sum.", "r\xC3\xA9sum\xC3\xA9 extra", 0.0},
      // Alternatives anchor as a whole, not just their first branch.
      {"yes|no", "no", 1.0},
      {"yes|no", "nope", 0.0},
      // A response cut in the middle of a character is not well formed.
      {".*", "caf\xC3", 0.0},
  };
  for (const FormatCase& c : cases) {
    EXPECT_EQ(FormatReward(c.pattern).score(c.response), c.expected)
        << "pattern " << c.pattern << ", response \"" << c.response << "\"";
  }
}

TEST(FormatReward, BadPatternThrowsInputErrorWithPcre2Message) {
  try {
    FormatReward reward("<answer>(.*</answer>");
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("<answer>(.*</answer>"), std::string::npos) << message;
    EXPECT_NE(message.find("missing closing parenthesis"), std::string::npos) << message;
    // PCRE2 reports the end of the pattern: where it gave up looking for the ")".
    EXPECT_NE(message.find("offset 20"), std::string::npos) << message;
  }
}

TEST(FormatReward, ScoreFromManyThreadsAgrees) {
  const FormatReward reward(kThinkAnswer);
  const std::string good = "<think>" + std::string(10000, 'x') + "</think><answer>1</answer>";
  const std::string bad = good + "!";
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 200; ++i) {
        if (reward.score(good) != 1.0 || reward.score(bad) != 0.0) ++wrong;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(wrong.load(), 0);
}

TEST(FormatReward, MovedRewardStillScores) {
  FormatReward first("a+");
  FormatReward second = std::move(first);
  EXPECT_EQ(second.score("aaa"), 1.0);
  EXPECT_EQ(second.pattern(), "a+");
}

}  // namespace
}  // namespace rlhf::rewards
