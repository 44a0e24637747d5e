// synthetic:calc (data/synthetic_calc.h): the problems, their splits, and the conversations
// that warm-start tool use, checked against the calculator environment that answers them.
#include "data/synthetic_calc.h"

#include <gtest/gtest.h>

#include <set>

#include "envs/builtin_envs.h"
#include "envs/tool_calls.h"

namespace rlhf::data {
namespace {

using nlohmann::json;

TEST(SyntheticCalc, ProblemsAreDistinctRightAndSplitByExpression) {
  const auto train = calc_problems(2000, 42, false);
  const auto test = calc_problems(300, 42, true);
  ASSERT_EQ(train.size(), 2000u);
  std::set<std::string> seen;
  for (const auto& p : train) {
    EXPECT_TRUE(seen.insert(p.expression).second) << p.expression;
    // The calculator's own parser agrees with the label, exactly (integers).
    const auto r = envs::evaluate_arithmetic(p.expression);
    ASSERT_TRUE(r.value.has_value()) << p.expression << ": " << r.error;
    EXPECT_EQ(*r.value, static_cast<double>(p.answer)) << p.expression;
  }
  for (const auto& p : test) EXPECT_EQ(seen.count(p.expression), 0u) << p.expression;
  // The held-out split is the same whatever the seed; the training split follows it.
  const auto test_again = calc_problems(300, 7, true);
  const auto train_other = calc_problems(50, 7, false);
  for (size_t i = 0; i < test.size(); ++i) EXPECT_EQ(test[i].expression, test_again[i].expression);
  size_t same = 0;
  for (size_t i = 0; i < train_other.size(); ++i)
    same += train_other[i].expression == train[i].expression ? 1 : 0;
  EXPECT_LT(same, 5u);
  // The four shapes all occur (a quarter each: 500 +- 19 of 2000; 400 is 5 sigma).
  size_t times_only = 0, sums = 0, brackets = 0, minus = 0;
  for (const auto& p : train) {
    const auto& e = p.expression;
    brackets += e[0] == '(' ? 1 : 0;
    minus += e.find(" - ") != std::string::npos ? 1 : 0;
    sums += e[0] != '(' && e.find(" + ") != std::string::npos ? 1 : 0;
    times_only += e.find_first_of("+-(") == std::string::npos ? 1 : 0;
  }
  for (size_t count : {times_only, sums, brackets, minus}) EXPECT_GT(count, 400u);
}

TEST(SyntheticCalc, ConversationsCallTheCalculatorAsTheSystemPromptShows) {
  const CalcProblem p{"347 * 29", 10063};
  const json prompt = calc_prompt(p);
  ASSERT_EQ(prompt.size(), 2u);
  EXPECT_EQ(prompt[0]["role"], "system");
  EXPECT_EQ(prompt[1]["content"], "What is 347 * 29?");
  // The system prompt's example call is one the calculator reads.
  const auto example = envs::parse_tool_calls(calc_system_prompt(), envs::ToolCallFormat::kAuto);
  ASSERT_EQ(example.calls.size(), 1u);
  EXPECT_EQ(example.calls[0].arguments["expression"], "2 + 3");

  const json direct = calc_conversation(p, false);
  ASSERT_EQ(direct.size(), 3u);
  EXPECT_EQ(direct[2], (json{{"role", "assistant"}, {"content", "The answer is 10063."}}));

  const json tool = calc_conversation(p, true);
  ASSERT_EQ(tool.size(), 5u);
  EXPECT_EQ(tool[2]["role"], "assistant");
  // The call, written exactly as the system prompt shows the format, and answered by the
  // built-in calculator with the text of the tool turn.
  EXPECT_EQ(tool[2]["content"],
            "<tool_call>{\"name\": \"calculator\", \"arguments\": {\"expression\": \"347 * "
            "29\"}}</tool_call>");
  auto env = envs::make_builtin_environment("calculator", json::object());
  env->reset(0, json::object());
  env->step(0, tool[2]["content"].get<std::string>());
  const auto answers = env->poll(1.0);
  ASSERT_EQ(answers.size(), 1u);
  EXPECT_EQ(answers[0].second.text, tool[3]["content"].get<std::string>());
  EXPECT_EQ(answers[0].second.role, tool[3]["role"].get<std::string>());
  EXPECT_EQ(answers[0].second.tool_calls, 1);
  EXPECT_EQ(answers[0].second.tool_errors, 0);
  EXPECT_EQ(tool[4]["content"], "The answer is 10063.");
}

}  // namespace
}  // namespace rlhf::data
