// The built-in environments (env.builtin), in C++ for tests and examples:
//   calculator   a tool `calculator` with argument `expression` (+ - * /, parentheses,
//                integers and decimals; its own parser, no eval). Each call's result (or
//                "error: ...") is the observation, one line per call, as a tool turn; a turn
//                without a tool call ends the trajectory (done, reward 0: the job's reward
//                sources score the final answer).
//   guess_number reset takes the target from the row's "target" or draws it from
//                env.options {low, high, seed}; each turn's last integer is a guess; the
//                observation is "higher" or "lower" as a user turn; done with reward 1 when
//                right, or with reward 0 after env.options.max_guesses guesses.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "envs/environment.h"

namespace rlhf::envs {

// The value of `expression`, or an "error: ..." text saying where and what was expected.
struct ArithmeticResult {
  std::optional<double> value;
  std::string error;  // "" when value is set
};
ArithmeticResult evaluate_arithmetic(const std::string& expression);

// "12", "-3", "0.333333333333", "1e+20": integers exactly, others with 12 significant digits.
std::string format_number(double value);

// "calculator" or "guess_number" with its env.options; throws InputError naming env.builtin
// for another name, or env.options for a bad option.
std::unique_ptr<Environment> make_builtin_environment(const std::string& name,
                                                      const nlohmann::json& options);

}  // namespace rlhf::envs
