// Prompt datasets for PPO-family jobs: JSONL or Parquet rows with the prompt at
// data.input_key (a string or a chat message list) and an optional label at data.label_key
// (dotted keys reach into nested objects; data.label_from gsm8k takes the number after
// "####"), or a built-in synthetic:NAME dataset. Tokenization and truncation happen later,
// in the driver.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/jsonl.h"
#include "core/spec.h"

namespace rlhf::ppo {

struct PromptDataConfig {
  std::string source;  // JSONL path or "synthetic:NAME"
  std::string input_key = "input";
  std::string label_key;             // "" for none
  std::string label_from = "field";  // "field" | "gsm8k"
  std::string output_key;            // the response column (GKD's dataset responses); "": none
  int64_t max_samples = 0;           // 0: all
  BadLinePolicy bad_lines = BadLinePolicy::kFatal;
  uint64_t seed = 42;

  // The training prompts (data.prompt_dataset), or with `eval` the held-out ones
  // (data.eval_dataset, at most eval.max_samples).
  static PromptDataConfig from_spec(const JobSpec& spec, bool eval = false);
};

struct PromptRow {
  nlohmann::json input;  // a string, or [{"role": ..., "content": ...}, ...]
  std::string label;     // "" when the dataset has none
  int64_t line = 0;      // 1-based line (JSONL) or row (Parquet) in the file; 0 for synthetic rows
  // The row's other top-level columns (the label's column included, the prompt's left out,
  // as TRL passes dataset columns): Python reward functions get them as **row keywords.
  // Columns named prompts, completions or labels are dropped (those keywords are ours).
  nlohmann::json columns = nlohmann::json::object();
  std::string response;  // the dataset's response (PromptDataConfig::output_key), else ""
};

struct PromptDataset {
  std::vector<PromptRow> rows;
  JsonlStats stats;  // skipped lines and the first problem (JSONL only)
};

// Loads every row; throws InputError naming file:line for a bad row (unless skipped), or
// for an unknown synthetic dataset.
PromptDataset load_prompts(const PromptDataConfig& config);

// Built-in synthetic prompt datasets, for examples and tests (see docs/rewards.md):
//   letters:    short random lowercase words; pairs with the `letters` rule reward.
//   arith:      arithmetic word problems (one to three operations, varied sentence
//               templates, integer answers as labels); pairs with the `math` rule.
//   arith_test: the held-out split of arith: the same distribution, disjoint problems (a
//               problem's split follows a hash of its text), the same rows whatever the seed.
//   calc, calc_test: "What is 347 * 29?" after a system message describing the calculator
//               tool (data/synthetic_calc.h), the answer as label; train and held-out splits
//               as arith's. Pairs with env.builtin calculator and the `math` rule.
std::vector<PromptRow> synthetic_prompts(const std::string& name, int64_t count, uint64_t seed);
const std::vector<std::string>& synthetic_prompt_datasets();

// The prompt as plain text (a message list is joined as "role: content" lines); the chat
// template, when configured, is applied by the tokenizer's prompt formatting instead.
std::string prompt_text(const nlohmann::json& input);

}  // namespace rlhf::ppo
