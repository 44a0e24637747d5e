// A SentencePiece tokenizer.model (BPE or Unigram, with byte fallback), encoded and decoded
// by rlhf's own code to give the ids SentencePiece gives, plus HF LlamaTokenizer's handling
// of special tokens: the control/unknown piece strings in the text ("<s>", "</s>", "<unk>")
// are cut out first and each stretch between them is encoded on its own.
// No sampling, no n-best, no WORD/CHAR models (refused by name).
#pragma once

#include <array>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tokenizer/sentencepiece_model.h"
#include "tokenizer/sentencepiece_normalizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_config.h"

namespace rlhf::tokenizer {

class SentencePieceTokenizer : public Tokenizer {
 public:
  // Loads `path` (a tokenizer.model). BOS is added by default (Llama's LlamaTokenizer);
  // tokenizer_config.json's add_bos_token/add_eos_token change that. Throws InputError.
  SentencePieceTokenizer(const std::string& path, const TokenizerConfig& config);

  std::vector<TokenId> encode(std::string_view text, AddSpecial add_special) const override;
  std::string decode(const std::vector<TokenId>& ids, SkipSpecial skip_special) const override;
  std::optional<TokenId> token_to_id(std::string_view token) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(model_.pieces.size()); }
  std::string kind() const override { return "sentencepiece"; }

 private:
  using Segment = std::pair<std::string_view, TokenId>;  // a piece of the normalized text

  // SentencePiece's Encode of a text without special-token strings, appended to `ids`.
  void encode_plain(std::string_view text, std::vector<TokenId>& ids) const;
  std::vector<Segment> encode_bpe(std::string_view normalized) const;
  std::vector<Segment> encode_unigram(std::string_view normalized) const;
  // Reserved pieces first, then ordinary ones, else the unknown id (SentencePiece's PieceToId).
  TokenId piece_to_id(std::string_view piece) const;
  // Id of a normal, user-defined or unused piece spelled `piece`, else -1 (no allocation).
  TokenId find_ordinary_piece(std::string_view piece) const;
  PieceType type(TokenId id) const { return model_.pieces[static_cast<size_t>(id)].type; }
  bool is_special(TokenId id) const;

  SentencePieceModel model_;
  SentencePieceNormalizer normalizer_;
  std::unordered_map<std::string, TokenId> pieces_;    // normal, user-defined, unused
  std::unordered_map<std::string, TokenId> reserved_;  // control, unknown, byte
  std::array<TokenId, 256> byte_ids_{};                // <0xXX> pieces (byte fallback)
  TokenId unk_id_ = -1;
  float min_score_ = 0, max_score_ = 0;  // over normal pieces (Unigram unknown/user scores)
  // Byte trie of the ordinary pieces, for Unigram's walk over every piece starting at a
  // position: node 0 is the root; children sorted by byte.
  struct TrieNode {
    std::vector<std::pair<unsigned char, int32_t>> children;
    TokenId id = -1;  // the piece ending here, or -1
  };
  std::vector<TrieNode> trie_;
  std::vector<std::pair<std::string, TokenId>> special_pieces_;  // longest first
  bool add_bos_ = true;
  bool add_eos_ = false;
};

}  // namespace rlhf::tokenizer
