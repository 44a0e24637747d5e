#include "rewards/spec_keys.h"

#include <algorithm>
#include <functional>
#include <iterator>
#include <map>

#include "core/python_ref.h"
#include "core/spec_check.h"
#include "core/text.h"

namespace rlhf::rewards {

using nlohmann::json;

namespace {

using Problem = std::function<void(const std::string& path, const std::string& message)>;

// The kinds of source, as a reward.sources entry names them (one each).
const char* const kKinds[] = {"rule", "python", "remote_url", "model", "judge"};

// A judge entry's object ({"judge": {...}}, rewards/judge.h), field by field.
void check_judge(const json& judge, const std::string& at, const Problem& problem) {
  const std::string where = at + ".judge";
  const std::vector<std::string> texts = {"url", "template", "score", "model"};
  const std::vector<std::string> counts = {"votes", "max_tokens", "concurrency"};
  const std::vector<std::string> numbers = {"temperature", "default"};
  for (const auto& [field, value] : judge.items()) {
    const auto in = [&](const std::vector<std::string>& list) {
      return std::find(list.begin(), list.end(), field) != list.end();
    };
    if (in(texts) && !(value.is_string() && !value.get<std::string>().empty()))
      problem("reward.sources",
              where + "." + field + ": expected a non-empty string, found " + value.dump());
    else if (in(counts) && !(value.is_number_integer() && value.get<int64_t>() >= 1))
      problem("reward.sources",
              where + "." + field + ": expected an integer >= 1, found " + value.dump());
    else if (in(numbers) && !value.is_number())
      problem("reward.sources", where + "." + field + ": expected a number, found " + value.dump());
    else if (!in(texts) && !in(counts) && !in(numbers)) {
      std::vector<std::string> all = texts;
      all.insert(all.end(), counts.begin(), counts.end());
      all.insert(all.end(), numbers.begin(), numbers.end());
      const std::string hint = closest_match(field, all);
      problem("reward.sources", where + "." + field + ": unknown field" +
                                    (hint.empty() ? "" : " (did you mean " + hint + "?)"));
    }
  }
  if (!judge.contains("url") && judge.contains("model"))
    problem("reward.sources",
            where +
                ".model: names the endpoint's model, but this judge has no url: a judge "
                "without a url runs judge.model on the job's judge group (judge.devices)");
  for (const char* key : {"template", "score"})
    if (!judge.contains(key))
      problem("reward.sources",
              where + "." + key + ": required (" +
                  (std::string(key) == "template"
                       ? "a file with {{ prompt }}, {{ response }} and {{ label }})"
                       : "a regular expression whose first group is the score, or "
                         "\"choice:A,B\")"));
  if (judge.contains("votes") && judge["votes"].is_number_integer() &&
      judge["votes"].get<int64_t>() > 1 && judge.contains("temperature") &&
      judge["temperature"].is_number() && judge["temperature"].get<double>() == 0)
    problem("reward.sources", where + ".votes: " + judge["votes"].dump() +
                                  " votes of a greedy judge (temperature 0) are all the same: "
                                  "set a temperature > 0 or one vote");
}

// One reward.sources entry, checked field by field: {"kind", its field, "weight", ...}, or
// null after a problem.
json listed_source(const json& g, const std::string& at, const Problem& problem) {
  const std::vector<std::string> fields = {"rule",  "python", "remote_url", "model",
                                           "judge", "weight", "name",       "pattern"};
  json src = json::object();
  int found = 0;
  for (const auto& [field, value] : g.items()) {
    if (std::find(fields.begin(), fields.end(), field) == fields.end()) {
      std::string hint = closest_match(field, fields);
      problem("reward.sources", at + "." + field + ": unknown field" +
                                    (hint.empty() ? "" : " (did you mean " + hint + "?)"));
      continue;
    }
    if (field == "weight") {
      if (!value.is_number())
        problem("reward.sources", at + ".weight: expected a number, found " + value.dump());
      continue;
    }
    if (field == "judge") {
      if (!value.is_object()) {
        problem("reward.sources", at +
                                      ".judge: expected an object {\"url\", \"template\", "
                                      "\"score\", ...}, found " +
                                      value.dump());
        continue;
      }
      check_judge(value, at, problem);
      ++found;
      src["kind"] = "judge";
      continue;
    }
    if (!value.is_string() || value.get<std::string>().empty()) {
      problem("reward.sources",
              at + "." + field + ": expected a non-empty string, found " + value.dump());
      continue;
    }
    if (std::find(std::begin(kKinds), std::end(kKinds), field) != std::end(kKinds)) {
      ++found;
      src["kind"] = field == "remote_url" ? "remote" : field;
    }
  }
  if (found != 1) {
    problem("reward.sources", at +
                                  ": expected exactly one of \"rule\", \"python\", "
                                  "\"remote_url\", \"model\", \"judge\", found " +
                                  std::to_string(found));
    return nullptr;
  }
  for (const auto& [field, value] : g.items())
    if (field != "weight" && (value.is_string() || field == "judge")) src[field] = value;
  src["weight"] = g.contains("weight") && g["weight"].is_number() ? g["weight"] : json(1.0);
  return src;
}

// The single-source keys. reward.model is the source only when no other shorthand is set:
// beside a rule, a Python function or a URL it is only where the critic starts from
// (critic.model's default).
json shorthand_sources(const std::function<std::string(const char*)>& s) {
  json list = json::array();
  const bool other =
      !s("reward.rule").empty() || !s("reward.python").empty() || !s("reward.remote_url").empty();
  if (!s("reward.model").empty() && !other)
    list.push_back({{"kind", "model"}, {"model", s("reward.model")}});
  if (!s("reward.rule").empty()) list.push_back({{"kind", "rule"}, {"rule", s("reward.rule")}});
  if (!s("reward.python").empty())
    list.push_back({{"kind", "python"}, {"python", s("reward.python")}});
  if (!s("reward.remote_url").empty())
    list.push_back({{"kind", "remote"}, {"remote_url", s("reward.remote_url")}});
  for (auto& src : list) src["weight"] = 1.0;
  return list;
}

// Names: given, else the rule's name, the Python function's, "remote", "model"; repeats get
// a suffix (_2, _3) so every source has its own metric.
std::string source_name(const json& src) {
  std::string name = src.value("name", std::string());
  if (!name.empty()) return name;
  const std::string kind = src["kind"];
  if (kind == "rule") return src["rule"];
  if (kind != "python") return kind;
  const std::string spec = src["python"];
  const auto ref = parse_python_ref(spec);
  return ref ? ref->name : spec;
}

}  // namespace

json reward_sources(const json& r, std::vector<SpecProblem>* problems) {
  auto s = [&](const char* path) { return r.at(spec_pointer(path)).get<std::string>(); };
  const Problem problem = [&](const std::string& path, const std::string& message) {
    if (problems) problems->push_back({path, message});
  };
  const json& given = r.at(spec_pointer("reward.sources"));
  json list = json::array();
  if (!given.empty()) {
    for (const char* shorthand : {"reward.rule", "reward.python", "reward.remote_url"})
      if (!s(shorthand).empty())
        problem(shorthand, "set either reward.sources or the single-source keys, not both");
    for (size_t i = 0; i < given.size(); ++i) {
      json src = listed_source(given[i], "reward.sources[" + std::to_string(i) + "]", problem);
      if (!src.is_null()) list.push_back(std::move(src));
    }
  } else {
    list = shorthand_sources(s);
  }
  std::map<std::string, int> used;
  for (auto& src : list) {
    if (src["kind"] == "rule" && src["rule"] == "format" && !src.contains("pattern") &&
        !s("reward.format_pattern").empty())
      src["pattern"] = s("reward.format_pattern");
    std::string name = source_name(src);
    if (int n = ++used[name]; n > 1) name += "_" + std::to_string(n);
    src["name"] = name;
  }
  return list;
}

bool uses_reward_model(const json& resolved) {
  for (const auto& src : reward_sources(resolved))
    if (src["kind"] == "model") return true;
  return false;
}

bool uses_local_judge(const json& resolved) {
  for (const auto& src : reward_sources(resolved))
    if (src["kind"] == "judge" && !src["judge"].contains("url")) return true;
  return false;
}

namespace {

// A {"model": DIR} source is the reward role's model.
void resolve_model_source(SpecCheck& v) {
  if (!v.ok({"reward.sources"}) || v.kind() != "ppo") return;
  for (const auto& src : reward_sources(v.resolved)) {
    if (src["kind"] == "model" && v.str("reward.model").empty()) {
      v.set("reward.model", src["model"]);
    } else if (src["kind"] == "model" && src["model"] != v.at("reward.model")) {
      v.problem("reward.sources", "the model source " + src["model"].dump() +
                                      " differs from reward.model " + v.at("reward.model").dump() +
                                      " (the reward group serves one)");
    }
  }
}

// Each source's own fields (ppo jobs), then the shaping keys.
void check_rewards(SpecCheck& v) {
  const auto clip = v.at("reward.clip_range");
  if (v.ok({"reward.clip_range"}) && clip[0].get<double>() >= clip[1].get<double>())
    v.problem("reward.clip_range", "expected [low, high] with low < high, found " + clip.dump());
  if (v.kind() != "ppo") return;
  std::vector<SpecProblem> problems;
  const json sources = reward_sources(v.resolved, &problems);
  for (const auto& p : problems) v.problem(p.path, p.message);
  int models = 0;
  for (const auto& src : sources) {
    if (src["kind"] == "model") ++models;
    if (src["kind"] == "python" && !parse_python_ref(src["python"].get<std::string>()))
      v.problem(
          v.at("reward.sources").empty() ? "reward.python" : "reward.sources",
          "expected \"FILE.py:FUNCTION\", found \"" + src["python"].get<std::string>() + "\"");
    if (src["kind"] == "rule" && src["rule"] == "format" && !src.contains("pattern"))
      v.problem("reward.format_pattern",
                "the format rule needs a pattern: reward.format_pattern, or \"pattern\" in its "
                "reward.sources entry");
  }
  if (models > 1)
    v.problem("reward.sources", "at most one reward model source (the reward group serves it)");
  if (v.ok({"reward.overlong_buffer_len", "rollout.max_new_tokens"}) &&
      v.integer("reward.overlong_buffer_len") > v.integer("rollout.max_new_tokens"))
    v.problem("reward.overlong_buffer_len",
              "expected at most rollout.max_new_tokens (" +
                  std::to_string(v.integer("rollout.max_new_tokens")) + "), found " +
                  std::to_string(v.integer("reward.overlong_buffer_len")));
}

}  // namespace

SpecSection spec_section() {
  SpecSection s;
  s.owner = "rewards";
  s.keys = [](KeyTable& t) {
    t.numbers("reward.clip_range", {-10.0, 10.0}, "Scores are clipped to [low, high].");
    t.string("reward.remote_url", "",
             "HTTP endpoint scoring {prompts, responses, labels} (instead of a reward model).");
    t.number("reward.remote_timeout_s", 30.0, 0, 3600, "Timeout of one remote reward call.", true);
    t.string("reward.rule", "",
             "Built-in rule reward instead of a model: letters, match_label, math, format (see "
             "docs/rewards.md).");
    t.file("reward.python", "",
           "A Python reward function \"FILE.py:FUNCTION\" with TRL's signature fn(prompts, "
           "completions, labels, **row) -> list[float], run in rlhf's pool of Python processes.");
    t.string("reward.format_pattern", "",
             "Regular expression (PCRE2, . matches newlines) the whole response must match for "
             "the format rule to give 1 (e.g. <think>.*</think>\\s*<answer>.*</answer>).");
    KeySpec& sources = t.add(
        "reward.sources", KeyType::kSources, json::array(),
        "Several reward sources, summed with weights (TRL's reward_funcs + reward_weights): "
        "a list of {\"rule\": NAME} | {\"python\": \"FILE.py:FUNCTION\"} | {\"remote_url\": URL} "
        "| {\"model\": DIR} | {\"judge\": {\"url\", \"template\", \"score\", ...}} (a generative "
        "judge behind an OpenAI-compatible endpoint, docs/rewards.md), each with optional "
        "\"weight\" (default 1), \"name\" and, for the format rule, \"pattern\". Each is logged "
        "as reward/<name>. Instead of the single-source keys reward.rule, reward.python, "
        "reward.remote_url, reward.model.");
    sources.path_fields = {"python", "model", "judge.template"};
    t.string("reward.python_interpreter", "python3",
             "Interpreter of the Python reward processes (a venv's python for your packages).");
    t.integer("reward.python_workers", 2, 1, 256,
              "Python processes per Python reward source; a batch is split between them.");
    t.number("reward.python_timeout_s", 300.0, 0, 86400,
             "Seconds one batch may take in a Python reward function before the job stops.", true);
    t.integer("reward.overlong_buffer_len", 0, 0, kUnbounded,
              "DAPO overlong reward shaping: a response longer than rollout.max_new_tokens minus "
              "this many tokens loses reward.overlong_penalty_factor x (excess / this), up to the "
              "whole factor (0: off).");
    t.number("reward.overlong_penalty_factor", 1.0, 0, kUnbounded,
             "Largest overlong penalty (at rollout.max_new_tokens tokens).");
  };
  s.resolve = resolve_model_source;
  s.rules = check_rewards;
  return s;
}

}  // namespace rlhf::rewards
