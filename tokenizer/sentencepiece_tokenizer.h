// A SentencePiece tokenizer.model through Debian's libsentencepiece, with HF
// LlamaTokenizer's handling of special tokens: the BOS/EOS/UNK strings in the text are cut
// out first and each piece between them is encoded on its own. No sampling, no n-best.
#pragma once

#include <memory>
#include <string>

#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_config.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace rlhf::tokenizer {

class SentencePieceTokenizer : public Tokenizer {
 public:
  // Loads `path` (a tokenizer.model). BOS is added by default (Llama's LlamaTokenizer);
  // tokenizer_config.json's add_bos_token/add_eos_token change that. Throws InputError.
  SentencePieceTokenizer(const std::string& path, const TokenizerConfig& config);
  ~SentencePieceTokenizer() override;

  std::vector<TokenId> encode(std::string_view text, AddSpecial add_special) const override;
  std::string decode(const std::vector<TokenId>& ids, SkipSpecial skip_special) const override;
  std::optional<TokenId> token_to_id(std::string_view token) const override;
  int64_t vocab_size() const override;
  std::string kind() const override { return "sentencepiece"; }

 private:
  bool is_special(TokenId id) const;

  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  std::vector<std::pair<std::string, TokenId>>
      special_pieces_;  // control/unk pieces matched in text
  bool add_bos_ = true;
  bool add_eos_ = false;
};

}  // namespace rlhf::tokenizer
