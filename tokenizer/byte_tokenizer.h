// rlhf's built-in byte tokenizer for tiny models: ids 0..255 are the bytes, 256 <pad>,
// 257 <s> (BOS), 258 </s> (EOS). Its tokenizer_config.json says "RlhfByteTokenizer".
#pragma once

#include "tokenizer/tokenizer.h"

namespace rlhf::tokenizer {

class ByteTokenizer : public Tokenizer {
 public:
  static constexpr TokenId kPad = 256;
  static constexpr TokenId kBos = 257;
  static constexpr TokenId kEos = 258;

  // `add_bos`: whether encode(..., AddSpecial::kYes) prepends <s> (tokenizer_config's
  // add_bos_token, true by default). `vocab_size` >= 259 (tiny presets round it up).
  ByteTokenizer(bool add_bos, int64_t vocab_size);

  std::vector<TokenId> encode(std::string_view text, AddSpecial add_special) const override;
  std::string decode(const std::vector<TokenId>& ids, SkipSpecial skip_special) const override;
  std::optional<TokenId> token_to_id(std::string_view token) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  std::string kind() const override { return "rlhf-byte"; }

 private:
  bool add_bos_;
  int64_t vocab_size_;
};

}  // namespace rlhf::tokenizer
