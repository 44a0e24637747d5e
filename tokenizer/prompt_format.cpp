// The chat templates written out in C++, each following its family's Jinja source (cited at
// each function). Output must be byte-identical to what HF apply_chat_template renders.
#include "tokenizer/prompt_format.h"

#include <nlohmann/json.hpp>

#include "core/errors.h"

namespace rlhf::tokenizer {

namespace {

const char* const kNames = "auto, chatml, llama3, llama2, mistral";

bool contains(std::string_view text, std::string_view part) {
  return text.find(part) != std::string_view::npos;
}

// Python str.strip() / Jinja trim on ASCII whitespace.
std::string strip(std::string_view s) {
  const char* ws = " \t\n\r\f\v";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return "";
  return std::string(s.substr(b, s.find_last_not_of(ws) - b + 1));
}

// The literal system prompt a ChatML template writes when the messages have none:
// '<|im_start|>system\nYou are a helpful assistant.<|im_end|>' inside a Jinja string.
std::string chatml_default_system(const std::string& source) {
  const std::string open = "<|im_start|>system";
  for (size_t at = source.find(open); at != std::string::npos; at = source.find(open, at + 1)) {
    size_t begin = at + open.size();
    if (source.compare(begin, 2, "\\n") == 0) {
      begin += 2;
    } else if (source.compare(begin, 1, "\n") == 0) {
      begin += 1;
    } else {
      continue;
    }
    const size_t end = source.find("<|im_end|>", begin);
    if (end == std::string::npos) continue;
    std::string text = source.substr(begin, end - begin);
    if (text.find_first_of("'\"{}") != std::string::npos) continue;  // not a literal
    std::string out;
    for (size_t i = 0; i < text.size(); ++i) {  // Jinja string escapes: \n and \\ .
      if (text[i] == '\\' && i + 1 < text.size() && (text[i + 1] == 'n' || text[i + 1] == '\\')) {
        out += text[i + 1] == 'n' ? '\n' : '\\';
        ++i;
      } else {
        out += text[i];
      }
    }
    return out;
  }
  return "";
}

std::vector<ChatMessage> parse_messages(const nlohmann::json& prompt) {
  std::vector<ChatMessage> messages;
  for (size_t i = 0; i < prompt.size(); ++i) {
    const auto& m = prompt[i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content") ||
        !m["content"].is_string()) {
      throw InputError("message " + std::to_string(i) +
                       ": expected {\"role\": string, \"content\": string}, got " + m.dump());
    }
    messages.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
  }
  if (messages.empty()) throw InputError("expected at least one message, got []");
  return messages;
}

void check_alternation(const std::vector<ChatMessage>& loop_messages, size_t first_index) {
  for (size_t i = 0; i < loop_messages.size(); ++i) {
    if ((loop_messages[i].role == "user") != (i % 2 == 0)) {
      throw InputError("message " + std::to_string(first_index + i) + " (role '" +
                       loop_messages[i].role +
                       "'): conversation roles must alternate user/assistant/user/assistant/...");
    }
  }
}

}  // namespace

ChatTemplate parse_chat_template(std::string_view name) {
  if (name == "auto") return ChatTemplate::kAuto;
  if (name == "chatml") return ChatTemplate::kChatML;
  if (name == "llama3") return ChatTemplate::kLlama3;
  if (name == "llama2") return ChatTemplate::kLlama2;
  if (name == "mistral") return ChatTemplate::kMistral;
  throw InputError("data.chat_template: unknown template '" + std::string(name) +
                   "' (expected one of " + kNames + ")");
}

std::string chat_template_name(ChatTemplate t) {
  switch (t) {
    case ChatTemplate::kAuto:
      return "auto";
    case ChatTemplate::kChatML:
      return "chatml";
    case ChatTemplate::kLlama3:
      return "llama3";
    case ChatTemplate::kLlama2:
      return "llama2";
    case ChatTemplate::kMistral:
      return "mistral";
  }
  return "auto";
}

ChatTemplate detect_chat_template(std::string_view source) {
  if (contains(source, "<|im_start|>") && contains(source, "<|im_end|>"))
    return ChatTemplate::kChatML;
  // Llama-3.1 and later write a dated system prompt and tool blocks of their own: not this.
  if (contains(source, "<|start_header_id|>") && contains(source, "<|eot_id|>") &&
      !contains(source, "Cutting Knowledge Date")) {
    return ChatTemplate::kLlama3;
  }
  if (contains(source, "[INST]") && contains(source, "<<SYS>>")) return ChatTemplate::kLlama2;
  // Mistral v0.1's exact user turn; later Mistral templates space [/INST] differently.
  if (contains(source, "'[INST] ' + message['content'] + ' [/INST]'"))
    return ChatTemplate::kMistral;
  return ChatTemplate::kAuto;
}

std::string apply_input_template(std::string_view input_template, std::string_view prompt) {
  std::string out;
  bool placed = false;
  for (size_t i = 0; i < input_template.size(); ++i) {
    const char c = input_template[i];
    const char next = i + 1 < input_template.size() ? input_template[i + 1] : '\0';
    if (c == '{' && next == '}') {
      out += prompt;
      placed = true;
      ++i;
    } else if ((c == '{' && next == '{') || (c == '}' && next == '}')) {
      out += c;
      ++i;
    } else {
      out += c;
    }
  }
  if (!placed) {
    throw InputError("data.input_template: expected \"{}\" where the prompt goes, got \"" +
                     std::string(input_template) + "\"");
  }
  return out;
}

PromptFormatter::PromptFormatter(const PromptFormatConfig& config,
                                 const TokenizerConfig& tokenizer_config)
    : config_(config) {
  if (!config.input_template.empty()) apply_input_template(config.input_template, "");  // validates
  if (!config.apply_chat_template) return;
  template_ = config.chat_template;
  if (template_ == ChatTemplate::kAuto) {
    if (tokenizer_config.chat_template.empty()) {
      throw InputError(
          std::string("data.apply_chat_template: tokenizer_config.json has no chat_template; ") +
          "set data.chat_template (" + kNames + ") or use data.input_template instead");
    }
    template_ = detect_chat_template(tokenizer_config.chat_template);
    if (template_ == ChatTemplate::kAuto) {
      throw InputError(
          "data.apply_chat_template: unrecognised chat_template in tokenizer_config.json (\"" +
          tokenizer_config.chat_template.substr(0, 80) + "...\"); known: chatml, llama3, " +
          "llama2, mistral. Set data.chat_template, or format prompts with " +
          "data.input_template (e.g. \"User: {}\\nAssistant: \") and "
          "data.apply_chat_template=false");
    }
  }
  const bool llama3 = template_ == ChatTemplate::kLlama3;
  bos_ = tokenizer_config.bos_token.value_or(llama3 ? "<|begin_of_text|>" : "<s>");
  eos_ = tokenizer_config.eos_token.value_or(llama3 ? "<|end_of_text|>" : "</s>");
  if (template_ == ChatTemplate::kChatML)
    default_system_ = chatml_default_system(tokenizer_config.chat_template);
}

std::string PromptFormatter::format(const nlohmann::json& prompt) const {
  if (config_.apply_chat_template) {
    if (prompt.is_string()) return format_messages({{"user", prompt.get<std::string>()}});
    if (prompt.is_array()) return format_messages(parse_messages(prompt));
    throw InputError(
        "prompt: expected a string or a list of {\"role\", \"content\"} messages, got " +
        prompt.dump().substr(0, 80));
  }
  if (prompt.is_array()) {
    throw InputError("prompt: a list of messages needs data.apply_chat_template=true");
  }
  if (!prompt.is_string())
    throw InputError("prompt: expected a string, got " + prompt.dump().substr(0, 80));
  const auto& text = prompt.get_ref<const std::string&>();
  return config_.input_template.empty() ? text : apply_input_template(config_.input_template, text);
}

std::string PromptFormatter::format_messages(const std::vector<ChatMessage>& messages) const {
  if (messages.empty()) throw InputError("expected at least one message");
  switch (template_) {
    case ChatTemplate::kChatML:
      return chatml(messages);
    case ChatTemplate::kLlama3:
      return llama3(messages);
    case ChatTemplate::kLlama2:
      return llama2(messages);
    case ChatTemplate::kMistral:
      return mistral(messages);
    case ChatTemplate::kAuto:
      break;
  }
  throw InputError("prompt: a list of messages needs data.apply_chat_template=true");
}

std::string PromptFormatter::environment_turn(const std::string& role,
                                              const std::string& content) const {
  if (role != "tool" && role != "user")
    throw InputError("environment turn: role must be \"tool\" or \"user\", got \"" + role + "\"");
  switch (template_) {
    case ChatTemplate::kChatML:  // chatml(): the model's "<|im_end|>" is followed by "\n"
      return "\n<|im_start|>" + role + "\n" + content + "<|im_end|>\n<|im_start|>assistant\n";
    case ChatTemplate::kLlama3:  // llama3(): the model's turn ends with "<|eot_id|>"
      return "<|start_header_id|>" + role + "<|end_header_id|>\n\n" + strip(content) +
             "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n";
    case ChatTemplate::kLlama2:
    case ChatTemplate::kMistral:
      throw InputError("multi-turn rollouts: the " + chat_template_name(template_) +
                       " chat template has no tool role and no end-of-turn token before a user "
                       "turn; use a chatml or llama3 model (data.chat_template)");
    case ChatTemplate::kAuto:
      break;
  }
  throw InputError(
      "multi-turn rollouts need a chat template to render the environment's turns: set "
      "data.apply_chat_template=true (chatml or llama3)");
}

std::vector<PromptFormatter::Piece> PromptFormatter::conversation(
    const nlohmann::json& messages) const {
  if (!messages.is_array())
    throw InputError("conversation: expected a list of {\"role\", \"content\"} messages, got " +
                     messages.dump().substr(0, 80));
  const std::vector<ChatMessage> all = parse_messages(messages);
  size_t first = 0;
  while (first < all.size() && all[first].role != "assistant") ++first;
  auto bad = [](size_t i, const std::string& what) {
    return InputError("conversation: message " + std::to_string(i) + ": " + what);
  };
  if (first == all.size()) throw bad(all.size() - 1, "expected an assistant turn to train on");
  if (first == 0) throw bad(0, "expected a user (or system) turn before the first assistant turn");
  if (all.back().role != "assistant")
    throw bad(all.size() - 1,
              "expected the conversation to end with an assistant turn, found " + all.back().role);
  std::vector<Piece> out;
  out.push_back({format_messages({all.begin(), all.begin() + static_cast<long>(first)}), false});
  for (size_t i = first; i < all.size(); ++i) {
    const ChatMessage& m = all[i];
    if (m.role == "assistant") {
      if (i > first && all[i - 1].role == "assistant")
        throw bad(i, "two assistant turns in a row (a tool or user turn goes between them)");
      // llama3() writes every message's content stripped; ChatML writes it as it is.
      out.push_back({template_ == ChatTemplate::kLlama3 ? strip(m.content) : m.content, true});
    } else if (m.role == "tool" || m.role == "user") {
      out.push_back({environment_turn(m.role, m.content), false});
    } else {
      throw bad(i, "expected role user, assistant or tool after the first assistant turn, found " +
                       m.role);
    }
  }
  return out;
}

std::string PromptFormatter::append_to_last_message(const std::string& rendered,
                                                    const std::string& content) const {
  environment_turn("user", "");  // the same templates as the environment's turns
  const bool chatml = template_ == ChatTemplate::kChatML;
  // The last message's end, then the generation prompt (chatml() and llama3() below).
  const std::string tail = chatml ? "<|im_end|>\n<|im_start|>assistant\n"
                                  : "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n";
  if (rendered.size() < tail.size() ||
      rendered.compare(rendered.size() - tail.size(), tail.size(), tail) != 0) {
    throw InputError("initial observation: the prompt does not end with the " +
                     chat_template_name(template_) + " template's end of message and assistant " +
                     "header, so the observation cannot be appended to its last message");
  }
  std::string added = content;
  if (!chatml) {  // the template's trim: only the right end can change (see the header)
    const size_t end = added.find_last_not_of(" \t\n\r\f\v");
    added.resize(end == std::string::npos ? 0 : end + 1);
  }
  return rendered.substr(0, rendered.size() - tail.size()) + added + tail;
}

// Qwen/Qwen2-7B-Instruct tokenizer_config.json chat_template:
// {% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}
// {{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}
// {{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}
// {% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}
// (the default system prompt is read from the model's own template; none without one).
std::string PromptFormatter::chatml(const std::vector<ChatMessage>& messages) const {
  std::string out;
  if (messages[0].role != "system" && !default_system_.empty()) {
    out += "<|im_start|>system\n" + default_system_ + "<|im_end|>\n";
  }
  for (const auto& m : messages) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
  return out + "<|im_start|>assistant\n";
}

// meta-llama/Meta-Llama-3-8B-Instruct tokenizer_config.json chat_template:
// {% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] +
// '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}
// {% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}
// {% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif
// %}
std::string PromptFormatter::llama3(const std::vector<ChatMessage>& messages) const {
  std::string out = bos_;
  for (const auto& m : messages) {
    out +=
        "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + strip(m.content) + "<|eot_id|>";
  }
  return out + "<|start_header_id|>assistant<|end_header_id|>\n\n";
}

// meta-llama/Llama-2-7b-chat-hf tokenizer_config.json chat_template: a leading system message
// goes into the first user turn as '<<SYS>>\n' + system + '\n<</SYS>>\n\n'; then
// user: bos_token + '[INST] ' + content.strip() + ' [/INST]',
// assistant: ' ' + content.strip() + ' ' + eos_token; roles must alternate from user.
// It has no generation prompt: the text ends with ' [/INST]'.
std::string PromptFormatter::llama2(const std::vector<ChatMessage>& messages) const {
  const bool has_system = messages[0].role == "system";
  const std::vector<ChatMessage> loop(messages.begin() + (has_system ? 1 : 0), messages.end());
  check_alternation(loop, has_system ? 1 : 0);
  std::string out;
  for (size_t i = 0; i < loop.size(); ++i) {
    std::string content = loop[i].content;
    if (i == 0 && has_system)
      content = "<<SYS>>\n" + messages[0].content + "\n<</SYS>>\n\n" + content;
    if (loop[i].role == "user") out += bos_ + "[INST] " + strip(content) + " [/INST]";
    if (loop[i].role == "assistant") out += " " + strip(content) + " " + eos_;
  }
  return out;
}

// mistralai/Mistral-7B-Instruct-v0.1 tokenizer_config.json chat_template:
// {{ bos_token }}{% for message in messages %}(roles alternate from user)
// {% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}
// {% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}
// {% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}
std::string PromptFormatter::mistral(const std::vector<ChatMessage>& messages) const {
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].role != "user" && messages[i].role != "assistant") {
      throw InputError("message " + std::to_string(i) + " (role '" + messages[i].role +
                       "'): the mistral template supports only user and assistant roles");
    }
  }
  check_alternation(messages, 0);
  std::string out = bos_;
  for (const auto& m : messages) {
    out += m.role == "user" ? "[INST] " + m.content + " [/INST]" : m.content + eos_;
  }
  return out;
}

}  // namespace rlhf::tokenizer
