// SentencePiece's normalizer: the precompiled character map (a Darts-clone double-array trie
// of source strings and a blob of replacements, longest match wins), user-defined symbols
// left untouched, and the whitespace rules (drop extra spaces, dummy prefix, "▁" escaping).
// It does not keep the normalized-to-original offset map: nothing here needs surfaces.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/sentencepiece_model.h"

namespace rlhf::tokenizer {

inline constexpr std::string_view kSentencePieceSpace = "\xE2\x96\x81";  // U+2581 "▁"

class SentencePieceNormalizer {
 public:
  // `user_defined` pieces are matched (longest first) before the character map and copied
  // as they are. Throws InputError (naming `path`) on a malformed character map.
  SentencePieceNormalizer(const SentencePieceNormalizerSpec& spec,
                          std::vector<std::string> user_defined, const std::string& path);

  // `text` must be valid UTF-8.
  std::string normalize(std::string_view text) const;

  // Longest user-defined symbol at the start of `text` (0 when none).
  size_t match_user_defined(std::string_view text) const;

 private:
  // The replacement of the longest prefix of `text` and how many bytes of `text` it consumes.
  std::pair<std::string_view, size_t> normalize_prefix(std::string_view text) const;
  // Darts-clone common-prefix search: length of the longest key that is a prefix of `text`
  // (0 when none) and its value (offset into replacements_).
  std::pair<size_t, uint32_t> longest_charsmap_match(std::string_view text) const;

  SentencePieceNormalizerSpec spec_;
  std::vector<std::string> user_defined_;  // longest first
  std::vector<uint32_t> trie_;             // double-array units; empty = identity
  std::string replacements_;               // NUL-terminated replacement strings
  std::string path_;
};

}  // namespace rlhf::tokenizer
