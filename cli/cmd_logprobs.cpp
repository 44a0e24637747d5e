// `rlhf logprobs --model DIR --input FILE.jsonl`: each sequence's per-token log-probs as
// JSON lines, to check a converted or trained model. Token ids, or text (--text, or text
// lines) encoded with the model's tokenizer; one sequence at a time, so no padding enters
// the numbers.
#include <torch/torch.h>

#include <fstream>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/errors.h"
#include "models/causal_lm.h"
#include "models/lora.h"
#include "models/pretrained.h"
#include "tokenizer/tokenizer.h"

namespace rlhf::cli {
namespace {

// One input line: {"input_ids": [...]}, a bare array of token ids, {"text": "..."} or a
// bare JSON string (text is encoded with the model directory's tokenizer, BOS added as the
// tokenizer's config says).
std::vector<int64_t> parse_ids(const std::string& line, const std::string& where, int64_t vocab,
                               const std::function<const tokenizer::Tokenizer&()>& tokenizer) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {
    throw InputError(where + ": not valid JSON: " + e.what());
  }
  if (j.is_object() && j.contains("text")) j = j["text"];
  if (j.is_string()) {
    auto ids = tokenizer().encode(j.get<std::string>(), tokenizer::AddSpecial::kYes);
    j = nlohmann::json(std::vector<int64_t>(ids.begin(), ids.end()));
  } else if (j.is_object()) {
    if (!j.contains("input_ids"))
      throw InputError(
          where + ": expected key \"input_ids\" or \"text\" (or a bare array of ids, or a string)");
    j = j["input_ids"];
  }
  if (!j.is_array() || j.empty())
    throw InputError(where + ": expected a non-empty array of token ids");
  std::vector<int64_t> ids;
  for (const auto& v : j) {
    if (!v.is_number_integer())
      throw InputError(where + ": token id " + v.dump() + " is not an integer");
    int64_t id = v.get<int64_t>();
    if (id < 0 || id >= vocab)
      throw InputError(where + ": token id " + std::to_string(id) + " outside the vocabulary [0, " +
                       std::to_string(vocab) + ")");
    ids.push_back(id);
  }
  return ids;
}

std::vector<OptionSpec> logprobs_options() {
  return {
      {"--model", true, "HF model directory (config.json + safetensors), or a model name", "MODEL"},
      {"--adapter", true,
       "a PEFT LoRA adapter directory (adapter_config.json + adapter_model.safetensors) on "
       "--model, kept unmerged",
       "DIR"},
      {"--input", true,
       "JSON lines: {\"input_ids\": [...]}, [...], {\"text\": \"...\"} or \"...\" per line",
       "FILE"},
      {"--text", true,
       "a text to score instead of --input (repeatable; encoded with the model's tokenizer, "
       "BOS as its config says)",
       "TEXT"},
      {"--output", true, "write here instead of stdout", "FILE"},
      {"--dtype", true, "compute dtype: fp32 or bf16 (default: the model's torch_dtype)", "DTYPE"},
      {"--chunk", true, "positions per log-prob chunk (default 256)", "N"},
      {"--help", false, "show this help"}};
}

// Each non-blank line of `in` (token ids or text), scored: one JSON line to `out`.
void score_lines(models::CausalLM& model, std::istream& in, const std::string& where, int64_t chunk,
                 const std::function<const tokenizer::Tokenizer&()>& tokenizer, std::ostream& out) {
  torch::NoGradGuard no_grad;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto ids =
        parse_ids(line, where + ":" + std::to_string(n), model.config().vocab_size, tokenizer);
    auto input_ids = torch::tensor(ids, torch::kInt64).unsqueeze(0);  // [1, T]
    auto hidden = model.forward(input_ids, torch::ones_like(input_ids));
    auto lp = model.next_token_log_probs(hidden, input_ids, chunk).squeeze(0);  // [T-1]
    std::vector<float> values(lp.data_ptr<float>(), lp.data_ptr<float>() + lp.numel());
    double sum = 0;
    for (float v : values) sum += v;
    out << nlohmann::json{{"line", n}, {"input_ids", ids}, {"log_probs", values}, {"sum", sum}}
               .dump()
        << '\n';
  }
}

}  // namespace

int cmd_logprobs(const Argv& argv) {
  const std::vector<OptionSpec> options = logprobs_options();
  Args args(argv, options);
  if (args.flag("--help")) {
    std::cout << "usage: rlhf logprobs --model DIR [--adapter DIR] (--input FILE.jsonl | --text "
                 "TEXT...) [--output FILE] [--dtype fp32|bf16]\n\n"
                 "For each input line, writes {\"line\": N, \"log_probs\": [...], \"sum\": S}: the "
                 "log-prob\n"
                 "of every token after the first given the tokens before it (T-1 values, FP32).\n\n"
              << format_options(options);
    return 0;
  }
  const auto model_dir = args.model("--model");
  const auto input = args.value("--input");
  const auto texts = args.values("--text");
  if (!model_dir || (!input && texts.empty()) || (input && !texts.empty()))
    throw InputError(
        "logprobs needs --model DIR and either --input FILE or --text TEXT (see --help)");
  models::LoadOptions load;
  if (auto d = args.value("--dtype")) load.dtype = models::dtype_from_name(*d);
  load.head = models::HeadKind::kLanguageModel;
  int64_t chunk = 0;
  try {
    chunk = std::stoll(args.value("--chunk").value_or("256"));
  } catch (const std::exception&) {
  }
  if (chunk <= 0) throw InputError("--chunk must be a positive integer");
  auto model = models::load_pretrained(*model_dir, load);
  if (auto adapter = args.model("--adapter")) models::load_adapter(*model, *adapter);
  model->eval();

  // --text: each text is one input line, as a JSON string would be.
  std::istringstream text_lines;
  std::ifstream file_in;
  if (input) {
    file_in.open(*input);
    if (!file_in) throw InputError(*input + ": cannot open");
  } else {
    std::string lines;
    for (const auto& t : texts) lines += nlohmann::json(t).dump() + '\n';
    text_lines.str(lines);
  }
  std::istream& in = input ? static_cast<std::istream&>(file_in) : text_lines;
  const std::string where = input ? *input : std::string("--text");
  std::ofstream file_out;
  if (auto o = args.value("--output")) {
    file_out.open(*o);
    if (!file_out) throw RuntimeError(*o + ": cannot create");
  }
  std::ostream& out = file_out.is_open() ? file_out : std::cout;
  std::unique_ptr<tokenizer::Tokenizer> loaded;  // only when a line holds text
  std::function<const tokenizer::Tokenizer&()> tokenizer = [&]() -> const tokenizer::Tokenizer& {
    if (!loaded) loaded = tokenizer::load_tokenizer(*model_dir);
    return *loaded;
  };
  score_lines(*model, in, where, chunk, tokenizer, out);
  out.flush();
  if (!out) throw RuntimeError("logprobs: writing the output failed");
  return 0;
}

}  // namespace rlhf::cli
