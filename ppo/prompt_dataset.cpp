#include "ppo/prompt_dataset.h"

#include <random>

#include "core/errors.h"
#include "core/text.h"

namespace rlhf::ppo {

using nlohmann::json;

PromptDataConfig PromptDataConfig::from_spec(const JobSpec& spec) {
  PromptDataConfig c;
  c.source = spec.get_string("data.prompt_dataset");
  c.input_key = spec.get_string("data.input_key");
  c.label_key = spec.get_string("data.label_key");
  c.max_samples = spec.get_int("data.max_samples");
  c.bad_lines = parse_bad_line_policy(spec.get_string("data.bad_lines"));
  c.seed = static_cast<uint64_t>(spec.get_int("train.seed"));
  return c;
}

namespace {

void check_input(const json& input, const std::string& key) {
  if (input.is_string()) return;
  if (input.is_array() && !input.empty()) {
    for (const auto& m : input)
      if (!m.is_object() || !m.contains("role") || !m.contains("content") ||
          !m["role"].is_string() || !m["content"].is_string())
        throw InputError("key \"" + key +
                         "\": expected a string or a list of {\"role\", \"content\"} messages");
    return;
  }
  throw InputError("key \"" + key + "\": expected a string or a list of messages, found " +
                   input.dump().substr(0, 40));
}

}  // namespace

const std::vector<std::string>& synthetic_prompt_datasets() {
  static const std::vector<std::string> kNames = {"letters"};
  return kNames;
}

std::vector<PromptRow> synthetic_prompts(const std::string& name, int64_t count, uint64_t seed) {
  if (name != "letters")
    throw InputError("data.prompt_dataset: unknown synthetic dataset \"synthetic:" + name +
                     "\" (known: synthetic:" + join(synthetic_prompt_datasets(), ", synthetic:") +
                     ")");
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> length(3, 8), letter(0, 25);
  std::vector<PromptRow> rows;
  for (int64_t i = 0; i < count; ++i) {
    std::string word;
    for (int n = length(rng); n > 0; --n) word += static_cast<char>('a' + letter(rng));
    rows.push_back({json(word + ":"), "", 0});
  }
  return rows;
}

PromptDataset load_prompts(const PromptDataConfig& c) {
  PromptDataset out;
  const std::string prefix = "synthetic:";
  if (c.source.rfind(prefix, 0) == 0) {
    out.rows = synthetic_prompts(c.source.substr(prefix.size()),
                                 c.max_samples > 0 ? c.max_samples : 1024, c.seed);
    out.stats.rows = static_cast<int64_t>(out.rows.size());
    return out;
  }
  out.stats = read_jsonl(c.source, c.bad_lines, c.max_samples, [&](const json& row, int64_t line) {
    if (!row.is_object()) throw InputError("expected a JSON object per line");
    auto it = row.find(c.input_key);
    if (it == row.end()) throw InputError("missing key \"" + c.input_key + "\" (data.input_key)");
    check_input(*it, c.input_key);
    PromptRow p{*it, "", line};
    if (!c.label_key.empty()) {
      auto l = row.find(c.label_key);
      if (l == row.end()) throw InputError("missing key \"" + c.label_key + "\" (data.label_key)");
      p.label = l->is_string() ? l->get<std::string>() : l->dump();
    }
    out.rows.push_back(std::move(p));
  });
  if (out.rows.empty())
    throw InputError(c.source + ": no usable prompts" +
                     (out.stats.first_problem.empty()
                          ? ""
                          : " (first problem: " + out.stats.first_problem + ")"));
  return out;
}

std::string prompt_text(const json& input) {
  if (input.is_string()) return input.get<std::string>();
  std::string text;
  for (const auto& m : input)
    text += m["role"].get<std::string>() + ": " + m["content"].get<std::string>() + "\n";
  return text;
}

}  // namespace rlhf::ppo
