// `rlhf generate --model DIR --prompt TEXT | --input FILE.jsonl`: samples responses from any
// HF checkpoint with the rollout engine and the model's tokenizer, to look at what a model
// says before and after training. Prompts are used as given, or with --apply-chat-template
// formatted by the model's chat template (as data.apply_chat_template in a job).
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/spec_args.h"
#include "core/errors.h"
#include "core/spec.h"
#include "core/spec_schema.h"
#include "models/lora.h"
#include "models/pretrained.h"
#include "rollout/generation_config.h"
#include "rollout/generator.h"
#include "tokenizer/prompt_format.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_config.h"

namespace rlhf::cli {
namespace {

double number_option(const Args& args, const std::string& name, double fallback) {
  auto v = args.value(name);
  if (!v) return fallback;
  try {
    size_t used = 0;
    double x = std::stod(*v, &used);
    if (used == v->size() && std::isfinite(x)) return x;
  } catch (const std::exception&) {
  }
  throw InputError(name + " must be a number, got \"" + *v + "\"");
}

// Prompts from --prompt, or one per line of --input: {"prompt": ...} or a JSON string (with
// --apply-chat-template also a message list [{"role", "content"}, ...]).
std::vector<nlohmann::json> read_prompts(const Args& args) {
  if (auto p = args.value("--prompt")) return {*p};
  const auto path = *args.value("--input");
  std::ifstream in(path);
  if (!in) throw InputError(path + ": cannot open");
  std::vector<nlohmann::json> prompts;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(n);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      throw InputError(where + ": not valid JSON: " + e.what());
    }
    if (j.is_object() && j.contains("prompt")) j = j["prompt"];
    if (!j.is_string() && !(j.is_array() && args.flag("--apply-chat-template")))
      throw InputError(where + ": expected {\"prompt\": \"...\"} or a JSON string" +
                       (j.is_array() ? " (a message list needs --apply-chat-template)" : ""));
    prompts.push_back(j);
  }
  if (prompts.empty()) throw InputError(path + ": no prompts");
  return prompts;
}

// The engine and sampling a job's rollout runs (rollout/generation_config.h): the --spec's
// rollout section, else the key table's defaults; the options override it. Without --spec,
// one sample of at most 128 tokens per prompt.
struct Settings {
  rollout::GenerationConfig config;
  rollout::SamplingParams sampling;
  std::string source;  // where they came from, for the console
};

Settings generation_settings(const Args& args) {
  const auto spec_path = args.value("--spec");
  if (!spec_path && !args.values("--set").empty())
    throw InputError("generate: --set needs --spec FILE");
  const nlohmann::json section =
      spec_path ? JobSpec::load(*spec_path, args.values("--set")).json().at("rollout")
                : default_spec_json().at("rollout");
  Settings s;
  s.source = spec_path ? "the rollout section of " + *spec_path : "the job spec's defaults";
  s.config = rollout::generation_config_from_rollout_section(section);
  s.sampling = rollout::sampling_from_rollout_section(section);
  s.sampling.temperature = number_option(args, "--temperature", s.sampling.temperature);
  s.sampling.top_p = number_option(args, "--top-p", s.sampling.top_p);
  s.sampling.top_k = args.integer("--top-k", s.sampling.top_k, -1);
  s.sampling.seed = static_cast<uint64_t>(args.integer("--seed", 0, 0));
  s.sampling.validate();
  auto& c = s.config;
  c.n_samples_per_prompt = args.integer("--n", spec_path ? c.n_samples_per_prompt : 1, 1);
  c.max_new_tokens = args.integer("--max-new-tokens", spec_path ? c.max_new_tokens : 128, 1);
  c.micro_batch_size = args.integer("--batch-size", spec_path ? c.micro_batch_size : 8, 1);
  return s;
}

// "generate: 2 prompts x 4 samples, at most 128 new tokens; paged KV cache, blocks of 16
// tokens (the job spec's defaults)".
std::string engine_line(const Settings& s, int64_t prompts) {
  const auto& c = s.config;
  return "generate: " + std::to_string(prompts) + " prompt" + (prompts == 1 ? "" : "s") + " x " +
         std::to_string(c.n_samples_per_prompt) + " sample" +
         (c.n_samples_per_prompt == 1 ? "" : "s") + ", at most " +
         std::to_string(c.max_new_tokens) + " new tokens; " + "paged KV cache, blocks of " +
         std::to_string(c.kv_block_size) + " tokens (" + s.source + ")";
}

