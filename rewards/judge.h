// Generative judges (LLM-as-a-judge) as a reward source: a chat model reads a prompt rendered
// from a template with the sample's prompt, response and label, writes a verdict, and the
// verdict is parsed into a number. `n` votes per sample (sampled) are averaged; a vote that
// does not parse scores the stated default and is counted (the run logs judge/<name>/unparsed).
// The judge is served behind an OpenAI-compatible chat-completions endpoint (vLLM, SGLang,
// bench/judge_server.py; one request per sample asks for all its votes, "n"), or without a
// url by the job's own judge group on rlhf's paged engine (judge.model, a JudgeEngine).
//
// A reward.sources entry: {"judge": {"url": URL, "template": FILE, "score": REGEX or
// "choice:A,B,...", "model": NAME, "votes": N, "temperature": T, "max_tokens": M,
// "default": D}, "weight": W, "name": NAME}.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "rewards/http_client.h"

namespace rlhf::rewards {

struct JudgeConfig {
  std::string name = "judge";  // the source's name, for messages
  std::string url;             // http://host:port/v1/chat/completions
  std::string model;           // the endpoint's model name ("model" in the request; "" omits it)
  std::string template_path;   // the prompt template (judge.template)
  std::string score;           // a regular expression, or "choice:A,B,..."
  int64_t votes = 1;           // replies per sample ("n"), averaged
  double temperature = 0.0;    // 0: greedy (then one vote)
  int64_t max_tokens = 64;     // the verdict's length budget
  double default_score = 0.0;  // an unparsed vote's score
  double timeout_s = 30.0;     // one request (reward.remote_timeout_s)
  int64_t concurrency = 8;     // requests in flight at once

  // From a reward.sources entry's "judge" object (fields as above; the validator has checked
  // their types). Throws InputError naming the field.
  static JudgeConfig from_json(const nlohmann::json& judge, const std::string& name,
                               double timeout_s);
};

// The prompt template: text with {{ prompt }}, {{ response }} and {{ label }} placeholders
// (spaces inside the braces optional), a subset of Jinja without statements. Throws
// InputError naming the file and line for an unknown placeholder or a {% statement %}.
class JudgeTemplate {
 public:
  static JudgeTemplate load(const std::string& path);
  static JudgeTemplate parse(const std::string& text, const std::string& where);
  std::string render(const std::string& prompt, const std::string& response,
                     const std::string& label) const;

 private:
  std::vector<std::string> pieces_;  // text, then a placeholder's name, alternating
};

// A verdict to a number. "choice:A,B,...": the earliest of the choices found in the reply as a
// whole word (case-insensitive); the first choice scores 1, the last 0, the others evenly
// between ("choice:yes,no": yes 1, no 0). Otherwise a regular expression (ECMAScript): its first
// capture group, or the whole match without one, read as a number. nullopt when nothing
// matches. Throws InputError for a bad expression or fewer than two choices.
class VerdictParser {
 public:
  explicit VerdictParser(const std::string& score);
  std::optional<double> parse(const std::string& reply) const;

 private:
  std::vector<std::string> choices_;
  std::optional<std::regex> pattern_;
};

// A judge served by the job's own judge group (a judge without a url): the user messages
// `contents` [B] in, `config.votes` replies of at most `config.max_tokens` tokens at
// `config.temperature` for each, [B][votes], out (ppo/judge_engine.h).
using JudgeEngine = std::function<std::vector<std::vector<std::string>>(
    const std::vector<std::string>& contents, const JudgeConfig& config)>;

struct JudgeScores {
  std::vector<double> scores;                     // [B] the mean of each sample's votes
  int64_t votes = 0;                              // replies read
  int64_t unparsed = 0;                           // replies scored the default
  std::vector<std::vector<std::string>> replies;  // [B][votes], for `rlhf reward --verbose`
};

class Judge {
 public:
  // Loads the template and compiles the parser; InputError naming what is wrong.
  explicit Judge(JudgeConfig config);
  // The samples' verdicts, asked `concurrency` at a time. Throws RuntimeError naming the
  // source and the URL when the endpoint fails or replies with other than chat completions.
  JudgeScores score(const std::vector<std::string>& prompts,
                    const std::vector<std::string>& responses,
                    const std::vector<std::string>& labels) const;
  // Replies [B][votes] to scores: each parsed, the unparsed at the default, averaged.
  JudgeScores verdicts(std::vector<std::vector<std::string>> replies) const;
  const JudgeConfig& config() const { return config_; }
  // A judge without a url asks `engine` (the job's judge group) instead of an endpoint.
  void set_engine(JudgeEngine engine) { engine_ = std::move(engine); }

 private:
  std::vector<std::string> ask(const std::string& content) const;  // one request's n replies

  JudgeConfig config_;
  JudgeTemplate template_;
  VerdictParser parser_;
  HttpUrl url_;         // with a url
  JudgeEngine engine_;  // without one
};

}  // namespace rlhf::rewards
