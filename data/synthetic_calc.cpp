#include "data/synthetic_calc.h"

#include <random>

#include "data/synthetic_split.h"

namespace rlhf::data {
namespace {

using nlohmann::json;

CalcProblem draw(std::mt19937_64& rng) {
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  const auto n = [](int64_t v) { return std::to_string(v); };
  switch (pick(0, 3)) {
    case 0: {
      const int64_t a = pick(100, 999), b = pick(11, 99);
      return {n(a) + " * " + n(b), a * b};
    }
    case 1: {
      const int64_t a = pick(1000, 9999), b = pick(1000, 9999), c = pick(1000, 9999);
      return {n(a) + " + " + n(b) + " + " + n(c), a + b + c};
    }
    case 2: {
      const int64_t a = pick(10, 99), b = pick(10, 99), c = pick(11, 49);
      return {"(" + n(a) + " + " + n(b) + ") * " + n(c), (a + b) * c};
    }
    default: {
      const int64_t a = pick(20, 99), b = pick(20, 99), c = pick(100, 999);
      return {n(a) + " * " + n(b) + " - " + n(c), a * b - c};
    }
  }
}

std::string answer_text(const CalcProblem& p) {
  return "The answer is " + std::to_string(p.answer) + ".";
}

}  // namespace

std::vector<CalcProblem> calc_problems(int64_t count, uint64_t seed, bool test) {
  std::mt19937_64 rng(test ? 0xca1c7e57ull : seed);
  return draw_split(
      count, rng, test, draw, [](const CalcProblem& p) { return p.expression; }, "synthetic:calc");
}

const std::string& calc_system_prompt() {
  static const std::string kPrompt =
      "You can use a calculator. To call it, reply with <tool_call>{\"name\": \"calculator\", "
      "\"arguments\": {\"expression\": \"2 + 3\"}}</tool_call> and its result comes back. End "
      "your final reply with the answer as a number.";
  return kPrompt;
}

json calc_prompt(const CalcProblem& problem) {
  return json::array({{{"role", "system"}, {"content", calc_system_prompt()}},
                      {{"role", "user"}, {"content", "What is " + problem.expression + "?"}}});
}

json calc_conversation(const CalcProblem& problem, bool use_tool) {
  json messages = calc_prompt(problem);
  if (use_tool) {
    // Written as the system prompt shows it (nlohmann's dump would sort the keys).
    const std::string call =
        "<tool_call>{\"name\": \"calculator\", \"arguments\": {\"expression\": \"" +
        problem.expression + "\"}}</tool_call>";
    messages.push_back({{"role", "assistant"}, {"content", call}});
    messages.push_back({{"role", "tool"}, {"content", std::to_string(problem.answer)}});
  }
  messages.push_back({{"role", "assistant"}, {"content", answer_text(problem)}});
  return messages;
}

}  // namespace rlhf::data
