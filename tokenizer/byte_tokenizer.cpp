// The byte tokenizer: no merges, no normalization; special tokens in the text are matched.
#include "tokenizer/byte_tokenizer.h"

#include "core/errors.h"

namespace rlhf::tokenizer {

namespace {

struct Named {
  const char* text;
  TokenId id;
};
constexpr Named kSpecials[] = {
    {"<pad>", ByteTokenizer::kPad}, {"<s>", ByteTokenizer::kBos}, {"</s>", ByteTokenizer::kEos}};

}  // namespace

ByteTokenizer::ByteTokenizer(bool add_bos, int64_t vocab_size)
    : add_bos_(add_bos), vocab_size_(vocab_size) {
  if (vocab_size < 259) {
    throw InputError("RlhfByteTokenizer needs a vocab_size of at least 259, got " +
                     std::to_string(vocab_size));
  }
  special_ids_ = {kBos, kEos, kPad, std::nullopt};
}

std::vector<TokenId> ByteTokenizer::encode(std::string_view text, AddSpecial add_special) const {
  std::vector<TokenId> ids;
  ids.reserve(text.size() + 1);
  if (add_special == AddSpecial::kYes && add_bos_) ids.push_back(kBos);
  for (size_t i = 0; i < text.size();) {
    bool matched = false;
    for (const auto& s : kSpecials) {
      const std::string_view name(s.text);
      if (text.compare(i, name.size(), name) == 0) {
        ids.push_back(s.id);
        i += name.size();
        matched = true;
        break;
      }
    }
    if (!matched) ids.push_back(static_cast<unsigned char>(text[i++]));
  }
  return ids;
}

std::string ByteTokenizer::decode(const std::vector<TokenId>& ids, SkipSpecial skip_special) const {
  std::string text;
  text.reserve(ids.size());
  for (TokenId id : ids) {
    if (id >= 0 && id < 256) {
      text += static_cast<char>(id);
    } else if (id >= kPad && id <= kEos) {
      if (skip_special == SkipSpecial::kNo) text += kSpecials[id - kPad].text;
    } else if (id < 0 || id >= vocab_size_) {
      throw InputError("decode: id " + std::to_string(id) + " is outside the vocabulary [0, " +
                       std::to_string(vocab_size_) + ")");
    }  // ids in [259, vocab_size) are unused padding of the embedding: no text
  }
  return text;
}

std::optional<TokenId> ByteTokenizer::token_to_id(std::string_view token) const {
  for (const auto& s : kSpecials) {
    if (token == s.text) return s.id;
  }
  if (token.size() == 1) return static_cast<unsigned char>(token[0]);
  return std::nullopt;
}

}  // namespace rlhf::tokenizer
