// The rules follow SentencePiece's normalizer.cc (Normalizer::Normalize / NormalizePrefix)
// and the Darts-clone unit layout it stores its character map in.
#include "tokenizer/sentencepiece_normalizer.h"

#include <algorithm>
#include <cstring>

#include "core/errors.h"
#include "tokenizer/unicode.h"

namespace rlhf::tokenizer {
namespace {

// Darts-clone DoubleArrayUnit fields.
bool unit_has_leaf(uint32_t unit) {
  return (unit >> 8) & 1;
}
uint32_t unit_value(uint32_t unit) {
  return unit & ((1u << 31) - 1);
}
uint32_t unit_label(uint32_t unit) {
  return unit & ((1u << 31) | 0xFF);
}
uint32_t unit_offset(uint32_t unit) {
  return (unit >> 10) << ((unit & (1u << 9)) >> 6);
}

uint32_t read_le32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

}  // namespace

SentencePieceNormalizer::SentencePieceNormalizer(const SentencePieceNormalizerSpec& spec,
                                                 std::vector<std::string> user_defined,
                                                 const std::string& path)
    : spec_(spec), user_defined_(std::move(user_defined)), path_(path) {
  std::stable_sort(user_defined_.begin(), user_defined_.end(),
                   [](const auto& a, const auto& b) { return a.size() > b.size(); });
  const std::string& blob = spec.precompiled_charsmap;
  if (blob.empty()) return;
  // <trie size: uint32 LE><trie units: uint32 LE each><replacement strings>
  const auto bad = [&](const std::string& what) {
    return InputError(path + ": SentencePiece normalizer '" + spec.name +
                      "': malformed precompiled_charsmap: " + what);
  };
  if (blob.size() <= 4) throw bad("shorter than its header");
  const uint32_t trie_bytes = read_le32(blob.data());
  if (trie_bytes % 4 != 0 || trie_bytes == 0 || trie_bytes >= blob.size() - 4 + 1)
    throw bad("trie size " + std::to_string(trie_bytes) + " does not fit the " +
              std::to_string(blob.size()) + "-byte map");
  trie_.resize(trie_bytes / 4);
  for (size_t i = 0; i < trie_.size(); ++i) trie_[i] = read_le32(blob.data() + 4 + 4 * i);
  replacements_ = blob.substr(4 + trie_bytes);
}

std::pair<size_t, uint32_t> SentencePieceNormalizer::longest_charsmap_match(
    std::string_view text) const {
  size_t best_length = 0;
  uint32_t best_value = 0;
  size_t node = unit_offset(trie_[0]);
  for (size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    node ^= c;
    if (node >= trie_.size()) break;
    const uint32_t unit = trie_[node];
    if (unit_label(unit) != c) break;
    node ^= unit_offset(unit);
    if (node >= trie_.size()) break;
    if (unit_has_leaf(unit)) {
      best_length = i + 1;
      best_value = unit_value(trie_[node]);
    }
  }
  return {best_length, best_value};
}

size_t SentencePieceNormalizer::match_user_defined(std::string_view text) const {
  for (const auto& symbol : user_defined_) {
    if (!symbol.empty() && text.substr(0, symbol.size()) == symbol) return symbol.size();
  }
  return 0;
}

std::pair<std::string_view, size_t> SentencePieceNormalizer::normalize_prefix(
    std::string_view text) const {
  if (const size_t n = match_user_defined(text)) return {text.substr(0, n), n};
  if (!trie_.empty()) {
    const auto [length, value] = longest_charsmap_match(text);
    if (length > 0) {
      if (value >= replacements_.size())
        throw InputError(path_ + ": SentencePiece normalizer '" + spec_.name +
                         "': a character map entry points past its replacement strings");
      const char* s = replacements_.data() + value;
      const size_t n = strnlen(s, replacements_.size() - value);
      return {std::string_view(s, n), length};
    }
  }
  const size_t n = std::min(text.size(), utf8_length(static_cast<unsigned char>(text[0])));
  return {text.substr(0, n), n};
}

std::string SentencePieceNormalizer::normalize(std::string_view text) const {
  std::string out;
  const std::string_view space = spec_.escape_whitespaces ? kSentencePieceSpace : " ";
  // Leading whitespace (after normalization) is dropped.
  if (spec_.remove_extra_whitespaces) {
    while (!text.empty()) {
      const auto [piece, consumed] = normalize_prefix(text);
      if (piece != " ") break;
      text.remove_prefix(consumed);
    }
  }
  if (text.empty()) return out;
  if (spec_.add_dummy_prefix) out += space;
  bool previous_is_space = spec_.remove_extra_whitespaces;
  while (!text.empty()) {
    auto [piece, consumed] = normalize_prefix(text);
    // A run of spaces collapses to one: drop those that follow a space.
    while (previous_is_space && !piece.empty() && piece.front() == ' ') piece.remove_prefix(1);
    if (!piece.empty()) {
      for (char c : piece) {
        if (c == ' ')
          out += space;
        else
          out += c;
      }
      previous_is_space = piece.back() == ' ';
    }
    text.remove_prefix(consumed);
    if (!spec_.remove_extra_whitespaces) previous_is_space = false;
  }
  if (spec_.remove_extra_whitespaces) {
    while (out.size() >= space.size() &&
           std::string_view(out).substr(out.size() - space.size()) == space)
      out.resize(out.size() - space.size());
  }
  return out;
}

}  // namespace rlhf::tokenizer
