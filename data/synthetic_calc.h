// synthetic:calc: arithmetic a calculator tool makes easy and a small model gets wrong in its
// head ("What is 347 * 29?"), for multi-turn RL with the built-in calculator environment
// (env.builtin calculator, issue 31) and for the SFT conversations that warm-start tool use.
// One problem generator feeds both, so the prompts PPO trains on and the conversations SFT
// trains on are the same distribution: the PPO prompt set (ppo/prompt_dataset.h) and the SFT
// set (dpo/preference_dataset.h) are built from it.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace rlhf::data {

struct CalcProblem {
  std::string expression;  // "347 * 29", "4821 + 3975 + 1208", "(58 + 27) * 13", "64 * 87 - 512"
  int64_t answer = 0;
};

// `count` distinct problems. A problem's split follows a hash of its expression (one in five
// is held out), so the `test` split never shares a problem with the training split; the test
// split is drawn from a fixed stream, the same rows whatever the seed.
// Throws InputError when `count` distinct problems cannot be drawn.
std::vector<CalcProblem> calc_problems(int64_t count, uint64_t seed, bool test);

// The system message: the calculator tool and the Hermes call format (Qwen2.5, SmolLM2), and
// where the answer goes.
const std::string& calc_system_prompt();

// [system, user "What is EXPR?"]: a prompt for the rollout.
nlohmann::json calc_prompt(const CalcProblem& problem);

// A whole conversation for SFT. With `use_tool`: the prompt, an assistant turn with the
// calculator call, the tool turn with its result, and "The answer is N."; without: the prompt
// and "The answer is N." at once (as a model that does the sum in its head would answer).
nlohmann::json calc_conversation(const CalcProblem& problem, bool use_tool);

}  // namespace rlhf::data
