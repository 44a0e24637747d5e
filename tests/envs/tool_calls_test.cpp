// Tool-call parsing in the Hermes (Qwen2.5/Qwen3, SmolLM2) and Llama 3 formats: valid calls,
// several in one turn, and malformed ones, which must become "error: ..." lines, not throws.
#include "envs/tool_calls.h"

#include <gtest/gtest.h>

#include "core/errors.h"

namespace rlhf::envs {
namespace {

using nlohmann::json;

TEST(ToolCalls, HermesOneCall) {
  const auto p = parse_tool_calls(
      "Let me compute.\n<tool_call>\n{\"name\": \"calculator\", \"arguments\": "
      "{\"expression\": \"2+3\"}}\n</tool_call>",
      ToolCallFormat::kAuto);
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_TRUE(p.errors.empty());
  EXPECT_EQ(p.calls[0].name, "calculator");
  EXPECT_EQ(p.calls[0].arguments, json({{"expression", "2+3"}}));
}

TEST(ToolCalls, HermesSeveralCallsInOrderAndStringArguments) {
  const auto p = parse_tool_calls(
      "<tool_call>{\"name\": \"a\", \"arguments\": {\"x\": 1}}</tool_call> then "
      "<tool_call>{\"name\": \"b\", \"arguments\": \"{\\\"y\\\": 2}\"}</tool_call>"
      "<tool_call>{\"name\": \"c\"}</tool_call>",
      ToolCallFormat::kHermes);
  ASSERT_EQ(p.calls.size(), 3u);
  EXPECT_EQ(p.calls[0].name, "a");
  EXPECT_EQ(p.calls[1].name, "b");
  EXPECT_EQ(p.calls[1].arguments, json({{"y", 2}}));  // OpenAI-style string arguments
  EXPECT_EQ(p.calls[2].arguments, json::object());
}

TEST(ToolCalls, HermesMalformedCallsBecomeErrorLines) {
  const auto p = parse_tool_calls(
      "<tool_call>{\"name\": \"calculator\", \"arguments\": {\"expression\": }</tool_call>"
      "<tool_call>[1, 2]</tool_call><tool_call>{\"arguments\": {}}</tool_call>"
      "<tool_call>{\"name\": \"x\", \"arguments\": 5}</tool_call>"
      "<tool_call>{\"name\": \"ok\", \"arguments\": {}}</tool_call><tool_call>{\"name\"",
      ToolCallFormat::kAuto);
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].name, "ok");
  ASSERT_EQ(p.errors.size(), 5u);
  EXPECT_EQ(p.errors[0].rfind("error: tool call 1 is not valid JSON: ", 0), 0u) << p.errors[0];
  EXPECT_NE(p.errors[0].find("expected"), std::string::npos) << p.errors[0];
  EXPECT_EQ(p.errors[1],
            "error: tool call 2: expected a JSON object {\"name\": \"TOOL\", "
            "\"arguments\": {...}}, got array");
  EXPECT_EQ(p.errors[2].rfind("error: tool call 3: expected a \"name\" string", 0), 0u);
  EXPECT_EQ(p.errors[3],
            "error: tool call 4 (x): expected \"arguments\" to be a JSON object, got 5");
  EXPECT_EQ(p.errors[4], "error: tool call 6: expected </tool_call> after <tool_call>");
  EXPECT_TRUE(p.any());
}

TEST(ToolCalls, Llama3JsonCallsWithAndWithoutPythonTag) {
  auto p = parse_tool_calls("{\"name\": \"calculator\", \"parameters\": {\"expression\": \"7*6\"}}",
                            ToolCallFormat::kAuto);
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].arguments, json({{"expression", "7*6"}}));

  p = parse_tool_calls(
      "<|python_tag|>{\"name\": \"a\", \"parameters\": {\"s\": \"}{\"}}; "
      "{\"name\": \"b\", \"parameters\": {}}\n{\"name\": \"c\", \"arguments\": {\"k\": [1]}}"
      "<|eom_id|>",
      ToolCallFormat::kLlama3);
  ASSERT_EQ(p.calls.size(), 3u) << (p.errors.empty() ? "" : p.errors[0]);
  EXPECT_EQ(p.calls[0].arguments, json({{"s", "}{"}}));  // braces inside strings
  EXPECT_EQ(p.calls[1].name, "b");
  EXPECT_EQ(p.calls[2].arguments, json({{"k", {1}}}));
}

TEST(ToolCalls, Llama3MalformedCallsBecomeErrorLines) {
  const auto p = parse_tool_calls("<|python_tag|>{\"name\": \"calculator\", \"parameters\": {",
                                  ToolCallFormat::kAuto);
  EXPECT_TRUE(p.calls.empty());
  ASSERT_EQ(p.errors.size(), 1u);
  EXPECT_EQ(p.errors[0].rfind("error: tool call 1 is not valid JSON: ", 0), 0u) << p.errors[0];
  EXPECT_NE(p.errors[0].find("expected"), std::string::npos) << p.errors[0];

  const auto q = parse_tool_calls("<|python_tag|>calculator(2+2)", ToolCallFormat::kLlama3);
  ASSERT_EQ(q.errors.size(), 1u);
  EXPECT_NE(q.errors[0].find("not valid JSON"), std::string::npos);
}

TEST(ToolCalls, PlainAnswersHaveNoCall) {
  EXPECT_FALSE(parse_tool_calls("The answer is 42.", ToolCallFormat::kAuto).any());
  // A JSON answer without "name" is not a Llama 3 call under auto detection.
  EXPECT_FALSE(parse_tool_calls("{\"answer\": 42}", ToolCallFormat::kAuto).any());
  // Hermes only: a Llama 3 call is plain text.
  EXPECT_FALSE(
      parse_tool_calls("{\"name\": \"a\", \"parameters\": {}}", ToolCallFormat::kHermes).any());
  EXPECT_EQ(parse_tool_call_format("llama3"), ToolCallFormat::kLlama3);
  EXPECT_THROW(parse_tool_call_format("xml"), InputError);
}

}  // namespace
}  // namespace rlhf::envs
