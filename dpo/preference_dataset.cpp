#include "dpo/preference_dataset.h"

#include <random>

#include "core/errors.h"
#include "data/synthetic_calc.h"

namespace rlhf::dpo {

using nlohmann::json;

OfflineDataConfig OfflineDataConfig::from_spec(const JobSpec& spec, bool eval) {
  OfflineDataConfig c;
  c.source = spec.get_string(eval ? "data.eval_dataset" : "data.dataset");
  c.prompt_key = spec.get_string("data.prompt_key");
  c.chosen_key = spec.get_string("data.chosen_key");
  c.rejected_key = spec.get_string("data.rejected_key");
  c.output_key = spec.get_string("data.output_key");
  c.margin_key = spec.get_string("data.margin_key");
  const std::string label_key = spec.get_string("data.label_key");
  if (!label_key.empty()) c.label_key = label_key;
  c.multiturn = spec.get_bool("data.multiturn");
  c.max_samples = spec.get_int("data.max_samples");
  c.bad_lines = parse_bad_line_policy(spec.get_string("data.bad_lines"));
  c.seed = static_cast<uint64_t>(spec.get_int("train.seed")) + (eval ? 1 : 0);
  return c;
}

namespace {

const std::string kSynthetic = "synthetic:";

std::string random_word(std::mt19937_64& rng, int lo, int hi, const std::string& alphabet) {
  std::uniform_int_distribution<int> length(lo, hi);
  std::uniform_int_distribution<size_t> pick(0, alphabet.size() - 1);
  std::string w;
  for (int n = length(rng); n > 0; --n) w += alphabet[pick(rng)];
  return w;
}

const std::string kLower = "abcdefghijklmnopqrstuvwxyz";
const std::string kNoisy = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ";

template <typename Row, typename MakeSynthetic, typename ParseRow>
OfflineDataset<Row> load(const OfflineDataConfig& c, MakeSynthetic synthetic, ParseRow parse) {
  OfflineDataset<Row> out;
  if (c.source.rfind(kSynthetic, 0) == 0) {
    out.rows = synthetic(c.source.substr(kSynthetic.size()),
                         c.max_samples > 0 ? c.max_samples : 512, c.seed);
    out.stats.rows = static_cast<int64_t>(out.rows.size());
    return out;
  }
  out.stats = read_jsonl(c.source, c.bad_lines, c.max_samples, [&](const json& row, int64_t line) {
    out.rows.push_back(parse(row, line));
  });
  if (out.rows.empty())
    throw InputError(c.source + ": no usable rows" +
                     (out.stats.first_problem.empty()
                          ? ""
                          : " (first problem: " + out.stats.first_problem + ")"));
  return out;
}

}  // namespace

std::vector<PreferenceRow> synthetic_preferences(const std::string& name, int64_t count,
                                                 uint64_t seed) {
  if (name != "preferences")
    throw InputError("data.dataset: unknown synthetic preference dataset \"synthetic:" + name +
                     "\" (known: synthetic:preferences)");
  std::mt19937_64 rng(seed);
  std::vector<PreferenceRow> rows;
  for (int64_t i = 0; i < count; ++i) {
    PreferenceRow r;
    r.prompt = random_word(rng, 3, 8, kLower) + ":";
    r.chosen = random_word(rng, 4, 10, kLower);
    r.rejected = random_word(rng, 4, 10, kNoisy);
    rows.push_back(std::move(r));
  }
  return rows;
}

std::vector<SftRow> synthetic_sft(const std::string& name, int64_t count, uint64_t seed) {
  if (name == "calc_sft") {
    std::vector<SftRow> rows;
    std::mt19937_64 rng(seed ^ 0xca1cull);
    std::bernoulli_distribution use_tool(0.5);
    for (const auto& p : data::calc_problems(count, seed, false))
      rows.push_back({"", "", 0, data::calc_conversation(p, use_tool(rng))});
    return rows;
  }
  if (name != "letters_sft" && name != "noisy_sft")
    throw InputError("data.dataset: unknown synthetic SFT dataset \"synthetic:" + name +
                     "\" (known: synthetic:letters_sft, synthetic:noisy_sft, synthetic:calc_sft)");
  std::mt19937_64 rng(seed);
  std::bernoulli_distribution noisy(0.5);
  std::uniform_int_distribution<size_t> pick(0, kNoisy.size() - 1);
  std::vector<SftRow> rows;
  for (int64_t i = 0; i < count; ++i) {
    std::string word = random_word(rng, 3, 8, kLower);
    std::string output = word;
    if (name == "noisy_sft")
      for (char& c : output)
        if (noisy(rng)) c = kNoisy[pick(rng)];
    rows.push_back({word + ":", output, 0, nullptr});
  }
  return rows;
}

OfflineDataset<PreferenceRow> load_preferences(const OfflineDataConfig& c) {
  return load<PreferenceRow>(c, synthetic_preferences, [&](const json& row, int64_t line) {
    PreferenceRow r{string_field(row, c.prompt_key), string_field(row, c.chosen_key),
                    string_field(row, c.rejected_key), 0.0, line};
    if (!c.margin_key.empty()) {
      auto it = row.find(c.margin_key);
      if (it == row.end() || !it->is_number())
        throw InputError("expected a number at key \"" + c.margin_key + "\" (data.margin_key)");
      r.margin = it->get<double>();
    }
    return r;
  });
}

OfflineDataset<SftRow> load_sft(const OfflineDataConfig& c) {
  return load<SftRow>(c, synthetic_sft, [&](const json& row, int64_t line) {
    if (!c.multiturn)
      return SftRow{string_field(row, c.prompt_key), string_field(row, c.output_key), line,
                    nullptr};
    // A conversation; its roles and order are checked where the chat template renders it.
    auto it = row.find(c.prompt_key);
    if (it == row.end() || !it->is_array())
      throw InputError("expected a list of {\"role\", \"content\"} messages at key \"" +
                       c.prompt_key + "\" (data.prompt_key, with data.multiturn)");
    return SftRow{"", "", line, *it};
  });
}

OfflineDataset<UnpairedRow> load_unpaired(const OfflineDataConfig& c) {
  auto split = [](const std::string& name, int64_t count, uint64_t seed) {
    std::vector<UnpairedRow> rows;
    for (const auto& p : synthetic_preferences(name, (count + 1) / 2, seed)) {
      rows.push_back({p.prompt, p.chosen, true, 0});
      rows.push_back({p.prompt, p.rejected, false, 0});
    }
    rows.resize(static_cast<size_t>(std::min<int64_t>(count, static_cast<int64_t>(rows.size()))));
    return rows;
  };
  return load<UnpairedRow>(c, split, [&](const json& row, int64_t line) {
    UnpairedRow r{string_field(row, c.prompt_key), string_field(row, c.output_key), true, line};
    auto it = row.find(c.label_key);
    if (it != row.end() && it->is_boolean()) {
      r.desirable = it->get<bool>();
    } else if (it != row.end() && it->is_number_integer() &&
               (it->get<int64_t>() == 0 || it->get<int64_t>() == 1)) {
      r.desirable = it->get<int64_t>() == 1;
    } else {
      throw InputError("expected true or false (desirable or not) at key \"" + c.label_key +
                       "\" (data.label_key)");
    }
    return r;
  });
}

bool truncate_pair(std::vector<int64_t>& prompt, std::vector<int64_t>& response,
                   int64_t prompt_max_len, int64_t max_len, int64_t eos_id) {
  bool cut = false;
  if (static_cast<int64_t>(prompt.size()) > prompt_max_len) {
    prompt.erase(prompt.begin(), prompt.end() - prompt_max_len);
    cut = true;
  }
  const int64_t room = std::max<int64_t>(1, max_len - static_cast<int64_t>(prompt.size()));
  if (static_cast<int64_t>(response.size()) > room) {
    response.resize(static_cast<size_t>(room));
    if (eos_id >= 0) response.back() = eos_id;
    cut = true;
  }
  return cut;
}

}  // namespace rlhf::dpo
