// Built-in environments: a recursive-descent arithmetic parser for the calculator and the
// number-guessing game. Both answer at once: step() computes the observation and poll()
// hands it back.
#include "envs/builtin_envs.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <utility>
#include <vector>

#include "core/errors.h"
#include "envs/tool_calls.h"

namespace rlhf::envs {
namespace {

using nlohmann::json;

// Grammar:  expr := term (('+' | '-') term)*     term := factor (('*' | '/') factor)*
//           factor := ('+' | '-') factor | number | '(' expr ')'
//           number := digits ['.' digits] | '.' digits
class Arithmetic {
 public:
  explicit Arithmetic(const std::string& text) : s_(text) {}

  ArithmeticResult run() {
    const double v = expr();
    skip_space();
    if (error_.empty() && at_ < s_.size()) fail("an operator or the end");
    if (error_.empty() && !std::isfinite(v)) error_ = "error: the result overflows";
    if (!error_.empty()) return {std::nullopt, error_};
    return {v, ""};
  }

 private:
  static constexpr int kMaxDepth = 64;

  void skip_space() {
    while (at_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[at_]))) ++at_;
  }
  // Records the first error only: "expected X at position N in "...", found 'c'".
  double fail(const std::string& expected) {
    if (!error_.empty()) return 0;
    const std::string found =
        at_ < s_.size() ? "'" + std::string(1, s_[at_]) + "'" : std::string("the end");
    error_ = "error: expected " + expected + " at position " + std::to_string(at_ + 1) + " in \"" +
             s_ + "\", found " + found;
    return 0;
  }
  bool eat(char c) {
    skip_space();
    if (at_ < s_.size() && s_[at_] == c) {
      ++at_;
      return true;
    }
    return false;
  }
  double expr() {
    double v = term();
    while (error_.empty()) {
      if (eat('+'))
        v += term();
      else if (eat('-'))
        v -= term();
      else
        break;
    }
    return v;
  }
  double term() {
    double v = factor();
    while (error_.empty()) {
      if (eat('*')) {
        v *= factor();
      } else if (eat('/')) {
        const size_t where = at_;  // just past the '/': its 1-based position
        const double d = factor();
        if (error_.empty() && d == 0) {
          error_ =
              "error: division by zero at position " + std::to_string(where) + " in \"" + s_ + "\"";
        }
        v = d == 0 ? 0 : v / d;
      } else {
        break;
      }
    }
    return v;
  }
  double factor() {
    if (++depth_ > kMaxDepth) {
      --depth_;
      return fail("at most " + std::to_string(kMaxDepth) + " nested parentheses or signs");
    }
    double v = 0;
    if (eat('-')) {
      v = -factor();
    } else if (eat('+')) {
      v = factor();
    } else if (eat('(')) {
      v = expr();
      if (error_.empty() && !eat(')')) fail("')'");
    } else {
      v = number();
    }
    --depth_;
    return v;
  }
  double number() {
    skip_space();
    const size_t begin = at_;
    while (at_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[at_]))) ++at_;
    const size_t int_digits = at_ - begin;
    size_t frac_digits = 0;
    if (at_ < s_.size() && s_[at_] == '.') {
      ++at_;
      while (at_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[at_]))) {
        ++at_;
        ++frac_digits;
      }
    }
    if (int_digits + frac_digits == 0) {
      at_ = begin;
      return fail("a number or '('");
    }
    return std::strtod(s_.substr(begin, at_ - begin).c_str(), nullptr);
  }

  const std::string& s_;
  size_t at_ = 0;
  int depth_ = 0;
  std::string error_;
};

// An environment whose every answer is ready at once: step() queues it for poll().
class ImmediateEnvironment : public Environment {
 public:
  explicit ImmediateEnvironment(std::string name) : name_(std::move(name)) {}
  void reset(int64_t id, const json& row) override {
    close(id);  // an id may be reset again: its earlier trajectory is over
    rows_[id] = start(id, row);
    resets_.emplace_back(id, std::string());  // no initial observation
  }
  std::vector<std::pair<int64_t, std::string>> poll_resets(double) override {
    return std::exchange(resets_, {});
  }
  void step(int64_t id, const std::string& action) override {
    auto it = rows_.find(id);
    if (it == rows_.end()) {
      throw RuntimeError(name_ + ": step for trajectory " + std::to_string(id) +
                         ", which was not reset or is closed");
    }
    ready_.emplace_back(id, answer(it->second, action));
  }
  std::vector<std::pair<int64_t, Observation>> poll(double) override {
    return std::exchange(ready_, {});
  }
  void close(int64_t id) override {
    rows_.erase(id);
    resets_.erase(std::remove_if(resets_.begin(), resets_.end(),
                                 [id](const auto& r) { return r.first == id; }),
                  resets_.end());
  }
  const std::string& name() const override { return name_; }

 protected:
  // A trajectory's state: the game's target and guesses (unused by the calculator).
  struct State {
    int64_t target = 0;
    int guesses = 0;
  };
  virtual State start(int64_t id, const json& row) = 0;
  virtual Observation answer(State& state, const std::string& action) = 0;

 private:
  std::string name_;
  std::map<int64_t, State> rows_;
  std::vector<std::pair<int64_t, Observation>> ready_;
  std::vector<std::pair<int64_t, std::string>> resets_;
};

class Calculator : public ImmediateEnvironment {
 public:
  explicit Calculator(const json& options)
      : ImmediateEnvironment("builtin:calculator"),
        format_(parse_tool_call_format(options.value("tool_format", std::string("auto")))) {}

