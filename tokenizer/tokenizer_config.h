// What rlhf reads from an HF tokenizer_config.json: the class, the BOS/EOS/PAD/UNK strings,
// whether BOS/EOS are added, decode clean-up, and the chat template text. Not the rest.
#pragma once

#include <optional>
#include <string>

namespace rlhf::tokenizer {

struct TokenizerConfig {
  std::string tokenizer_class;           // "" when absent
  std::optional<std::string> bos_token;  // token strings; null/absent -> nullopt
  std::optional<std::string> eos_token;
  std::optional<std::string> pad_token;
  std::optional<std::string> unk_token;
  std::optional<bool> add_bos_token;  // absent -> the tokenizer's own default
  std::optional<bool> add_eos_token;
  bool clean_up_tokenization_spaces = false;  // HF decode(): " ." -> "." and friends
  std::string chat_template;                  // Jinja source, "" when absent
};

// Reads `model_dir`/tokenizer_config.json (a missing file gives the defaults above) and
// `model_dir`/chat_template.jinja, whose text, when present, is chat_template.
// Throws InputError naming the file when it is not valid JSON or a field has the wrong type.
TokenizerConfig read_tokenizer_config(const std::string& model_dir);

}  // namespace rlhf::tokenizer
