// The rule-based math reward: find a response's final answer, normalize it and the label, and
// compare them as numbers or as strings. No symbolic algebra (x+1 and 1+x differ): see
// tests/rewards/math_corpus.jsonl for where that makes us disagree with math-verify.
#pragma once

#include <optional>
#include <string>

namespace rlhf::rewards {

// The final answer of a model response, as written (not normalized), found in this order:
//   1. the content of the last complete \boxed{...} or \fbox{...} (nested braces balanced);
//   2. the rest of the line after the last GSM8K-style "####";
//   3. after the last "the answer is" or "answer:" (any case), up to the end of the sentence;
//   4. the last number: integer, decimal, 1,234 thousands, negative, a/b, \frac{a}{b}, 50%.
// std::nullopt when none of these finds anything.
std::optional<std::string> extract_final_answer(const std::string& response);

// The canonical text of an answer, so that equal answers written differently compare equal:
// LaTeX wrappers (\text{}, \mathrm{}, \(..\), $..$, \left, \right, \!, \,) and $ signs
// removed, "1,234" -> "1234", "3.50" -> "3.5", "12 apples" -> "12", \frac{a}{b} and
// \dfrac{a}{b} -> "a/b", "50\%" -> "50%", unicode minus -> "-", "x = 5" -> "5", whitespace
// removed (except between two digits: "1 1/2" is a mixed number). "" when nothing is left.
std::string normalize_answer(const std::string& answer);

// The value of a normalized answer that is a number ("-3", "0.25", ".5"), a fraction ("3/4"),
// a mixed number ("1 1/2") or a percentage ("50%" is 50, as graders compare it with "50").
// std::nullopt for anything else, and for a zero denominator.
std::optional<double> numeric_value(const std::string& normalized);

// 1.0 when the response's final answer equals the label, else 0.0 (also when the response has
// no answer). The label goes through the same pipeline, except that a label without a marker
// (\boxed, ####, "the answer is") is taken whole rather than reduced to its last number: a
// GSM8K answer field "... #### 72" gives 72, a bare "x+1" stays "x+1". Two numeric answers are
// equal within a relative tolerance of 1e-6 (absolute 1e-9 near zero); others are compared as
// normalized strings. Throws InputError when the label has no answer after normalization.
double math_score(const std::string& response, const std::string& label);

}  // namespace rlhf::rewards
