// Tool-call parsing: find each call's JSON text by the format's delimiters, then read
// {"name", "arguments" | "parameters"} from it. Only nlohmann's parser reads JSON; this file
// only finds where a call begins and ends.
#include "envs/tool_calls.h"

#include "core/errors.h"
#include "core/text.h"

namespace rlhf::envs {
namespace {

using nlohmann::json;

constexpr const char* kHermesOpen = "<tool_call>";
constexpr const char* kHermesClose = "</tool_call>";
constexpr const char* kPythonTag = "<|python_tag|>";

// nlohmann's message without its "[json.exception.parse_error.101] " prefix.
std::string parse_error_text(const json::parse_error& e) {
  const std::string what = e.what();
  const size_t cut = what.find("] ");
  return cut == std::string::npos ? what : what.substr(cut + 2);
}

// Reads one call's JSON text; appends to `out.calls` or an error line to `out.errors`.
void read_call(const std::string& text, size_t index, ParsedToolCalls& out) {
  const std::string which = "error: tool call " + std::to_string(index);
  const std::string shape = "{\"name\": \"TOOL\", \"arguments\": {...}}";
  json call;
  try {
    call = json::parse(text);
  } catch (const json::parse_error& e) {
    out.errors.push_back(which + " is not valid JSON: " + parse_error_text(e));
    return;
  }
  if (!call.is_object()) {
    out.errors.push_back(which + ": expected a JSON object " + shape + ", got " + call.type_name());
    return;
  }
  if (!call.contains("name") || !call["name"].is_string() ||
      call["name"].get<std::string>().empty()) {
    out.errors.push_back(which + ": expected a \"name\" string, as in " + shape);
    return;
  }
  ToolCall tool{call["name"].get<std::string>(), json::object()};
  for (const char* key : {"arguments", "parameters"}) {
    if (!call.contains(key)) continue;
    json args = call[key];
    if (args.is_string()) {  // OpenAI-style arguments: a JSON object inside a string
      args = json::parse(args.get<std::string>(), nullptr, /*allow_exceptions=*/false);
    }
    if (!args.is_object()) {
      out.errors.push_back(which + " (" + tool.name + "): expected \"" + key +
                           "\" to be a JSON object, got " + call[key].dump());
      return;
    }
    tool.arguments = std::move(args);
    break;
  }
  out.calls.push_back(std::move(tool));
}

void parse_hermes(const std::string& turn, ParsedToolCalls& out) {
  const std::string open = kHermesOpen, close = kHermesClose;
  size_t at = turn.find(open);
  for (size_t index = 1; at != std::string::npos; ++index) {
    const size_t begin = at + open.size();
    const size_t end = turn.find(close, begin);
    if (end == std::string::npos) {
      out.errors.push_back("error: tool call " + std::to_string(index) + ": expected " + close +
                           " after " + open);
      return;
    }
    read_call(trim(turn.substr(begin, end - begin)), index, out);
    at = turn.find(open, end + close.size());
  }
}

// The end (one past) of the JSON value starting at `begin` with '{': braces matched outside
// strings; the text's end when they never balance (the parser then says what it expected).
size_t end_of_object(const std::string& s, size_t begin) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = begin; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if ((c == '}' || c == ']') && --depth == 0) {
      return i + 1;
    }
  }
  return s.size();
}

void parse_llama3(const std::string& body, ParsedToolCalls& out) {
  size_t at = 0;
  for (size_t index = 1;; ++index) {
    at = body.find_first_not_of(" \t\r\n;", at);
    if (at == std::string::npos) return;
    const size_t end = body[at] == '{' ? end_of_object(body, at) : body.size();
    read_call(body.substr(at, end - at), index, out);
    at = end;
  }
}

}  // namespace

ToolCallFormat parse_tool_call_format(const std::string& name) {
  if (name == "auto") return ToolCallFormat::kAuto;
  if (name == "hermes") return ToolCallFormat::kHermes;
  if (name == "llama3") return ToolCallFormat::kLlama3;
  throw InputError("env.options.tool_format: expected one of auto, hermes, llama3, found \"" +
                   name + "\"");
}

ParsedToolCalls parse_tool_calls(const std::string& turn, ToolCallFormat format) {
  ParsedToolCalls out;
  const bool hermes = turn.find(kHermesOpen) != std::string::npos;
  if (format == ToolCallFormat::kHermes || (format == ToolCallFormat::kAuto && hermes)) {
    parse_hermes(turn, out);
    return out;
  }
  std::string body = trim(turn);
  bool tagged = false;
  if (body.rfind(kPythonTag, 0) == 0) {
    body = trim(body.substr(std::string(kPythonTag).size()));
    tagged = true;
  }
  for (const char* end : {"<|eom_id|>", "<|eot_id|>"}) {
    const std::string e = end;
    if (body.size() >= e.size() && body.compare(body.size() - e.size(), e.size(), e) == 0)
      body = trim(body.substr(0, body.size() - e.size()));
  }
  const bool object = !body.empty() && body.front() == '{';
  const bool call = format == ToolCallFormat::kLlama3
                        ? tagged || object
                        : tagged || (object && body.find("\"name\"") != std::string::npos);
  if (call) parse_llama3(body, out);
  return out;
}

nlohmann::json tool_calls_json(const ParsedToolCalls& parsed) {
  nlohmann::json out = nlohmann::json::array();
  for (const ToolCall& c : parsed.calls)
    out.push_back({{"name", c.name}, {"arguments", c.arguments}});
  for (const std::string& e : parsed.errors) out.push_back({{"error", e}});
  return out;
}

}  // namespace rlhf::envs
