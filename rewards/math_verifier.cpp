// Final-answer extraction and normalization for the math reward, by hand-written scanning
// (no std::regex: a reward runs on every sampled response). ASCII-aware; UTF-8 passes through
// untouched except the unicode minus and the degree sign.
#include "rewards/math_verifier.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <initializer_list>
#include <string_view>

#include "core/errors.h"

namespace rlhf::rewards {

namespace {

constexpr size_t kNpos = std::string_view::npos;
constexpr std::string_view kUnicodeMinus = "\xE2\x88\x92";  // U+2212
constexpr std::string_view kDegreeSign = "\xC2\xB0";        // U+00B0

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
bool is_alpha(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}
bool is_alnum(char c) {
  return is_digit(c) || is_alpha(c);
}
bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

bool starts_with(std::string_view text, size_t pos, std::string_view prefix) {
  return text.size() >= pos + prefix.size() && text.compare(pos, prefix.size(), prefix) == 0;
}

std::string_view trim_view(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

std::string ascii_lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

// Replaces every occurrence of `from` (non-empty) in `s` by `to`.
void replace_all(std::string& s, std::string_view from, std::string_view to) {
  size_t pos = 0;
  while ((pos = s.find(from, pos)) != std::string::npos) {
    s.replace(pos, from.size(), to);
    pos += to.size();
  }
}

// The index of the '}' that closes the '{' at `open`, or npos when the text ends first.
size_t matching_brace(std::string_view text, size_t open) {
  int depth = 0;
  for (size_t i = open; i < text.size(); ++i) {
    if (text[i] == '\\' && i + 1 < text.size()) {
      ++i;  // \{ and \} are literal braces, not grouping
    } else if (text[i] == '{') {
      ++depth;
    } else if (text[i] == '}' && --depth == 0) {
      return i;
    }
  }
  return kNpos;
}

// The end of the number that starts at `i` (a digit, or '.' before a digit): digits with
// 1,234 thousands groups, a decimal part, a /denominator and a % or \% sign. `i` when no
// number starts there. The sign is the caller's business.
size_t scan_number(std::string_view t, size_t i) {
  size_t j = i;
  while (j < t.size() && is_digit(t[j])) ++j;
  const size_t integer_digits = j - i;
  // A comma is a thousands separator only after 1-3 digits and before exactly 3 ("1,234"),
  // so lists such as "1,2,3" and "12,5" stay separate numbers.
  if (integer_digits >= 1 && integer_digits <= 3) {
    while (j + 3 < t.size() && t[j] == ',' && is_digit(t[j + 1]) && is_digit(t[j + 2]) &&
           is_digit(t[j + 3]) && (j + 4 == t.size() || !is_digit(t[j + 4]))) {
      j += 4;
    }
  }
  if (j + 1 < t.size() && t[j] == '.' && is_digit(t[j + 1])) {
    for (++j; j < t.size() && is_digit(t[j]);) ++j;
  }
  if (j == i) return i;
  if (j + 1 < t.size() && t[j] == '/' && is_digit(t[j + 1])) {
    for (++j; j < t.size() && is_digit(t[j]);) ++j;
  }
  if (j < t.size() && t[j] == '%') {
    ++j;
  } else if (starts_with(t, j, "\\%")) {
    j += 2;
  }
  return j;
}

// Where a sign that ends just before `i` starts ("-" or the unicode minus), or `i` when the
// number has none. A '-' after a letter, digit or ')' is a subtraction, not a sign.
size_t sign_start(std::string_view t, size_t i) {
  if (i >= 1 && t[i - 1] == '-' && (i == 1 || (!is_alnum(t[i - 2]) && t[i - 2] != ')'))) {
    return i - 1;
  }
  if (i >= kUnicodeMinus.size() &&
      t.compare(i - kUnicodeMinus.size(), kUnicodeMinus.size(), kUnicodeMinus) == 0) {
    return i - kUnicodeMinus.size();
  }
  return i;
}

// The end of "\frac{a}{b}" (or \dfrac, \tfrac) at `i` when a and b are plain numbers, else `i`.
size_t scan_latex_fraction(std::string_view t, size_t i) {
  size_t j = kNpos;
  for (std::string_view command : {"\\frac", "\\dfrac", "\\tfrac"}) {
    if (starts_with(t, i, command)) j = i + command.size();
  }
  if (j == kNpos) return i;
  for (int part = 0; part < 2; ++part) {
    if (j >= t.size() || t[j] != '{') return i;
    const size_t close = matching_brace(t, j);
    if (close == kNpos) return i;
    const std::string_view inside = trim_view(t.substr(j + 1, close - j - 1));
    if (inside.empty() || scan_number(inside, 0) != inside.size()) return i;
    j = close + 1;
  }
  return j;
}

// 1. The content of the last complete, non-empty \boxed{...} or \fbox{...}. A box inside a
// box overrides it (the inner one is found later); an unclosed one (truncated) is skipped.
// "\boxed 5" (no braces) takes the following token.
std::optional<std::string> last_boxed(std::string_view text) {
  std::optional<std::string> found;
  for (size_t i = text.find('\\'); i != kNpos; i = text.find('\\', i + 1)) {
    size_t j = kNpos;
    for (std::string_view command : {"\\boxed", "\\fbox"}) {
      if (starts_with(text, i, command)) j = i + command.size();
    }
    if (j == kNpos || (j < text.size() && is_alpha(text[j]))) continue;  // e.g. \boxedsymbol
    const size_t after_command = j;
    while (j < text.size() && is_space(text[j])) ++j;
    std::string_view content;
    if (j < text.size() && text[j] == '{') {
      const size_t close = matching_brace(text, j);
      if (close == kNpos) continue;
      content = text.substr(j + 1, close - j - 1);
    } else if (j > after_command) {
      size_t end = j;
      while (end < text.size() && !is_space(text[end]) && text[end] != '$') ++end;
      content = text.substr(j, end - j);
    }
    content = trim_view(content);
    if (!content.empty()) found = std::string(content);
  }
  return found;
}

// 2. The rest of the line after the last "####" (GSM8K's answer marker).
std::optional<std::string> after_hashes(std::string_view text) {
  const size_t hashes = text.rfind("####");
  if (hashes == kNpos) return std::nullopt;
  std::string_view rest = text.substr(hashes + 4);
  rest = trim_view(rest.substr(0, rest.find('\n')));
  if (rest.empty()) return std::nullopt;
  return std::string(rest);
}

// The end of the sentence that starts at `i`: a newline, or . ! ? ; , followed by whitespace
// or the end of the text ("3.5" and "1,234" keep their points and commas).
size_t sentence_end(std::string_view text, size_t i) {
  for (size_t j = i; j < text.size(); ++j) {
    const char c = text[j];
    if (c == '\n') return j;
    const bool punctuation = c == '.' || c == '!' || c == '?' || c == ';' || c == ',';
    if (punctuation && (j + 1 == text.size() || is_space(text[j + 1]))) return j;
  }
  return text.size();
}

// 3. What follows the last "answer is" / "answer:" (any case; so also "the final answer is"),
// up to the end of its sentence.
std::optional<std::string> after_answer_phrase(std::string_view text) {
  const std::string lower = ascii_lower(text);
  size_t best = kNpos;  // where the answer text starts
  size_t best_phrase = kNpos;
  for (std::string_view phrase : {"answer is", "answer:"}) {
    for (size_t pos = lower.find(phrase); pos != std::string::npos;
         pos = lower.find(phrase, pos + 1)) {
      const size_t end = pos + phrase.size();
      if (end < lower.size() && is_alpha(lower[end])) continue;  // "the answer isn't"
      if (best_phrase == kNpos || pos > best_phrase) {
        best_phrase = pos;
        best = end;
      }
    }
  }
  if (best == kNpos) return std::nullopt;
  size_t start = best;
  while (start < text.size() && (is_space(text[start]) || text[start] == ':')) ++start;
  std::string_view answer = trim_view(text.substr(start, sentence_end(text, start) - start));
  // Lower-case words before a number are chatter: "approximately 3.14", "clearly $12".
  std::string_view rest = answer;
  while (!rest.empty() && rest.front() >= 'a' && rest.front() <= 'z') {
    size_t word_end = 0;
    while (word_end < rest.size() && is_alpha(rest[word_end])) ++word_end;
    if (word_end == rest.size() || !is_space(rest[word_end])) break;
    rest = trim_view(rest.substr(word_end));
    const char next = rest.empty() ? ' ' : rest.front();
    if (is_digit(next) || next == '-' || next == '$' || next == '\\') answer = rest;
  }
  if (answer.empty()) return std::nullopt;
  return std::string(answer);
}

// 4. The last number in the text, with its sign, as written. Digits right after a letter,
// '^' or '_' belong to a name or an exponent (x2, m^2, a_1) and are not numbers.
std::optional<std::string> last_number(std::string_view text) {
  std::optional<std::string> found;
  size_t i = 0;
  while (i < text.size()) {
    const char c = text[i];
    if (c == '\\') {
      const size_t end = scan_latex_fraction(text, i);
      if (end > i) {
        found = std::string(text.substr(sign_start(text, i), end - sign_start(text, i)));
        i = end;
        continue;
      }
      ++i;
      continue;
    }
    const bool starts_number =
        is_digit(c) || (c == '.' && i + 1 < text.size() && is_digit(text[i + 1]));
    if (!starts_number) {
      ++i;
      continue;
    }
    const char before = i > 0 ? text[i - 1] : ' ';
    const size_t end = scan_number(text, i);
    if (!is_alpha(before) && before != '^' && before != '_' && before != '{') {
      found = std::string(text.substr(sign_start(text, i), end - sign_start(text, i)));
    } else if (before == '{' && i >= 2 && text[i - 2] != '^' && text[i - 2] != '_') {
      found = std::string(text.substr(i, end - i));  // "\text{12}" but not "^{12}"
    }
    i = end;
  }
  return found;
}

// An answer marked as such: priorities 1-3 of extract_final_answer.
std::optional<std::string> marked_answer(std::string_view text) {
  if (auto boxed = last_boxed(text)) return boxed;
  if (auto hashes = after_hashes(text)) return hashes;
  return after_answer_phrase(text);
}

// Removes "\name" where it is not the start of a longer command (\left but not \leftarrow).
void remove_command(std::string& s, std::string_view name) {
  size_t pos = 0;
  while ((pos = s.find(name, pos)) != std::string::npos) {
    const size_t end = pos + name.size();
    if (end < s.size() && is_alpha(s[end]) && is_alpha(name.back())) {
      pos = end;
    } else {
      s.erase(pos, name.size());
    }
  }
}

// Replaces "\name{content}" by "content" (\text{12} -> 12). An unclosed one is left as is.
void unwrap_command(std::string& s, std::string_view name) {
  size_t pos = 0;
  while ((pos = s.find(name, pos)) != std::string::npos) {
    size_t open = pos + name.size();
    while (open < s.size() && s[open] == ' ') ++open;
    if (open >= s.size() || s[open] != '{') {
      pos += name.size();
      continue;
    }
    const size_t close = matching_brace(s, open);
    if (close == kNpos) {
      pos += name.size();
      continue;
    }
    s.erase(close, 1);
    s.erase(pos, open + 1 - pos);
  }
}

// An argument of \frac: "{12}" -> 12, or a single character ("\frac12"). The text it
// spans ends at *end. Empty when there is none.
std::string frac_argument(const std::string& s, size_t i, size_t* end) {
  while (i < s.size() && s[i] == ' ') ++i;
  if (i >= s.size()) return "";
  if (s[i] == '{') {
    const size_t close = matching_brace(s, i);
    if (close == kNpos) return "";
    *end = close + 1;
    return std::string(trim_view(std::string_view(s).substr(i + 1, close - i - 1)));
  }
  if (!is_alnum(s[i])) return "";
  *end = i + 1;
  return std::string(1, s[i]);
}

// A plain operand ("12", "x", "3.5") needs no parentheses on either side of '/'.
bool is_atom(const std::string& s) {
  return !s.empty() &&
         std::all_of(s.begin(), s.end(), [](char c) { return is_alnum(c) || c == '.'; });
}

// \frac{a}{b} -> a/b, or (a)/(b) when a part is not plain. After a digit it is the fraction of
// a mixed number: "1\frac{1}{2}" -> "1 1/2".
void rewrite_fractions(std::string& s) {
  replace_all(s, "\\dfrac", "\\frac");
  replace_all(s, "\\tfrac", "\\frac");
  size_t pos = 0;
  while ((pos = s.find("\\frac", pos)) != std::string::npos) {
    size_t numerator_end = 0, denominator_end = 0;
    const std::string numerator = frac_argument(s, pos + 5, &numerator_end);
    const std::string denominator =
        numerator.empty() ? "" : frac_argument(s, numerator_end, &denominator_end);
    if (denominator.empty()) {
      pos += 5;
      continue;
    }
    std::string fraction = (is_atom(numerator) ? numerator : "(" + numerator + ")") + "/" +
                           (is_atom(denominator) ? denominator : "(" + denominator + ")");
    if (pos > 0 && is_digit(s[pos - 1])) fraction = " " + fraction;
    s.replace(pos, denominator_end - pos, fraction);
    pos += fraction.size();
  }
}

// "x = 5" -> "5": a single assignment to a plain name keeps its value.
void drop_assignment(std::string& s) {
  const size_t eq = s.find('=');
  if (eq == std::string::npos || s.find('=', eq + 1) != std::string::npos) return;
  const std::string_view name = trim_view(std::string_view(s).substr(0, eq));
  if (name.empty() || !is_alpha(name.front())) return;
  if (!std::all_of(name.begin(), name.end(), [](char c) { return is_alnum(c) || c == '_'; })) {
    return;
  }
  s = std::string(trim_view(std::string_view(s).substr(eq + 1)));
}

// Words after a leading number are its unit: "12 apples", "5 cm", "3 dollars", "5 m^2",
// "60 km/h". Dropped when they hold no digit (other than an exponent) and either follow a space
// or are at least two letters long: "5x" stays an expression.
void drop_units(std::string& s) {
  const size_t number_start = !s.empty() && s[0] == '-' ? 1 : 0;
  if (number_start >= s.size() || !(is_digit(s[number_start]) || s[number_start] == '.')) return;
  const size_t end = scan_number(s, number_start);
  if (end == number_start || end == s.size()) return;
  const std::string_view tail = std::string_view(s).substr(end);
  size_t letters = 0;
  for (size_t i = 0; i < tail.size(); ++i) {
    const char c = tail[i];
    if (is_alpha(c)) {
      ++letters;
    } else if (is_digit(c)) {
      const bool exponent =
          i > 0 && (tail[i - 1] == '^' || (tail[i - 1] == '{' && i > 1 && tail[i - 2] == '^'));
      if (!exponent) return;
    } else if (!(is_space(c) || c == '.' || c == '/' || c == '^' || c == '{' || c == '}')) {
      return;
    }
  }
  if (letters == 0) return;
  const bool separated = is_space(tail.front());
  if (!separated && !(tail.size() >= 2 && is_alpha(tail[0]) && is_alpha(tail[1]))) return;
  s.erase(end);
}

// Removes whitespace, except one space between two digits ("1 1/2" stays a mixed number).
std::string squeeze_spaces(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (!is_space(s[i])) {
      out += s[i];
      continue;
    }
    size_t next = i;
    while (next < s.size() && is_space(s[next])) ++next;
    if (!out.empty() && is_digit(out.back()) && next < s.size() && is_digit(s[next])) out += ' ';
    i = next - 1;
  }
  return out;
}

// "1,234,567" -> "1234567" wherever a number is written with thousands groups.
std::string drop_thousands_separators(const std::string& s) {
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    const bool number_start =
        is_digit(s[i]) && (i == 0 || (!is_digit(s[i - 1]) && s[i - 1] != '.'));
    if (!number_start) {
      out += s[i++];
      continue;
    }
    size_t end = i;
    while (end < s.size() && is_digit(s[end])) ++end;
    const size_t grouped_end = scan_number(s, i);
    // scan_number also takes a decimal part, fraction and percent: copy all but the commas.
    for (size_t j = i; j < grouped_end; ++j) {
      if (s[j] != ',') out += s[j];
    }
    i = std::max(grouped_end, end);
  }
  return out;
}

// "12.0" -> "12", "3.50" -> "3.5": trailing zeros of every decimal part.
std::string drop_trailing_zeros(const std::string& s) {
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    if (!(s[i] == '.' && i > 0 && is_digit(s[i - 1]) && i + 1 < s.size() && is_digit(s[i + 1]))) {
      out += s[i++];
      continue;
    }
    size_t end = i + 1;
    while (end < s.size() && is_digit(s[end])) ++end;
    std::string_view decimals = std::string_view(s).substr(i + 1, end - i - 1);
    while (!decimals.empty() && decimals.back() == '0') decimals.remove_suffix(1);
    if (!decimals.empty()) out += "." + std::string(decimals);
    i = end;
  }
  return out;
}

