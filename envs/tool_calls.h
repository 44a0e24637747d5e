// Tool calls in a model's turn, in the formats of the chat templates rlhf supports:
//   Hermes (Qwen2.5, Qwen3, SmolLM2): <tool_call>{"name": N, "arguments": {...}}</tool_call>,
//     one block per call, several per turn;
//   Llama 3.1+: the turn is a JSON object {"name": N, "parameters": {...}}, optionally after
//     <|python_tag|>; several calls separated by ';' or newlines.
// A malformed call is not an exception: it comes back as an error text the environment hands
// to the model as its observation (what real tool servers do), e.g.
//   error: tool call 1 is not valid JSON: ... expected '}' ...
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace rlhf::envs {

enum class ToolCallFormat {
  kAuto,    // Hermes when the turn has <tool_call>, else Llama 3 when it starts with
            // <|python_tag|> or a JSON object with a "name"; else no call
  kHermes,  // only <tool_call> blocks
  kLlama3,  // only Llama 3 JSON calls
};

// "auto", "hermes", "llama3"; throws InputError naming env.options.tool_format otherwise.
ToolCallFormat parse_tool_call_format(const std::string& name);

struct ToolCall {
  std::string name;
  nlohmann::json arguments = nlohmann::json::object();  // always an object
};

struct ParsedToolCalls {
  std::vector<ToolCall> calls;      // the well-formed calls, in the order written
  std::vector<std::string> errors;  // one "error: ..." line per malformed call
  bool any() const { return !calls.empty() || !errors.empty(); }  // the turn tried a call
};

// The tool calls in `turn` (the model's text, end-of-turn token stripped).
ParsedToolCalls parse_tool_calls(const std::string& turn, ToolCallFormat format);

// The calls as Python and HTTP environments receive them (docs/agentic.md): the well-formed
// calls in the order written, [{"name": N, "arguments": {...}}, ...], then one
// {"error": "error: tool call K ..."} per malformed call; [] when the turn makes none.
nlohmann::json tool_calls_json(const ParsedToolCalls& parsed);

}  // namespace rlhf::envs
