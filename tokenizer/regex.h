// A compiled PCRE2 pattern (UTF + Unicode properties, JIT when available) that lists the
// spans it matches: what the HF Split and ByteLevel pre-tokenizers need. Nothing else.
#pragma once

#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace rlhf::tokenizer {

// [begin, end) byte offsets of one match.
using Span = std::pair<size_t, size_t>;

class Regex {
 public:
  // Throws InputError naming `where` (file and component) when the pattern does not compile.
  Regex(const std::string& pattern, const std::string& where);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Every non-overlapping match in `text`, left to right. Thread-safe.
  // Throws InputError when `text` is not valid UTF-8.
  std::vector<Span> find_all(std::string_view text) const;

  const std::string& pattern() const { return pattern_; }

 private:
  struct Impl;
  std::string pattern_;
  std::unique_ptr<Impl> impl_;
};

// A literal string pattern, escaped for PCRE2.
std::string escape_regex(std::string_view literal);

// An HF tokenizer.json pattern: {"String": literal} or {"Regex": pattern}.
// Throws InputError naming `where` when it is neither or does not compile.
std::shared_ptr<Regex> compile_pattern(const nlohmann::json& pattern, const std::string& where);

// `text` with every match of `regex` replaced by `content` (HF's Replace normalizer and decoder).
std::string replace_all(const std::string& text, const Regex& regex, const std::string& content);

}  // namespace rlhf::tokenizer
