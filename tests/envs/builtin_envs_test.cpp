// The built-in environments: the calculator's arithmetic and errors, its observations for
// tool calls, and guess_number's feedback and end.
#include "envs/builtin_envs.h"

#include <gtest/gtest.h>

#include <set>

#include "core/errors.h"

namespace rlhf::envs {
namespace {

using nlohmann::json;

TEST(Arithmetic, ValuesOfExpressions) {
  const std::vector<std::pair<std::string, std::string>> table = {
      {"2+3*4", "14"},
      {"(2+3)*4", "20"},
      {" 10 / 4 ", "2.5"},
      {"-3 - -2", "-1"},
      {"1/3", "0.333333333333"},
      {"2*(3+(4-1))/3", "4"},
      {".5 + 1.25", "1.75"},
      {"+7", "7"},
      {"123456789*1000", "123456789000"},
      {"0*-1", "0"},
      {"1e3", ""}};
  for (const auto& [expression, expected] : table) {
    const ArithmeticResult r = evaluate_arithmetic(expression);
    if (expected.empty()) {
      EXPECT_FALSE(r.value) << expression;  // no exponents: 'e' is not an operator
      continue;
    }
    ASSERT_TRUE(r.value) << expression << ": " << r.error;
    EXPECT_EQ(format_number(*r.value), expected) << expression;
  }
}

TEST(Arithmetic, ErrorsSayWhereAndWhatWasExpected) {
  EXPECT_EQ(evaluate_arithmetic("2+*3").error,
            "error: expected a number or '(' at position 3 in \"2+*3\", found '*'");
  EXPECT_EQ(evaluate_arithmetic("(1+2").error,
            "error: expected ')' at position 5 in \"(1+2\", found the end");
  EXPECT_EQ(evaluate_arithmetic("4 / (2-2)").error,
            "error: division by zero at position 3 in \"4 / (2-2)\"");
  EXPECT_EQ(evaluate_arithmetic("2 3").error,
            "error: expected an operator or the end at position 3 in \"2 3\", found '3'");
  EXPECT_EQ(evaluate_arithmetic("").error,
            "error: expected a number or '(' at position 1 in \"\", found the end");
  EXPECT_NE(evaluate_arithmetic("__import__('os')").error.find("expected a number"),
            std::string::npos);
  EXPECT_NE(evaluate_arithmetic(std::string(100, '(') + "1" + std::string(100, ')'))
                .error.find("at most 64 nested"),
            std::string::npos);
}

Observation step_once(Environment& env, int64_t id, const std::string& action) {
  env.step(id, action);
  auto ready = env.poll(0);
  EXPECT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready.at(0).first, id);
  return ready.at(0).second;
}

TEST(Calculator, AnswersToolCallsAndEndsOnAnAnswer) {
  auto env = make_builtin_environment("calculator", json::object());
  EXPECT_EQ(env->name(), "builtin:calculator");
  env->reset(7, {{"prompt", "What is (2+3)*4?"}});
  EXPECT_TRUE(env->poll(0).empty());  // nothing in flight: returns at once
  // The reset is answered at once, without an initial observation, and only once.
  EXPECT_EQ(env->poll_resets(0), (std::vector<std::pair<int64_t, std::string>>{{7, ""}}));
  EXPECT_TRUE(env->poll_resets(0).empty());

  Observation o = step_once(*env, 7,
                            "<tool_call>{\"name\": \"calculator\", \"arguments\": "
                            "{\"expression\": \"(2+3)*4\"}}</tool_call>");
  EXPECT_EQ(o.text, "20");
  EXPECT_EQ(o.role, "tool");
  EXPECT_FALSE(o.done);
  EXPECT_EQ(o.tool_calls, 1);
  EXPECT_EQ(o.tool_errors, 0);

  o = step_once(*env, 7,
                "<tool_call>{\"name\": \"calculator\", \"arguments\": {\"expression\": \"1/0\"}}"
                "</tool_call><tool_call>{\"name\": \"search\", \"arguments\": {}}</tool_call>"
                "<tool_call>{\"name\": \"calculator\", \"arguments\": {\"expression\": \"9-10\"}}"
                "</tool_call><tool_call>{oops}</tool_call>");
  EXPECT_EQ(o.tool_calls, 4);
  EXPECT_EQ(o.tool_errors, 3);
  EXPECT_FALSE(o.done);
  EXPECT_EQ(o.text.substr(0, o.text.find('\n')).rfind("error: tool call 4 is not valid JSON", 0),
            0u)
      << o.text;  // parse errors first, then one line per call
  EXPECT_NE(o.text.find("\nerror: division by zero"), std::string::npos) << o.text;
  EXPECT_NE(o.text.find("\nerror: unknown tool \"search\""), std::string::npos) << o.text;
  EXPECT_EQ(o.text.substr(o.text.rfind('\n') + 1), "-1");

  o = step_once(*env, 7, "The answer is 20.");
  EXPECT_TRUE(o.done);
  EXPECT_EQ(o.text, "");
  EXPECT_EQ(o.reward, 0);
  EXPECT_EQ(o.tool_calls, 0);
  env->close(7);
  EXPECT_THROW(env->step(7, "x"), RuntimeError);
}

TEST(Calculator, Llama3FormatOption) {
  auto env = make_builtin_environment("calculator", {{"tool_format", "llama3"}});
  env->reset(0, json::object());
  const Observation o = step_once(
      *env, 0,
      "<|python_tag|>{\"name\": \"calculator\", \"parameters\": {\"expression\": \"6*7\"}}");
  EXPECT_EQ(o.text, "42");
  EXPECT_THROW(make_builtin_environment("calculator", {{"tool_format", "xml"}}), InputError);
}

TEST(GuessNumber, FeedbackUntilRight) {
  auto env = make_builtin_environment("guess_number", json::object());
  env->reset(1, {{"target", 37}});
  Observation o = step_once(*env, 1, "I guess 50");
  EXPECT_EQ(o.text, "lower");
  EXPECT_EQ(o.role, "user");
  EXPECT_FALSE(o.done);
  EXPECT_EQ(step_once(*env, 1, "25").text, "higher");
  EXPECT_EQ(step_once(*env, 1, "hmm").text,
            "error: no number in your guess; guess an integer from 1 to 100");
  o = step_once(*env, 1, "maybe 30... no, 37");  // the last integer is the guess
  EXPECT_TRUE(o.done);
  EXPECT_EQ(o.reward, 1);
  EXPECT_EQ(o.text, "");
}

TEST(GuessNumber, EndsAfterMaxGuessesAndDrawsFromTheOptions) {
  auto env = make_builtin_environment("guess_number",
                                      {{"low", 10}, {"high", 12}, {"seed", 3}, {"max_guesses", 2}});
  env->reset(0, {{"target", "11"}});
  EXPECT_EQ(step_once(*env, 0, "10").text, "higher");
  const Observation o = step_once(*env, 0, "12");
  EXPECT_TRUE(o.done);
  EXPECT_EQ(o.reward, 0);

  // Without a row target: drawn in [low, high], the same for the same (seed, id).
  std::set<int> found;
  for (int64_t id = 0; id < 30; ++id) {
    env->reset(id, json::object());
    int right = 0;
    for (int guess = 10; guess <= 12 && !right; ++guess) {
      auto again =
          make_builtin_environment("guess_number", {{"low", 10}, {"high", 12}, {"seed", 3}});
      again->reset(id, json::object());
      if (step_once(*again, id, std::to_string(guess)).reward == 1) right = guess;
    }
    ASSERT_NE(right, 0) << "trajectory " << id << ": no guess in [10, 12] was right";
    found.insert(right);
  }
  EXPECT_EQ(found.size(), 3u);  // 30 draws cover all three values
  EXPECT_THROW(make_builtin_environment("guess_number", {{"low", 5}, {"high", 1}}), InputError);
  EXPECT_THROW(make_builtin_environment("chess", json::object()), InputError);
}

}  // namespace
}  // namespace rlhf::envs