// The prompts formatted (--apply-chat-template) and encoded, left-padded into one batch:
// ids and mask [B, P] int64.
std::pair<torch::Tensor, torch::Tensor> prompt_batch(const Args& args, const std::string& model_dir,
                                                     const tokenizer::Tokenizer& tok,
                                                     const std::vector<nlohmann::json>& prompts,
                                                     int64_t pad_token_id) {
  std::vector<std::vector<tokenizer::TokenId>> encoded;
  size_t P = 0;
  tokenizer::PromptFormatConfig format_config;
  format_config.apply_chat_template = args.flag("--apply-chat-template");
  format_config.chat_template =
      tokenizer::parse_chat_template(args.value("--chat-template").value_or("auto"));
  const tokenizer::PromptFormatter formatter(format_config,
                                             tokenizer::read_tokenizer_config(model_dir));
  for (const auto& p : prompts) {
    // A chat template writes BOS itself (as a job's prompts): no special tokens added then.
    encoded.push_back(tok.encode(formatter.format(p), format_config.apply_chat_template
                                                          ? tokenizer::AddSpecial::kNo
                                                          : tokenizer::AddSpecial::kYes));
    if (encoded.back().empty()) throw InputError("generate: a prompt encodes to no tokens");
    P = std::max(P, encoded.back().size());
  }
  const auto B = static_cast<int64_t>(prompts.size());
  auto ids = torch::full({B, static_cast<int64_t>(P)}, pad_token_id, torch::kInt64);
  auto mask = torch::zeros({B, static_cast<int64_t>(P)}, torch::kInt64);
  for (int64_t b = 0; b < B; ++b) {
    const auto& e = encoded[static_cast<size_t>(b)];
    const int64_t off = static_cast<int64_t>(P - e.size());
    for (size_t i = 0; i < e.size(); ++i) ids[b][off + static_cast<int64_t>(i)] = int64_t{e[i]};
    mask.narrow(1, off, static_cast<int64_t>(e.size()))[b].fill_(1);
  }
  return {ids, mask};
}

// Each sample as text (`text`: one prompt on stdout) or as a JSON line.
void write_samples(std::ostream& sink, bool text, const rollout::GenerationOutput& out,
                   const rollout::GenerationConfig& config, const tokenizer::Tokenizer& tok,
                   const std::vector<nlohmann::json>& prompts) {
  const int64_t n = config.n_samples_per_prompt;
  for (int64_t row = 0; row < out.sequences.size(0); ++row) {
    const int64_t len = out.response_lengths[row].item<int64_t>();
    std::vector<tokenizer::TokenId> response;
    for (int64_t t = 0; t < len; ++t)
      response.push_back(static_cast<tokenizer::TokenId>(
          out.sequences[row][out.prompt_length + t].item<int64_t>()));
    const bool stopped =
        len > 0 && std::find(config.stop_token_ids.begin(), config.stop_token_ids.end(),
                             int64_t{response.back()}) != config.stop_token_ids.end();
    const std::string reply = tok.decode(response, tokenizer::SkipSpecial::kYes);
    if (text) {
      sink << "--- sample " << row % n << (stopped ? " (stop)" : " (length)") << " ---\n"
           << reply << '\n';
      continue;
    }
    nlohmann::json j = {{"prompt", prompts[static_cast<size_t>(row / n)]},
                        {"sample", row % n},
                        {"response", reply},
                        {"response_ids", response},
                        {"finish_reason", stopped ? "stop" : "length"},
                        {"log_prob", out.log_probs[row].sum().item<double>()}};
    sink << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
         << '\n';  // random models emit broken UTF-8
  }
}

