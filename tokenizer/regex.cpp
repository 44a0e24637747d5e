// PCRE2 (8-bit, UTF, UCP) wrapper. Oniguruma, which HF tokenizers compile these patterns
// with, treats \s, \p{L}, \p{N} as Unicode classes: PCRE2_UCP gives the same.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex.h"

#include <pcre2.h>

#include <nlohmann/json.hpp>

#include "core/errors.h"

namespace rlhf::tokenizer {

namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  const int n = pcre2_get_error_message(code, buffer, sizeof(buffer));
  return n < 0 ? "PCRE2 error " + std::to_string(code)
               : std::string(reinterpret_cast<char*>(buffer));
}

struct MatchDataDeleter {
  void operator()(pcre2_match_data* m) const { pcre2_match_data_free(m); }
};

}  // namespace

struct Regex::Impl {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Impl() { pcre2_code_free(code); }
};

Regex::Regex(const std::string& pattern, const std::string& where)
    : pattern_(pattern), impl_(std::make_unique<Impl>()) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                              PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (!impl_->code) {
    throw InputError(where + ": regex '" + pattern + "' does not compile at offset " +
                     std::to_string(offset) + ": " + pcre2_message(error));
  }
  // JIT is an optimisation: without it (unsupported CPU), the interpreter gives the same spans.
  impl_->jit = pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() = default;

std::vector<Span> Regex::find_all(std::string_view text) const {
  std::vector<Span> spans;
  std::unique_ptr<pcre2_match_data, MatchDataDeleter> data(
      pcre2_match_data_create_from_pattern(impl_->code, nullptr));
  if (!data) throw RuntimeError("pcre2_match_data_create_from_pattern: out of memory");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t start = 0;
  uint32_t options = 0;  // the first call checks UTF-8; later calls skip the re-check
  while (start <= text.size()) {
    int rc = impl_->jit ? pcre2_jit_match(impl_->code, subject, text.size(), start, options,
                                          data.get(), nullptr)
                        : PCRE2_ERROR_JIT_STACKLIMIT;
    // The interpreter keeps its backtracking state on the heap: the fallback when JIT is off
    // or its machine stack is too small for this subject.
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      rc = pcre2_match(impl_->code, subject, text.size(), start, options, data.get(), nullptr);
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      if (rc <= PCRE2_ERROR_UTF8_ERR1 && rc >= PCRE2_ERROR_UTF8_ERR21) {
        throw InputError("text is not valid UTF-8 (" + pcre2_message(rc) + ")");
      }
      throw RuntimeError("regex '" + pattern_ + "': " + pcre2_message(rc));
    }
    options = PCRE2_NO_UTF_CHECK;
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data.get());
    const size_t begin = ovector[0], end = ovector[1];
    if (end > begin) {
      spans.emplace_back(begin, end);
      start = end;
    } else {  // an empty match: step over one character
      if (begin >= text.size()) break;
      size_t step = 1;
      while (begin + step < text.size() &&
             (static_cast<unsigned char>(text[begin + step]) & 0xC0) == 0x80)
        ++step;
      start = begin + step;
    }
  }
  return spans;
}

std::string escape_regex(std::string_view literal) {
  std::string out;
  for (char c : literal) {
    if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

std::shared_ptr<Regex> compile_pattern(const nlohmann::json& pattern, const std::string& where) {
  if (pattern.contains("String")) {
    return std::make_shared<Regex>(escape_regex(pattern["String"].get<std::string>()), where);
  }
  if (pattern.contains("Regex")) {
    return std::make_shared<Regex>(pattern["Regex"].get<std::string>(), where);
  }
  throw InputError(where + ": pattern must be {\"String\": ...} or {\"Regex\": ...}, got " +
                   pattern.dump());
}

std::string replace_all(const std::string& text, const Regex& regex, const std::string& content) {
  std::string out;
  size_t last = 0;
  for (const auto& [begin, end] : regex.find_all(text)) {
    out.append(text, last, begin - last);
    out += content;
    last = end;
  }
  out.append(text, last, std::string::npos);
  return out;
}

}  // namespace rlhf::tokenizer
