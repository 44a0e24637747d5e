// PCRE2 behind FormatReward: a whole-response match (PCRE2_ANCHORED | PCRE2_ENDANCHORED) with
// DOTALL and UTF. JIT when the CPU has it; the interpreter gives the same answers otherwise.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "rewards/format_reward.h"

#include <pcre2.h>

#include "core/errors.h"

namespace rlhf::rewards {

namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  const int n = pcre2_get_error_message(code, buffer, sizeof(buffer));
  return n < 0 ? "PCRE2 error " + std::to_string(code)
               : std::string(reinterpret_cast<char*>(buffer));
}

struct MatchDataDeleter {
  void operator()(pcre2_match_data* data) const { pcre2_match_data_free(data); }
};

bool is_utf8_error(int rc) {
  return rc <= PCRE2_ERROR_UTF8_ERR1 && rc >= PCRE2_ERROR_UTF8_ERR21;
}

}  // namespace

struct FormatReward::Code {
  pcre2_code* code = nullptr;
  ~Code() { pcre2_code_free(code); }
};

FormatReward::FormatReward(const std::string& pattern)
    : pattern_(pattern), code_(std::make_unique<Code>()) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  // Anchored at both ends: the whole response must match, not a part of it.
  const uint32_t options = PCRE2_UTF | PCRE2_DOTALL | PCRE2_ANCHORED | PCRE2_ENDANCHORED;
  code_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options,
                              &error, &offset, nullptr);
  if (!code_->code) {
    throw InputError("reward rule format: pattern \"" + pattern + "\" does not compile: " +
                     pcre2_message(error) + " (at offset " + std::to_string(offset) + ")");
  }
  // JIT is an optimisation; without it (unsupported CPU) the interpreter answers the same.
  pcre2_jit_compile(code_->code, PCRE2_JIT_COMPLETE);
}

FormatReward::~FormatReward() = default;
FormatReward::FormatReward(FormatReward&&) noexcept = default;
FormatReward& FormatReward::operator=(FormatReward&&) noexcept = default;

double FormatReward::score(const std::string& response) const {
  std::unique_ptr<pcre2_match_data, MatchDataDeleter> data(
      pcre2_match_data_create_from_pattern(code_->code, nullptr));
  if (!data) throw RuntimeError("reward rule format: pcre2_match_data_create: out of memory");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(response.data());
  // pcre2_match checks the UTF-8 first, then runs the JIT code when there is some.
  int rc = pcre2_match(code_->code, subject, response.size(), 0, 0, data.get(), nullptr);
  // The interpreter keeps its backtracking state on the heap: the fallback when the JIT's
  // machine stack is too small for a long response.
  if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
    rc = pcre2_match(code_->code, subject, response.size(), 0, PCRE2_NO_JIT, data.get(), nullptr);
  }
  if (rc >= 0) return 1.0;
  // A response cut mid-character is not well formed: it does not match.
  if (rc == PCRE2_ERROR_NOMATCH || is_utf8_error(rc)) return 0.0;
  throw RuntimeError("reward rule format: matching pattern \"" + pattern_ +
                     "\" failed: " + pcre2_message(rc));
}

}  // namespace rlhf::rewards