// A plain decimal "12", "3.5", ".5" (no sign, no exponent), or nullopt.
std::optional<double> parse_decimal(std::string_view s) {
  size_t digits = 0, points = 0;
  for (char c : s) {
    if (is_digit(c)) {
      ++digits;
    } else if (c == '.') {
      ++points;
    } else {
      return std::nullopt;
    }
  }
  if (digits == 0 || points > 1) return std::nullopt;
  double value = 0;
  const auto [ptr, error] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (error != std::errc() || ptr != s.data() + s.size()) return std::nullopt;
  return value;
}

// "a/b" (b != 0) or a plain decimal.
std::optional<double> parse_fraction(std::string_view s) {
  const size_t slash = s.find('/');
  if (slash == kNpos) return parse_decimal(s);
  const auto numerator = parse_decimal(s.substr(0, slash));
  const auto denominator = parse_decimal(s.substr(slash + 1));
  if (!numerator || !denominator || *denominator == 0) return std::nullopt;
  return *numerator / *denominator;
}

bool numbers_equal(double a, double b) {
  const double tolerance = std::max(1e-9, 1e-6 * std::max(std::fabs(a), std::fabs(b)));
  return std::fabs(a - b) <= tolerance;
}

std::string quoted_for_message(const std::string& label) {
  constexpr size_t kMaxShown = 200;
  return label.size() <= kMaxShown ? label : label.substr(0, kMaxShown) + "...";
}

}  // namespace

