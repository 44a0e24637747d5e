// The format reward: 1 when a whole response matches a regular expression (PCRE2, UTF-8, '.'
// crosses newlines), else 0. It checks shape only ("<think>...</think><answer>...</answer>"),
// never correctness: that is math_verifier.h's job.
#pragma once

#include <memory>
#include <string>

namespace rlhf::rewards {

class FormatReward {
 public:
  // Compiles `pattern` once. Throws InputError naming the pattern, PCRE2's message and the
  // offset where compiling failed.
  explicit FormatReward(const std::string& pattern);
  ~FormatReward();
  FormatReward(FormatReward&&) noexcept;
  FormatReward& operator=(FormatReward&&) noexcept;
  FormatReward(const FormatReward&) = delete;
  FormatReward& operator=(const FormatReward&) = delete;

  // 1.0 when the pattern matches the response from its first byte to its last, else 0.0
  // (also for a response that is not valid UTF-8). Thread-safe: each call has its own match
  // data. Throws RuntimeError when PCRE2 fails otherwise (e.g. its match limit is hit).
  double score(const std::string& response) const;

  const std::string& pattern() const { return pattern_; }

 private:
  struct Code;  // the compiled pcre2_code, freed with it
  std::string pattern_;
  std::unique_ptr<Code> code_;
};

}  // namespace rlhf::rewards
