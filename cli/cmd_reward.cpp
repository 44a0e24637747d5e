// `rlhf reward SPEC --input ROWS.jsonl`: scores rows {"prompt", "response", "label", ...} with
// the spec's reward sources (rules, Python functions, remote verifiers, judges) without starting a
// job, one JSON object per row on stdout: how a user checks a verifier or a Python function
// before spending a run on it. A reward-model source needs the model's workers: refused here.
#include <iostream>

#include "cli/commands.h"
#include "cli/spec_args.h"
#include "core/errors.h"
#include "core/jsonl.h"
#include "rewards/reward_sources.h"

namespace rlhf::cli {

using nlohmann::json;

int cmd_reward(const Argv& argv) {
  const std::vector<OptionSpec> options = {
      set_option(),
      {"--input", true, "JSONL rows {\"prompt\", \"response\", \"label\", ...} to score"},
      {"--verbose", false, "with each row, every judge's raw replies (\"judges\": {NAME: [...]})"},
      {"--help", false, "show this help"}};
  Args args(argv, options);
  if (args.flag("--help")) {
    std::cout
        << "usage: rlhf reward SPEC --input ROWS.jsonl [--set PATH=VALUE ...]\n\n"
           "Scores each row with the spec's reward sources (reward.sources, or reward.rule,\n"
           "reward.python, reward.remote_url) and prints one JSON object per row:\n"
           "  {\"reward\": TOTAL, \"sources\": {\"NAME\": SCORE, ...}}\n"
           "A judge source asks its endpoint per row; after the rows, one line on stderr per\n"
           "judge counts the replies that did not parse (scored the judge's default).\n"
           "Other columns of a row reach Python functions as keyword lists (TRL's **row).\n"
           "Exit 2 on a bad spec, file or row (named); 1 when a source fails.\n\n"
        << format_options(options);
    return 0;
  }
  JobSpec spec = load_spec_arg(args, "reward");
  const auto input = args.value("--input");
  if (!input) throw InputError("rlhf reward: --input ROWS.jsonl is required");
  auto config = rewards::RewardSourcesConfig::from_spec(spec);
  for (const auto& src : config.sources)
    if (src.at("kind") == "model")
      throw InputError("rlhf reward: reward source \"" + src.at("name").get<std::string>() +
                       "\" is a reward model, which needs its workers: score it with rlhf run");
  std::vector<std::string> prompts, responses, labels;
  std::vector<json> rows;
  read_jsonl(*input, BadLinePolicy::kFatal, 0, [&](const json& row, int64_t) {
    if (!row.is_object()) throw InputError("expected a JSON object per line");
    for (const char* key : {"prompt", "response"})
      if (!row.contains(key) || !row[key].is_string())
        throw InputError(std::string("missing string \"") + key + "\"");
    prompts.push_back(row["prompt"]);
    responses.push_back(row["response"]);
    const json label = row.value("label", json(""));
    labels.push_back(label.is_string() ? label.get<std::string>() : label.dump());
    json extra = row;
    for (const char* key : {"prompt", "response", "label"}) extra.erase(key);
    rows.push_back(std::move(extra));
  });
  rewards::RewardSources sources(config);
  bool any_extra = false;
  for (const auto& r : rows) any_extra = any_extra || !r.empty();
  const auto scored =
      sources.score(prompts, responses, labels, any_extra ? rows : std::vector<json>{});
  const bool verbose = args.flag("--verbose");
  for (size_t i = 0; i < responses.size(); ++i) {
    json line = {{"reward", scored.total[i]}, {"sources", json::object()}};
    for (const auto& s : scored.sources) {
      line["sources"][s.name] = s.scores[i];
      if (verbose && s.unparsed >= 0) line["judges"][s.name] = s.replies[i];
    }
    std::cout << line.dump(-1, ' ', false, json::error_handler_t::replace) << '\n';
  }
  for (const auto& s : scored.sources)
    if (s.unparsed >= 0)
      std::cerr << "rlhf reward: judge \"" << s.name << "\": " << s.unparsed << " of " << s.votes
                << " replies did not parse (scored its default)" << std::endl;
  return 0;
}

}  // namespace rlhf::cli