std::optional<std::string> extract_final_answer(const std::string& response) {
  if (auto marked = marked_answer(response)) return marked;
  return last_number(response);
}

std::string normalize_answer(const std::string& answer) {
  std::string s = answer;
  replace_all(s, kUnicodeMinus, "-");
  replace_all(s, kDegreeSign, "");
  // Math delimiters and money signs.
  for (std::string_view delimiter : {"\\$", "$", "\\(", "\\)", "\\[", "\\]"}) {
    replace_all(s, delimiter, "");
  }
  // Wrappers whose content is the answer.
  for (std::string_view command :
       {"\\boxed", "\\fbox", "\\text", "\\textbf", "\\textit", "\\mathrm", "\\mathbf", "\\mbox"}) {
    unwrap_command(s, command);
  }
  // Sizing and spacing commands, and degrees ("90^\circ").
  for (std::string_view command :
       {"^{\\circ}", "^\\circ", "\\circ", "\\left", "\\right", "\\displaystyle", "\\!", "\\,",
        "\\;", "\\:", "\\qquad", "\\quad"}) {
    remove_command(s, command);
  }
  replace_all(s, "\\ ", " ");
  replace_all(s, "~", " ");
  replace_all(s, "\\%", "%");
  replace_all(s, "{,}", ",");  // LaTeX's 1{,}234
  rewrite_fractions(s);

  std::string_view view = trim_view(s);
  while (!view.empty() && (view.back() == '.' || is_space(view.back()))) view.remove_suffix(1);
  // One brace group around everything: "{5}" -> "5".
  while (view.size() >= 2 && view.front() == '{' && matching_brace(view, 0) == view.size() - 1) {
    view = trim_view(view.substr(1, view.size() - 2));
  }
  if (!view.empty() && view.front() == '+') view.remove_prefix(1);
  s = std::string(view);
  drop_assignment(s);
  if (s.size() >= 2 && s[0] == '-' && is_space(s[1])) s = "-" + std::string(trim_view(s.substr(1)));
  drop_units(s);
  s = squeeze_spaces(s);
  s = drop_thousands_separators(s);
  s = drop_trailing_zeros(s);
  while (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

std::optional<double> numeric_value(const std::string& normalized) {
  std::string_view s = normalized;
  if (!s.empty() && s.back() == '%') s.remove_suffix(1);  // 50% compares as 50
  const bool negative = !s.empty() && s.front() == '-';
  if (negative) s.remove_prefix(1);
  std::optional<double> value;
  const size_t space = s.find(' ');
  if (space == kNpos) {
    value = parse_fraction(s);
  } else {
    // A mixed number "1 1/2": a whole part, then a proper fraction.
    const std::string_view whole = s.substr(0, space), fraction = s.substr(space + 1);
    const bool whole_is_integer =
        !whole.empty() && std::all_of(whole.begin(), whole.end(), is_digit);
    if (whole_is_integer && fraction.find('/') != kNpos) {
      const auto whole_value = parse_decimal(whole);
      const auto fraction_value = parse_fraction(fraction);
      if (whole_value && fraction_value) value = *whole_value + *fraction_value;
    }
  }
  if (!value) return std::nullopt;
  return negative ? -*value : *value;
}

double math_score(const std::string& response, const std::string& label) {
  // A bare label is the answer itself ("x+1" must not become its last number, "1").
  const std::optional<std::string> marked_label = marked_answer(label);
  const std::string expected = normalize_answer(marked_label ? *marked_label : label);
  if (expected.empty()) {
    throw InputError("reward rule math: label \"" + quoted_for_message(label) +
                     "\" has no answer to compare with");
  }
  const std::optional<std::string> answer = extract_final_answer(response);
  if (!answer) return 0.0;
  const std::string given = normalize_answer(*answer);
  if (given.empty()) return 0.0;
  const std::optional<double> given_value = numeric_value(given);
  const std::optional<double> expected_value = numeric_value(expected);
  if (given_value && expected_value) {
    return numbers_equal(*given_value, *expected_value) ? 1.0 : 0.0;
  }
  return given == expected ? 1.0 : 0.0;
}

}  // namespace rlhf::rewards
