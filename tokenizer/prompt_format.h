// Turns a dataset prompt (a plain string or a list of chat messages) into the text the
// model sees: data.input_template ("{}" = the prompt, as OpenRLHF), or the chat template of
// a known family (ChatML as Qwen2, Llama-3, Llama-2, Mistral v0.1 [INST]), chosen by name
// or recognised in tokenizer_config.json's chat_template. It does not run Jinja: an
// unrecognised template is an InputError that suggests data.input_template.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer_config.h"

namespace rlhf::tokenizer {

enum class ChatTemplate { kAuto, kChatML, kLlama3, kLlama2, kMistral };

// "auto", "chatml", "llama3", "llama2", "mistral"; throws InputError listing them.
ChatTemplate parse_chat_template(std::string_view name);
std::string chat_template_name(ChatTemplate t);
// The family whose template `jinja_source` is, or kAuto when it is none we know.
ChatTemplate detect_chat_template(std::string_view jinja_source);

// Filled from the job spec's data.* keys.
struct PromptFormatConfig {
  std::string input_template;        // data.input_template: "" = none, else contains "{}"
  bool apply_chat_template = false;  // data.apply_chat_template
  ChatTemplate chat_template = ChatTemplate::kAuto;  // data.chat_template
};

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

class PromptFormatter {
 public:
  // `tokenizer_config`: the model's tokenizer_config.json (template text, BOS/EOS strings).
  // Throws InputError when the template cannot be resolved or input_template has no "{}".
  PromptFormatter(const PromptFormatConfig& config, const TokenizerConfig& tokenizer_config);

  // The prompt text for one dataset value, as OpenRLHF's preprocess_data: with
  // apply_chat_template, a string becomes one user message and the template is applied with
  // add_generation_prompt=True (input_template is then unused); otherwise the value must be a
  // string and input_template, if any, wraps it. Throws InputError naming what was expected.
  // The result already holds BOS where the template writes it: encode it with AddSpecial::kNo.
  std::string format(const nlohmann::json& prompt) const;
  std::string format_messages(const std::vector<ChatMessage>& messages) const;

  // Multi-turn rollouts (issue 31): the text that follows a model turn which ended with its
  // end-of-turn token, up to the next assistant header: the environment's turn (`role`
  // "tool" or "user") with `content`, as the template renders that message, then the
  // generation prompt. Appended to a conversation `format_messages` rendered (and the model's
  // turn with its end-of-turn token), it gives exactly what the template renders for the
  // whole conversation: the tokens the rollout appends are the environment's, every other
  // token the model's or the prompt's.
  //   ChatML (Qwen, SmolLM2): "\n<|im_start|>" role "\n" content
  //   "<|im_end|>\n<|im_start|>assistant\n" Llama-3: "<|start_header_id|>" role
  //   "<|end_header_id|>\n\n" content.strip() "<|eot_id|>"
  //            "<|start_header_id|>assistant<|end_header_id|>\n\n"
  // Throws InputError for the other templates (Llama-2 and Mistral v0.1 have neither a tool
  // role nor an end-of-turn token the model writes before a user turn), for plain prompts
  // (no chat template) and for a role other than "tool" or "user".
  std::string environment_turn(const std::string& role, const std::string& content) const;

  // A whole conversation for SFT on trajectories (issue 31: warm-starting tool use): the
  // texts the rollout would see, in order, each marked with whether the model wrote it. The
  // first is the prompt (the messages before the first assistant turn, with the generation
  // prompt); then each assistant turn's content (the model's: the caller appends its
  // end-of-turn token, as the model samples it) and each tool or user turn as
  // environment_turn renders it (not the model's). Joined, with the end-of-turn tokens, they
  // are exactly the template's rendering of the whole conversation, cut where the rollout
  // cuts it. Throws InputError naming the message for: no assistant turn, an assistant turn
  // first, a system turn after the first, two assistant turns in a row, a last turn that is
  // not the assistant's, another role, or a template environment_turn cannot render.
  struct Piece {
    std::string text;
    bool model = false;
  };
  std::vector<Piece> conversation(const nlohmann::json& messages) const;

  // Multi-turn rollouts: an environment's initial observation (its reset's answer) joins the
  // prompt as TRL's environment_factory does, appended to the last message's content.
  // `rendered` is a conversation format_messages rendered (ending with the generation prompt);
  // the result is format_messages of the same messages with `content` appended to the last
  // one's content, e.g. ChatML "...<|im_start|>user\nQ" + content + "<|im_end|>\n<|im_start|>
  // assistant\n". (Llama-3 strips a message's content: the result holds content's right-strip,
  // which is the template's rendering when the last message does not end in whitespace.)
  // Throws InputError when `rendered` does not end as this template ends a message and begins
  // the assistant's, or for a template environment_turn refuses.
  std::string append_to_last_message(const std::string& rendered, const std::string& content) const;

  // The template in use (kAuto only when apply_chat_template is false).
  ChatTemplate chat_template() const { return template_; }

 private:
  std::string chatml(const std::vector<ChatMessage>& messages) const;
  std::string llama3(const std::vector<ChatMessage>& messages) const;
  std::string llama2(const std::vector<ChatMessage>& messages) const;
  std::string mistral(const std::vector<ChatMessage>& messages) const;

  PromptFormatConfig config_;
  ChatTemplate template_ = ChatTemplate::kAuto;
  std::string bos_, eos_;
  std::string default_system_;  // ChatML's system prompt when the messages have none
};

// `input_template` with "{}" replaced by `prompt` ("{{" and "}}" are literal braces, as
// Python's str.format). Throws InputError when the template has no "{}".
std::string apply_input_template(std::string_view input_template, std::string_view prompt);

}  // namespace rlhf::tokenizer
