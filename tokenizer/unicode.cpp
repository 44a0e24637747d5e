// UTF-8 helpers, utf8proc normalization and the GPT-2 byte-level map.
#include "tokenizer/unicode.h"

#include <utf8proc.h>

#include <cstdlib>
#include <memory>

#include "core/errors.h"

namespace rlhf::tokenizer {

size_t utf8_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead >> 5) == 0x6) return 2;
  if ((lead >> 4) == 0xE) return 3;
  if ((lead >> 3) == 0x1E) return 4;
  return 1;
}

void append_utf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

bool is_valid_utf8(std::string_view text) {
  const auto* p = reinterpret_cast<const utf8proc_uint8_t*>(text.data());
  utf8proc_ssize_t left = static_cast<utf8proc_ssize_t>(text.size());
  while (left > 0) {
    if (*p < 0x80) {  // ASCII fast path
      ++p;
      --left;
      continue;
    }
    utf8proc_int32_t cp;
    const utf8proc_ssize_t n = utf8proc_iterate(p, left, &cp);
    if (n < 0) return false;
    p += n;
    left -= n;
  }
  return true;
}

namespace {

struct FreeDeleter {
  void operator()(utf8proc_uint8_t* p) const { std::free(p); }
};

std::string map_text(std::string_view text, int options, const char* what) {
  utf8proc_uint8_t* raw = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                                          static_cast<utf8proc_ssize_t>(text.size()), &raw,
                                          static_cast<utf8proc_option_t>(options));
  std::unique_ptr<utf8proc_uint8_t, FreeDeleter> owned(raw);
  if (n < 0) {
    throw InputError(std::string(what) + ": text is not valid UTF-8 (" + utf8proc_errmsg(n) + ")");
  }
  return std::string(reinterpret_cast<const char*>(owned.get()), static_cast<size_t>(n));
}

}  // namespace

// Whether `text` is unchanged by `form` without running utf8proc: ASCII is invariant under all
// four forms, and text below U+0300 (where combining marks begin) under NFC, since no code
// point there decomposes canonically without recomposing or combines with what precedes it.
bool trivially_normal(std::string_view text, NormalForm form) {
  const unsigned char limit = form == NormalForm::kNFC ? 0xCC : 0x80;  // lead byte of U+0300
  for (unsigned char c : text) {
    if (c >= limit) return false;
  }
  return true;
}

std::string normalize(std::string_view text, NormalForm form) {
  if (trivially_normal(text, form)) return std::string(text);
  switch (form) {
    case NormalForm::kNFC:
      return map_text(text, UTF8PROC_STABLE | UTF8PROC_COMPOSE, "NFC");
    case NormalForm::kNFD:
      return map_text(text, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE, "NFD");
    case NormalForm::kNFKC:
      return map_text(text, UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT, "NFKC");
    case NormalForm::kNFKD:
      return map_text(text, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT, "NFKD");
  }
  return std::string(text);
}

std::string to_lower(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  const auto* p = reinterpret_cast<const utf8proc_uint8_t*>(text.data());
  utf8proc_ssize_t left = static_cast<utf8proc_ssize_t>(text.size());
  while (left > 0) {
    utf8proc_int32_t cp;
    const utf8proc_ssize_t n = utf8proc_iterate(p, left, &cp);
    if (n < 0) throw InputError("Lowercase: text is not valid UTF-8");
    append_utf8(static_cast<uint32_t>(utf8proc_tolower(cp)), out);
    p += n;
    left -= n;
  }
  return out;
}

// GPT-2 bytes_to_unicode(): printable Latin-1 bytes map to themselves, the other 68 bytes
// to U+0100.. in byte order.
ByteLevelMap::ByteLevelMap() {
  char_to_byte_.fill(-1);
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    const uint32_t cp = printable ? static_cast<uint32_t>(b) : next++;
    append_utf8(cp, byte_to_char_[b]);
    char_to_byte_[cp] = static_cast<int16_t>(b);
  }
}

const ByteLevelMap& ByteLevelMap::get() {
  static const ByteLevelMap kMap;
  return kMap;
}

std::string ByteLevelMap::encode(std::string_view bytes) const {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) out += byte_to_char_[b];
  return out;
}

std::string ByteLevelMap::decode(std::string_view chars) const {
  std::string out;
  out.reserve(chars.size());
  size_t i = 0;
  while (i < chars.size()) {
    const size_t n = std::min(utf8_length(static_cast<unsigned char>(chars[i])), chars.size() - i);
    uint32_t cp = static_cast<unsigned char>(chars[i]);
    if (n == 2) cp = ((cp & 0x1F) << 6) | (static_cast<unsigned char>(chars[i + 1]) & 0x3F);
    if (n <= 2 && cp < char_to_byte_.size() && char_to_byte_[cp] >= 0) {
      out += static_cast<char>(char_to_byte_[cp]);
    } else {
      out.append(chars.substr(i, n));
    }
    i += n;
  }
  return out;
}

}  // namespace rlhf::tokenizer
