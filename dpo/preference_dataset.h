// Offline datasets for dpo, rm and sft jobs: JSONL rows with a prompt and either a
// chosen/rejected pair (preference), one target output (sft), or one output with a
// desirable flag (unpaired, for kto), key names from the spec;
// or a built-in synthetic:NAME dataset. Also the token-level truncation that keeps the
// prompt. Tokenization itself belongs to the driver.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/jsonl.h"
#include "core/spec.h"

namespace rlhf::dpo {

struct OfflineDataConfig {
  std::string source;  // JSONL path or "synthetic:NAME"
  std::string prompt_key = "prompt";
  std::string chosen_key = "chosen";
  std::string rejected_key = "rejected";
  std::string output_key = "output";
  std::string margin_key;           // empty: no per-pair margin
  std::string label_key = "label";  // unpaired rows: the desirable flag
  bool multiturn = false;           // data.multiturn: sft rows hold a conversation at prompt_key
  int64_t max_samples = 0;
  BadLinePolicy bad_lines = BadLinePolicy::kFatal;
  uint64_t seed = 42;

  // `eval`: read data.eval_dataset instead of data.dataset.
  static OfflineDataConfig from_spec(const JobSpec& spec, bool eval = false);
};

struct PreferenceRow {
  std::string prompt, chosen, rejected;
  double margin = 0.0;  // reward-model margin (data.margin_key; 0 without it)
  int64_t line = 0;     // 1-based line in the file (0 for synthetic rows)
};

struct SftRow {
  std::string prompt, output;
  int64_t line = 0;
  // A whole conversation (data.multiturn, or a synthetic conversation set): the list of
  // {role, content} messages whose assistant turns are trained; null for prompt/output rows.
  nlohmann::json messages;
};

struct UnpairedRow {
  std::string prompt, output;
  bool desirable = true;
  int64_t line = 0;
};

template <typename Row>
struct OfflineDataset {
  std::vector<Row> rows;
  JsonlStats stats;
};

// Throw InputError naming file:line (fatal policy) or an unknown synthetic name.
OfflineDataset<PreferenceRow> load_preferences(const OfflineDataConfig& config);
OfflineDataset<SftRow> load_sft(const OfflineDataConfig& config);
// Rows {prompt_key, output_key, label_key}; the label is true/false (or 1/0). A synthetic
// NAME is a preference set split in two: each pair gives its chosen row (desirable) and its
// rejected row (undesirable), as TRL turns paired data into unpaired.
OfflineDataset<UnpairedRow> load_unpaired(const OfflineDataConfig& config);

// Built-in synthetic datasets (deterministic per seed; documented in docs/datasets.md):
//   preferences: prompt "word:", chosen = lowercase letters, rejected = digits and capitals.
//   letters_sft: prompt "word:", output = the word again.
//   noisy_sft:   the same, each output character replaced with probability 0.5 by a digit
//                or capital (a policy that a lowercase-preferring reward model can improve).
//   calc_sft:    conversations for synthetic:calc's problems (data/synthetic_calc.h): half
//                call the calculator tool and answer with its result, half answer at once.
std::vector<PreferenceRow> synthetic_preferences(const std::string& name, int64_t count,
                                                 uint64_t seed);
std::vector<SftRow> synthetic_sft(const std::string& name, int64_t count, uint64_t seed);

// Truncates a (prompt, response) pair of token ids to `max_len` total, keeping the prompt:
// a prompt longer than `prompt_max_len` keeps its last prompt_max_len tokens, then the
// response is cut to what is left (at least 1 token when max_len > prompt_max_len). A cut
// response ends in `eos_id` when it is >= 0 (its last kept token is overwritten, as
// OpenRLHF does, so a reward model is trained at the token PPO scores it at).
// Returns true when anything was cut.
bool truncate_pair(std::vector<int64_t>& prompt, std::vector<int64_t>& response,
                   int64_t prompt_max_len, int64_t max_len, int64_t eos_id = -1);

}  // namespace rlhf::dpo
