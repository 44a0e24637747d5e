// UTF-8 helpers, Unicode normalization (through utf8proc) and GPT-2's byte-to-character map
// used by byte-level BPE. Only what the tokenizers need; no general text library.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace rlhf::tokenizer {

// Length in bytes of the UTF-8 sequence that starts with `lead` (1 for a stray byte).
size_t utf8_length(unsigned char lead);
// Appends the UTF-8 encoding of `cp` to `out`.
void append_utf8(uint32_t cp, std::string& out);
// Whether `text` is valid UTF-8 (no overlongs, surrogates or truncated sequences).
bool is_valid_utf8(std::string_view text);

enum class NormalForm { kNFC, kNFD, kNFKC, kNFKD };
// `text` in the given Unicode normal form; throws InputError when it is not valid UTF-8.
std::string normalize(std::string_view text, NormalForm form);
// Unicode lowercase of every code point (utf8proc's simple case mapping, as HF Lowercase).
std::string to_lower(std::string_view text);

// GPT-2's reversible map from each byte to a printable character ("Ġ" for ' ', "Ċ" for '\n').
class ByteLevelMap {
 public:
  static const ByteLevelMap& get();
  // The printable characters of each byte of `bytes`, concatenated.
  std::string encode(std::string_view bytes) const;
  // The bytes behind printable characters; characters outside the map keep their own bytes.
  std::string decode(std::string_view chars) const;

 private:
  ByteLevelMap();
  std::array<std::string, 256> byte_to_char_;  // UTF-8 of the character for each byte
  std::array<int16_t, 324> char_to_byte_;      // code point (all < 324) -> byte, or -1
};

}  // namespace rlhf::tokenizer
