// `rlhf tokenize`: the token ids a model directory's tokenizer gives for text (or the text of
// ids with --decode), one JSON value per line, so a user can check what the model will see.
// It reads no job spec; prompt formatting comes only from the flags below.
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/errors.h"
#include "tokenizer/prompt_format.h"
#include "tokenizer/tokenizer.h"

namespace rlhf::cli {

namespace {

namespace tk = rlhf::tokenizer;

const std::vector<OptionSpec> kOptions = {
    {"--tokenizer", true,
     "model directory with tokenizer.json, tokenizer.model or the byte tokenizer", "DIR"},
    {"--input", true, "JSONL file: one JSON string (or message list) per line; ids with --decode",
     "FILE"},
    {"--text", true, "one text to encode (with --decode: a JSON array of ids)", "TEXT"},
    {"--decode", false, "turn JSON arrays of ids back into JSON strings"},
    {"--add-special", false, "add BOS/EOS as the tokenizer does for a model input"},
    {"--skip-special", false, "with --decode: leave special tokens out of the text"},
    {"--apply-chat-template", false,
     "format each line with the chat template first (data.apply_chat_template)"},
    {"--chat-template", true,
     "auto|chatml|llama3|llama2|mistral (default auto: from tokenizer_config.json)", "NAME"},
    {"--input-template", true, "wrap each text, \"{}\" = the text (data.input_template)",
     "TEMPLATE"},
    {"--help", false, "show this help"},
};

// One output line for one input value; `where` names the file and line for errors.
std::string process(const nlohmann::json& value, const tk::Tokenizer& tok,
                    const tk::PromptFormatter& format, const Args& args, const std::string& where) {
  if (args.flag("--decode")) {
    if (!value.is_array()) throw InputError(where + ": expected a JSON array of token ids");
    std::vector<tk::TokenId> ids;
    for (const auto& id : value) {
      if (!id.is_number_integer())
        throw InputError(where + ": token ids must be integers, got " + id.dump());
      ids.push_back(id.get<tk::TokenId>());
    }
    const auto skip = args.flag("--skip-special") ? tk::SkipSpecial::kYes : tk::SkipSpecial::kNo;
    return nlohmann::json(tok.decode(ids, skip))
        .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  std::string text;
  try {
    text = format.format(value);
  } catch (const InputError& e) {
    throw InputError(where + ": " + e.what());
  }
  const auto add = args.flag("--add-special") ? tk::AddSpecial::kYes : tk::AddSpecial::kNo;
  return nlohmann::json(tok.encode(text, add)).dump();
}

}  // namespace

int cmd_tokenize(const Argv& argv) {
  const Args args(argv, kOptions);
  if (args.flag("--help")) {
    std::cout
        << "usage: rlhf tokenize --tokenizer DIR (--input FILE.jsonl | --text TEXT) [--decode]\n"
           "Prints the token ids of each input line as a JSON array (or, with --decode, the\n"
           "text of each array of ids as a JSON string).\n\noptions:\n"
        << format_options(kOptions);
    return 0;
  }
  const auto dir = args.model("--tokenizer");
  if (!dir) throw InputError("--tokenizer DIR is required");
  if (args.value("--input").has_value() == args.value("--text").has_value()) {
    throw InputError("give exactly one of --input FILE or --text TEXT");
  }
  const auto tok = tk::load_tokenizer(*dir);
  tk::PromptFormatConfig format_config;
  format_config.input_template = args.value("--input-template").value_or("");
  format_config.apply_chat_template = args.flag("--apply-chat-template");
  format_config.chat_template =
      tk::parse_chat_template(args.value("--chat-template").value_or("auto"));
  const tk::PromptFormatter format(format_config, tk::read_tokenizer_config(*dir));

  if (const auto text = args.value("--text")) {
    nlohmann::json value = *text;
    if (args.flag("--decode")) {
      try {
        value = nlohmann::json::parse(*text);
      } catch (const nlohmann::json::exception&) {
        throw InputError("--text: expected a JSON array of token ids with --decode, got " + *text);
      }
    }
    std::cout << process(value, *tok, format, args, "--text") << '\n';
    return 0;
  }
  const std::string path = *args.value("--input");
  std::ifstream in(path);
  if (!in) throw InputError(path + ": cannot open");
  std::string line;
  for (size_t number = 1; std::getline(in, line); ++number) {
    const std::string where = path + ":" + std::to_string(number);
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank lines
    nlohmann::json value;
    try {
      value = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception&) {
      throw InputError(where + ": not valid JSON (expected one JSON value per line)");
    }
    std::cout << process(value, *tok, format, args, where) << '\n';
  }
  if (in.bad()) throw RuntimeError(path + ": read failed");
  return 0;
}

}  // namespace rlhf::cli
