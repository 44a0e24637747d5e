// `rlhf reward SPEC --input ROWS.jsonl`: scores rows {"prompt", "response", "label", ...} with
// the spec's reward sources (rules, Python functions, remote verifiers, judges: an endpoint's,
// or judge.model on rlhf's engine in this process) without starting a job, one JSON object per row
// on stdout: how a user checks a verifier or a Python function before spending a run on it. A
// reward-model source needs the model's workers: refused here.
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/spec_args.h"
#include "core/errors.h"
#include "core/jsonl.h"
#include "models/pretrained.h"
#include "ppo/judge_engine.h"
#include "rewards/reward_sources.h"
#include "rollout/generator.h"

namespace rlhf::cli {

using nlohmann::json;

namespace {

// A judge without a url: judge.model on rlhf's engine in this process (the job runs it on
// its judge group), greedy or sampled as the judge asks, seeded by train.seed.
struct InProcessJudge {
  std::unique_ptr<ppo::job::JudgeText> text;
  std::unique_ptr<rollout::Generator> generator;
  uint64_t seed = 0;

  InProcessJudge(const JobSpec& spec, int64_t max_tokens)
      : text(std::make_unique<ppo::job::JudgeText>(spec.get_string("judge.model"))),
        seed(static_cast<uint64_t>(spec.get_int("train.seed"))) {
    models::LoadOptions load;
    load.dtype = models::dtype_from_name(spec.get_string("judge.dtype"));
    rollout::GenerationConfig config;
    config.max_new_tokens = max_tokens;
    config.stop_token_ids = text->stop_ids();
    config.pad_token_id = text->pad_id();
    generator = std::make_unique<rollout::Generator>(
        models::load_pretrained(spec.get_string("judge.model"), load), config);
  }
  std::vector<std::vector<std::string>> operator()(const std::vector<std::string>& contents,
                                                   const rewards::JudgeConfig& c) {
    if (contents.empty()) return {};
    const auto [ids, mask] = text->prompts(contents);
    generator->set_samples_per_prompt(c.votes);
    rollout::SamplingParams sampling;
    sampling.temperature = c.temperature;
    sampling.seed = seed;
    const auto out = generator->generate(ids, mask, sampling);
    return text->replies(out.sequences, out.action_mask, c.votes);
  }
};

}  // namespace

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
           "A judge source asks its endpoint per row, or without a url runs judge.model on\n"
           "rlhf's engine in this process; after the rows, one line on stderr per judge counts\n"
           "the replies that did not parse (scored the judge's default).\n"
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
  std::unique_ptr<InProcessJudge> judge;
  if (sources.has_local_judge()) {
    judge = std::make_unique<InProcessJudge>(spec, sources.local_judge_max_tokens());
    sources.set_judge_engine(
        [&judge](const std::vector<std::string>& contents, const rewards::JudgeConfig& c) {
          return (*judge)(contents, c);
        });
  }
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