std::vector<OptionSpec> generate_options() {
  return {
      {"--model", true,
       "HF model directory (config.json, safetensors, tokenizer files), or a model name "
       "(docs/models.md)",
       "MODEL"},
      {"--adapter", true,
       "a PEFT LoRA adapter directory on --model, merged into its weights after loading", "DIR"},
      {"--prompt", true, "one prompt text", "TEXT"},
      {"--input", true, "JSON lines: {\"prompt\": \"...\"} or a JSON string per line", "FILE"},
      {"--output", true,
       "write JSON lines here (default: text to stdout for --prompt, else JSON lines)", "FILE"},
      {"--n", true, "responses per prompt (default 1)", "N"},
      {"--temperature", true, "sampling temperature, 0 = greedy (default 1)", "T"},
      {"--top-p", true, "nucleus mass in (0, 1] (default 1: off)", "P"},
      {"--top-k", true, "sample among the k most likely tokens (default -1: off)", "K"},
      {"--max-new-tokens", true, "response length limit (default 128)", "M"},
      {"--seed", true, "sampling seed (default 0): the same seed gives the same responses", "S"},
      {"--batch-size", true, "prompts per KV cache (default 8)", "B"},
      {"--apply-chat-template", false,
       "format each prompt (a text: one user turn; or a message list) with the model's chat "
       "template and the assistant's turn opened"},
      {"--chat-template", true,
       "auto|chatml|llama3|llama2|mistral (default auto: from the model's tokenizer files)",
       "NAME"},
      {"--dtype", true, "compute dtype: fp32 or bf16 (default: the model's torch_dtype)", "DTYPE"},
      {"--spec", true,
       "a job spec: generate with its rollout section's engine and sampling settings (what its "
       "rollout workers run); the options above override them",
       "FILE"},
      set_option(),
      {"--help", false, "show this help"}};
}

// The model as a rollout worker holds it: --adapter merged, projections fused.
std::shared_ptr<models::CausalLM> load_generation_model(const Args& args,
                                                        const std::string& model_dir) {
  models::LoadOptions load;
  if (auto d = args.value("--dtype")) load.dtype = models::dtype_from_name(*d);
  load.head = models::HeadKind::kLanguageModel;
  auto model = models::load_pretrained(model_dir, load);
  if (auto adapter = args.model("--adapter")) {
    // Merged (W + scale B A): generation runs at the base model's speed.
    models::load_adapter(*model, *adapter);
    models::merge_adapters(*model);
    models::remove_adapters(*model);
  }
  // As a rollout worker runs it (actors/rollout_operations.cpp): q/k/v and gate/up fused.
  model->fuse_projections();
  return model;
}

}  // namespace

int cmd_generate(const Argv& argv) {
  const std::vector<OptionSpec> options = generate_options();
  Args args(argv, options);
  if (args.flag("--help")) {
    std::cout
        << "usage: rlhf generate --model DIR [--adapter DIR] (--prompt TEXT | --input FILE.jsonl) "
           "[--n N] "
           "[--temperature T]\n"
           "                     [--top-p P] [--top-k K] [--max-new-tokens M] [--seed S] [--output "
           "FILE]\n"
           "                     [--spec JOB.json [--set PATH=VALUE ...]]\n\n"
           "Samples responses with the engine a job's rollout runs (paged KV cache, batched; "
           "with --spec, that\njob's rollout settings) and the model's tokenizer.\n"
           "JSON lines carry prompt, sample, response, response_ids, finish_reason (stop|length),\n"
           "log_prob (sum over the response under the sampling distribution).\n\n"
        << format_options(options);
    return 0;
  }
  const auto model_dir = args.model("--model");
  if (!model_dir || (args.value("--prompt").has_value() == args.value("--input").has_value()))
    throw InputError(
        "generate needs --model DIR and one of --prompt TEXT or --input FILE (see --help)");
  Settings settings = generation_settings(args);
  rollout::GenerationConfig& config = settings.config;
  const auto prompts = read_prompts(args);

  auto model = load_generation_model(args, *model_dir);
  auto tok = tokenizer::load_tokenizer(*model_dir);
  const auto& special = tok->special_ids();
  for (int64_t id : {special.eos ? int64_t{*special.eos} : -1, model->config().eos_token_id}) {
    if (id >= 0 && std::find(config.stop_token_ids.begin(), config.stop_token_ids.end(), id) ==
                       config.stop_token_ids.end())
      config.stop_token_ids.push_back(id);
  }
  config.pad_token_id = special.pad ? *special.pad : (special.eos ? *special.eos : 0);
  const auto [ids, mask] = prompt_batch(args, *model_dir, *tok, prompts, config.pad_token_id);

  rollout::Generator generator(model, config);
  std::cerr << engine_line(settings, ids.size(0)) << '\n';
  const auto out = generator.generate(ids, mask, settings.sampling);

  std::ofstream file;
  if (auto o = args.value("--output")) {
    file.open(*o);
    if (!file) throw RuntimeError(*o + ": cannot create");
  }
  const bool text = !file.is_open() && args.value("--prompt").has_value();
  write_samples(file.is_open() ? file : std::cout, text, out, config, *tok, prompts);
  if (file.is_open() && !file.flush())
    throw RuntimeError(*args.value("--output") + ": write failed");
  return 0;
}

}  // namespace rlhf::cli
