#include "rewards/judge.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <future>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/errors.h"

namespace rlhf::rewards {

using nlohmann::json;

JudgeConfig JudgeConfig::from_json(const json& judge, const std::string& name, double timeout_s) {
  JudgeConfig c;
  c.name = name;
  c.timeout_s = timeout_s;
  const std::string at = "reward source \"" + name + "\": judge.";
  auto text = [&](const char* key, bool required) {
    if (!judge.contains(key)) {
      if (required) throw InputError(at + key + " is required");
      return std::string();
    }
    return judge.at(key).get<std::string>();
  };
  c.url = text("url", false);
  c.model = text("model", false);
  c.template_path = text("template", true);
  c.score = text("score", true);
  c.votes = judge.value("votes", int64_t{1});
  c.temperature = judge.value("temperature", c.votes > 1 ? 1.0 : 0.0);
  c.max_tokens = judge.value("max_tokens", int64_t{64});
  c.default_score = judge.value("default", 0.0);
  c.concurrency = judge.value("concurrency", int64_t{8});
  return c;
}

JudgeTemplate JudgeTemplate::load(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InputError(path + ": cannot read the judge's template");
  std::stringstream text;
  text << in.rdbuf();
  return parse(text.str(), path);
}

JudgeTemplate JudgeTemplate::parse(const std::string& text, const std::string& where) {
  JudgeTemplate t;
  auto line_of = [&](size_t at) {
    return std::to_string(std::count(text.begin(), text.begin() + static_cast<long>(at), '\n') + 1);
  };
  if (const size_t at = text.find("{%"); at != std::string::npos)
    throw InputError(where + ":" + line_of(at) +
                     ": a Jinja statement ({% ... %}); a judge's template has only {{ prompt }}, "
                     "{{ response }} and {{ label }}");
  size_t from = 0;
  while (true) {
    const size_t open = text.find("{{", from);
    if (open == std::string::npos) break;
    const size_t close = text.find("}}", open);
    if (close == std::string::npos)
      throw InputError(where + ":" + line_of(open) + ": {{ not closed");
    std::string name = text.substr(open + 2, close - open - 2);
    name.erase(0, name.find_first_not_of(" \t"));
    name.erase(name.find_last_not_of(" \t") + 1);
    if (name != "prompt" && name != "response" && name != "label")
      throw InputError(where + ":" + line_of(open) + ": unknown placeholder {{ " + name +
                       " }} (expected prompt, response or label)");
    t.pieces_.push_back(text.substr(from, open - from));
    t.pieces_.push_back(name);
    from = close + 2;
  }
  t.pieces_.push_back(text.substr(from));
  return t;
}

std::string JudgeTemplate::render(const std::string& prompt, const std::string& response,
                                  const std::string& label) const {
  std::string out;
  for (size_t i = 0; i < pieces_.size(); ++i) {
    if (i % 2 == 0) {
      out += pieces_[i];
      continue;
    }
    const std::string& name = pieces_[i];
    out += name == "prompt" ? prompt : name == "response" ? response : label;
  }
  return out;
}

namespace {

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool word_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
}

// Where `word` first occurs in `text` as a whole word, or npos.
size_t find_word(const std::string& text, const std::string& word) {
  for (size_t at = text.find(word); at != std::string::npos; at = text.find(word, at + 1)) {
    const bool before = at == 0 || !word_char(text[at - 1]);
    const size_t end = at + word.size();
    if (before && (end == text.size() || !word_char(text[end]))) return at;
  }
  return std::string::npos;
}

}  // namespace