 protected:
  State start(int64_t, const json&) override { return {}; }
  Observation answer(State&, const std::string& action) override {
    const ParsedToolCalls parsed = parse_tool_calls(action, format_);
    Observation obs;
    if (!parsed.any()) {  // the final answer: nothing to append
      obs.done = true;
      return obs;
    }
    std::vector<std::string> lines = parsed.errors;
    obs.tool_calls = static_cast<int>(parsed.calls.size() + parsed.errors.size());
    obs.tool_errors = static_cast<int>(parsed.errors.size());
    for (const ToolCall& call : parsed.calls) {
      std::string line;
      const json* expression =
          call.arguments.contains("expression") ? &call.arguments["expression"] : nullptr;
      if (call.name != "calculator") {
        line = "error: unknown tool \"" + call.name + "\" (the tool is calculator)";
      } else if (!expression || !expression->is_string()) {
        line =
            "error: calculator expects the argument \"expression\", a string such as "
            "\"(2 + 3) * 4\"";
      } else {
        const ArithmeticResult r = evaluate_arithmetic(expression->get<std::string>());
        line = r.value ? format_number(*r.value) : r.error;
      }
      if (line.rfind("error:", 0) == 0) ++obs.tool_errors;
      lines.push_back(line);
    }
    for (size_t i = 0; i < lines.size(); ++i) obs.text += (i ? "\n" : "") + lines[i];
    return obs;
  }

 private:
  ToolCallFormat format_;
};

int64_t int_option(const json& options, const char* key, int64_t fallback) {
  if (!options.contains(key)) return fallback;
  if (!options[key].is_number_integer()) {
    throw InputError(std::string("env.options.") + key + ": expected an integer, found " +
                     options[key].dump());
  }
  return options[key].get<int64_t>();
}

class GuessNumber : public ImmediateEnvironment {
 public:
  explicit GuessNumber(const json& options)
      : ImmediateEnvironment("builtin:guess_number"),
        low_(int_option(options, "low", 1)),
        high_(int_option(options, "high", 100)),
        seed_(static_cast<uint64_t>(int_option(options, "seed", 0))),
        max_guesses_(static_cast<int>(int_option(options, "max_guesses", 8))) {
    if (low_ > high_ || max_guesses_ < 1) {
      throw InputError("env.options: guess_number needs low <= high and max_guesses >= 1, found " +
                       options.dump());
    }
  }

 protected:
  State start(int64_t id, const json& row) override {
    State s;
    if (row.is_object() && row.contains("target")) {
      const json& t = row["target"];
      if (t.is_number_integer())
        s.target = t.get<int64_t>();
      else if (t.is_string())
        s.target = std::stoll(t.get<std::string>());
      else
        throw InputError("guess_number: the row's \"target\" must be an integer, found " +
                         t.dump());
      return s;
    }
    // Deterministic per (seed, trajectory): the same run draws the same targets.
    std::mt19937_64 gen(seed_ * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(id));
    s.target = low_ + static_cast<int64_t>(gen() % static_cast<uint64_t>(high_ - low_ + 1));
    return s;
  }
  Observation answer(State& s, const std::string& action) override {
    Observation obs;
    obs.role = "user";
    ++s.guesses;
    const std::optional<int64_t> guess = last_integer(action);
    if (guess && *guess == s.target) {
      obs.done = true;
      obs.reward = 1;
      return obs;
    }
    if (s.guesses >= max_guesses_) {
      obs.done = true;
      return obs;
    }
    if (!guess) {
      obs.text = "error: no number in your guess; guess an integer from " + std::to_string(low_) +
                 " to " + std::to_string(high_);
    } else {
      obs.text = s.target > *guess ? "higher" : "lower";
    }
    return obs;
  }

 private:
  static std::optional<int64_t> last_integer(const std::string& text) {
    std::optional<int64_t> last;
    for (size_t i = 0; i < text.size();) {
      if (!std::isdigit(static_cast<unsigned char>(text[i]))) {
        ++i;
        continue;
      }
      size_t end = i;
      while (end < text.size() && std::isdigit(static_cast<unsigned char>(text[end]))) ++end;
      if (end - i <= 18) {
        const int64_t v = std::stoll(text.substr(i, end - i));
        last = i > 0 && text[i - 1] == '-' ? -v : v;
      }
      i = end;
    }
    return last;
  }

  int64_t low_, high_;
  uint64_t seed_;
  int max_guesses_;
};

}  // namespace

ArithmeticResult evaluate_arithmetic(const std::string& expression) {
  return Arithmetic(expression).run();
}

std::string format_number(double value) {
  char buffer[64];
  if (std::fabs(value) < 1e15 && value == std::floor(value)) {
    std::snprintf(buffer, sizeof buffer, "%.0f", value == 0 ? 0.0 : value);  // no "-0"
  } else {
    std::snprintf(buffer, sizeof buffer, "%.12g", value);
  }
  return buffer;
}

std::unique_ptr<Environment> make_builtin_environment(const std::string& name,
                                                      const json& options) {
  if (!options.is_object()) {
    throw InputError("env.options: expected an object, found " + options.dump());
  }
  if (name == "calculator") return std::make_unique<Calculator>(options);
  if (name == "guess_number") return std::make_unique<GuessNumber>(options);
  throw InputError("env.builtin: expected calculator or guess_number, found \"" + name + "\"");
}

}  // namespace rlhf::envs
