#include "ppo/prompt_dataset.h"

#include <filesystem>
#include <random>

#include "core/errors.h"
#include "core/text.h"
#include "data/parquet_reader.h"
#include "data/synthetic_calc.h"
#include "data/synthetic_split.h"

namespace rlhf::ppo {

using nlohmann::json;

PromptDataConfig PromptDataConfig::from_spec(const JobSpec& spec, bool eval) {
  PromptDataConfig c;
  c.source = spec.get_string(eval ? "data.eval_dataset" : "data.prompt_dataset");
  c.input_key = spec.get_string("data.input_key");
  c.label_key = spec.get_string("data.label_key");
  c.label_from = spec.get_string("data.label_from");
  c.max_samples = spec.get_int(eval ? "eval.max_samples" : "data.max_samples");
  c.bad_lines = parse_bad_line_policy(spec.get_string("data.bad_lines"));
  c.seed = static_cast<uint64_t>(spec.get_int("train.seed"));
  if (!eval && spec.kind() == JobKind::kPpo && spec.get_float("algo.distill.gkd.lambda") < 1)
    c.output_key = spec.get_string("data.output_key");
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

// `key` in a row: the key itself, else a dotted path into nested objects
// ("reward_model.ground_truth", as veRL's GSM8K parquet keeps its label). nullptr if absent.
const json* find_key(const json& row, const std::string& key) {
  if (auto it = row.find(key); it != row.end()) return &*it;
  const json* at = &row;
  for (const auto& part : split(key, '.')) {
    if (!at->is_object()) return nullptr;
    auto it = at->find(part);
    if (it == at->end()) return nullptr;
    at = &*it;
  }
  return at;
}

// The number after the last "####" of a GSM8K answer ("... so 72 clips.\n#### 72" -> "72"),
// without thousands separators.
std::string gsm8k_label(const std::string& answer) {
  const auto at = answer.rfind("####");
  if (at == std::string::npos)
    throw InputError("data.label_from gsm8k: the label has no \"####\" (found \"" +
                     answer.substr(0, 60) + "\")");
  std::string out;
  for (char c : trim(answer.substr(at + 4)))
    if (c != ',') out += c;
  if (out.empty()) throw InputError("data.label_from gsm8k: nothing after \"####\"");
  return out;
}

// ---- synthetic:arith -------------------------------------------------------------------
// Word problems from sentence templates. A problem's split (train or held-out) is a hash of
// its text, so the two splits never share a problem whatever seeds draw them.

struct ArithProblem {
  std::string question;
  int64_t answer;
};

const char* const kNames[] = {"Tom", "Anna", "Lena", "Omar", "Mia", "Ravi", "Sara", "Ben"};
const char* const kItems[] = {"apples", "marbles", "stickers", "books",
                              "coins",  "pencils", "cookies",  "cards"};

ArithProblem arith_problem(std::mt19937_64& rng) {
  auto pick = [&](int lo, int hi) {
    return static_cast<int64_t>(std::uniform_int_distribution<int>(lo, hi)(rng));
  };
  const std::string name = kNames[pick(0, 7)], item = kItems[pick(0, 7)];
  const auto n = [](int64_t v) { return std::to_string(v); };
  switch (pick(0, 9)) {
    case 0: {  // a + b
      const int64_t a = pick(2, 20), b = pick(2, 20);
      return {name + " has " + n(a) + " " + item + ". " + name + " gets " + n(b) +
                  " more. How many " + item + " does " + name + " have now?",
              a + b};
    }
    case 1: {  // a - b
      const int64_t a = pick(10, 60), b = pick(1, a - 1);
      return {name + " had " + n(a) + " " + item + " and gave " + n(b) +
                  " of them away. How many " + item + " are left?",
              a - b};
    }
    case 2: {  // a * b
      const int64_t a = pick(2, 9), b = pick(2, 12);
      return {"There are " + n(a) + " boxes with " + n(b) + " " + item + " in each box. How many " +
                  item + " are there in total?",
              a * b};
    }
    case 3: {  // a * b / b
      const int64_t a = pick(2, 10), b = pick(2, 6);
      return {name + " shares " + n(a * b) + " " + item + " equally among " + n(b) +
                  " friends. How many " + item + " does each friend get?",
              a};
    }
    case 4: {  // a + b
      const int64_t a = pick(10, 60), b = pick(2, 30);
      return {"What is " + n(a) + " + " + n(b) + "?", a + b};
    }
    case 5: {  // a * b
      const int64_t a = pick(2, 12), b = pick(2, 12);
      return {"What is " + n(a) + " times " + n(b) + "?", a * b};
    }
    case 6: {  // a + b - c
      const int64_t a = pick(5, 30), b = pick(2, 20), c = pick(1, a + b - 1);
      return {name + " has " + n(a) + " " + item + ", buys " + n(b) + " more and then gives " +
                  n(c) + " to a friend. How many " + item + " does " + name + " have now?",
              a + b - c};
    }
    case 7: {  // a * b + c
      const int64_t a = pick(2, 6), b = pick(2, 10), c = pick(1, 20);
      return {name + " buys " + n(a) + " packs of " + item + " with " + n(b) +
                  " in each pack and already had " + n(c) + ". How many " + item + " does " + name +
                  " have in total?",
              a * b + c};
    }
    case 8: {  // a - b + c
      const int64_t a = pick(20, 80), b = pick(1, 19), c = pick(1, 30);
      return {"What is " + n(a) + " - " + n(b) + " + " + n(c) + "?", a - b + c};
    }
    default: {  // a * b + c - d
      const int64_t a = pick(2, 5), b = pick(2, 8), c = pick(1, 10), d = pick(1, a * b);
      return {name + " buys " + n(a) + " bags of " + item + " with " + n(b) +
                  " in each bag, gets " + n(c) + " more as a gift and loses " + n(d) +
                  ". How many " + item + " does " + name + " have?",
              a * b + c - d};
    }
  }
}

const char* const kArithInstruction = "End your reply with the answer as a number.";

std::vector<PromptRow> arith_rows(int64_t count, uint64_t seed, bool test) {
  // The held-out split draws from a fixed stream: the same rows whatever train.seed is.
  std::mt19937_64 rng(test ? 0x5eed7e57ull : seed);
  std::vector<PromptRow> rows;
  for (const ArithProblem& p : data::draw_split(
           count, rng, test, arith_problem, [](const ArithProblem& a) { return a.question; },
           "synthetic:arith"))
    // The instruction a verifier-trained prompt carries: where the answer goes.
    rows.push_back({json(p.question + " " + kArithInstruction), std::to_string(p.answer), 0});
  return rows;
}

}  // namespace

const std::vector<std::string>& synthetic_prompt_datasets() {
  static const std::vector<std::string> kNames = {"letters", "arith", "arith_test", "calc",
                                                  "calc_test"};
  return kNames;
}

std::vector<PromptRow> synthetic_prompts(const std::string& name, int64_t count, uint64_t seed) {
  if (name == "arith" || name == "arith_test") return arith_rows(count, seed, name == "arith_test");
  if (name == "calc" || name == "calc_test") {
    std::vector<PromptRow> rows;
    for (const auto& p : data::calc_problems(count, seed, name == "calc_test"))
      rows.push_back({data::calc_prompt(p), std::to_string(p.answer), 0});
    return rows;
  }
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
  if (c.source.rfind(prefix, 0) == 0 && !c.output_key.empty())
    throw InputError("data.prompt_dataset: " + c.source +
                     " has no responses, which algo.distill.gkd.lambda < 1 trains on: use a "
                     "JSONL or Parquet dataset with a data.output_key column");
  if (c.source.rfind(prefix, 0) == 0) {
    out.rows = synthetic_prompts(c.source.substr(prefix.size()),
                                 c.max_samples > 0 ? c.max_samples : 1024, c.seed);
    out.stats.rows = static_cast<int64_t>(out.rows.size());
    return out;
  }
  auto take = [&](const json& row, int64_t line) {
    if (!row.is_object()) throw InputError("expected a JSON object per line");
    const json* input = find_key(row, c.input_key);
    if (!input) throw InputError("missing key \"" + c.input_key + "\" (data.input_key)");
    check_input(*input, c.input_key);
    PromptRow p{*input, "", line, json::object()};
    for (const auto& [key, value] : row.items())
      if (key != c.input_key && key != "prompts" && key != "completions" && key != "labels")
        p.columns[key] = value;
    if (!c.label_key.empty()) {
      const json* l = find_key(row, c.label_key);
      if (!l || l->is_null())
        throw InputError("missing key \"" + c.label_key + "\" (data.label_key)");
      p.label = l->is_string() ? l->get<std::string>() : l->dump();
      if (c.label_from == "gsm8k") p.label = gsm8k_label(p.label);
    }
    if (!c.output_key.empty()) {
      const json* r = find_key(row, c.output_key);
      if (!r || !r->is_string())
        throw InputError(
            "missing string key \"" + c.output_key +
            "\" (data.output_key: GKD's dataset response, algo.distill.gkd.lambda < 1)");
      p.response = r->get<std::string>();
    }
    out.rows.push_back(std::move(p));
  };
  const auto ext = std::filesystem::path(c.source).extension().string();
  if (ext == ".parquet" || ext == ".pq") {
    // A bad row in a Parquet file is a wrong column, not a damaged line: always fatal.
    const auto rows = data::read_parquet_rows(c.source, c.max_samples);
    for (size_t i = 0; i < rows.size(); ++i) {
      try {
        take(rows[i], static_cast<int64_t>(i) + 1);
      } catch (const InputError& e) {
        throw InputError(c.source + ": row " + std::to_string(i + 1) + ": " + e.what());
      }
    }
    out.stats.rows = static_cast<int64_t>(out.rows.size());
  } else {
    out.stats = read_jsonl(c.source, c.bad_lines, c.max_samples, take);
  }
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