VerdictParser::VerdictParser(const std::string& score) {
  const std::string prefix = "choice:";
  if (score.rfind(prefix, 0) == 0) {
    std::stringstream list(score.substr(prefix.size()));
    for (std::string c; std::getline(list, c, ',');) {
      c.erase(0, c.find_first_not_of(' '));
      c.erase(c.find_last_not_of(' ') + 1);
      if (!c.empty()) choices_.push_back(lower(c));
    }
    if (choices_.size() < 2)
      throw InputError("judge.score: \"" + score +
                       "\" needs at least two choices (\"choice:yes,no\")");
    return;
  }
  try {
    pattern_.emplace(score, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    throw InputError("judge.score: \"" + score + "\" is not a regular expression: " + e.what());
  }
}

std::optional<double> VerdictParser::parse(const std::string& reply) const {
  if (!choices_.empty()) {
    const std::string text = lower(reply);
    size_t best = std::string::npos, which = 0;
    for (size_t i = 0; i < choices_.size(); ++i) {
      const size_t at = find_word(text, choices_[i]);
      if (at < best) best = at, which = i;
    }
    if (best == std::string::npos) return std::nullopt;
    return 1.0 - static_cast<double>(which) / static_cast<double>(choices_.size() - 1);
  }
  std::smatch m;
  if (!std::regex_search(reply, m, *pattern_)) return std::nullopt;
  const std::string number = m.size() > 1 && m[1].matched ? m[1].str() : m[0].str();
  char* end = nullptr;
  const double value = std::strtod(number.c_str(), &end);
  if (end == number.c_str()) return std::nullopt;
  return value;
}

Judge::Judge(JudgeConfig config)
    : config_(std::move(config)),
      template_(JudgeTemplate::load(config_.template_path)),
      parser_(config_.score) {
  if (!config_.url.empty())
    url_ = parse_http_url(config_.url, "reward source \"" + config_.name + "\": judge.url");
}

std::vector<std::string> Judge::ask(const std::string& content) const {
  json body = {{"messages", json::array({{{"role", "user"}, {"content", content}}})},
               {"n", config_.votes},
               {"temperature", config_.temperature},
               {"max_tokens", config_.max_tokens}};
  if (!config_.model.empty()) body["model"] = config_.model;
  const std::string who = "judge \"" + config_.name + "\"";
  const std::string text =
      post_json(url_, body.dump(-1, ' ', false, json::error_handler_t::replace), config_.timeout_s,
                who, "reward.remote_timeout_s");
  const json reply = json::parse(text, nullptr, false);
  if (!reply.is_object() || !reply.contains("choices") || !reply["choices"].is_array())
    throw RuntimeError(
        who + " " + config_.url +
        ": expected a chat completion with \"choices\", got: " + text.substr(0, 200));
  std::vector<std::string> out;
  for (const json& choice : reply["choices"]) {
    const json* content_of = choice.contains("message") ? &choice["message"] : nullptr;
    if (!content_of || !content_of->contains("content") || !(*content_of)["content"].is_string())
      throw RuntimeError(who + " " + config_.url +
                         ": a choice without message.content: " + choice.dump().substr(0, 200));
    out.push_back((*content_of)["content"].get<std::string>());
  }
  if (static_cast<int64_t>(out.size()) != config_.votes)
    throw RuntimeError(who + " " + config_.url + ": asked for " + std::to_string(config_.votes) +
                       " replies (n), got " + std::to_string(out.size()));
  return out;
}

JudgeScores Judge::score(const std::vector<std::string>& prompts,
                         const std::vector<std::string>& responses,
                         const std::vector<std::string>& labels) const {
  if (config_.url.empty()) {  // the job's judge group
    if (!engine_)
      throw RuntimeError("reward source \"" + config_.name +
                         "\": a judge without a url needs the job's judge group (judge.model)");
    std::vector<std::string> contents;
    for (size_t i = 0; i < responses.size(); ++i)
      contents.push_back(template_.render(prompts[i], responses[i], labels[i]));
    auto replies = engine_(contents, config_);
    if (replies.size() != responses.size())
      throw RuntimeError("judge \"" + config_.name + "\": the judge group answered " +
                         std::to_string(replies.size()) + " of " +
                         std::to_string(responses.size()) + " prompts");
    return verdicts(std::move(replies));
  }
  std::vector<std::vector<std::string>> replies(responses.size());
  const size_t step = static_cast<size_t>(std::max<int64_t>(1, config_.concurrency));
  for (size_t from = 0; from < responses.size(); from += step) {
    std::vector<std::future<std::vector<std::string>>> asked;
    for (size_t i = from; i < std::min(responses.size(), from + step); ++i)
      asked.push_back(std::async(std::launch::async, [&, i] {
        return ask(template_.render(prompts[i], responses[i], labels[i]));
      }));
    for (size_t k = 0; k < asked.size(); ++k) replies[from + k] = asked[k].get();
  }
  return verdicts(std::move(replies));
}

JudgeScores Judge::verdicts(std::vector<std::vector<std::string>> replies) const {
  JudgeScores out;
  for (const auto& votes : replies) {
    double sum = 0;
    for (const std::string& reply : votes) {
      const auto value = parser_.parse(reply);
      if (!value) ++out.unparsed;
      sum += value.value_or(config_.default_score);
    }
    out.votes += static_cast<int64_t>(votes.size());
    out.scores.push_back(votes.empty() ? config_.default_score
                                       : sum / static_cast<double>(votes.size()));
  }
  out.replies = std::move(replies);
  return out;
}

}  // namespace rlhf::rewards
