// tokenizer_config.json reader. Token fields may be a string or an AddedToken object
// ({"content": "<s>", ...}); chat_template may be a string or a list of named templates, and a
// chat_template.jinja beside the config (where transformers now saves it) wins over both.
#include "tokenizer/tokenizer_config.h"

#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "core/errors.h"

namespace rlhf::tokenizer {

namespace {

std::optional<std::string> token_field(const nlohmann::json& config, const char* key,
                                       const std::string& path) {
  if (!config.contains(key) || config[key].is_null()) return std::nullopt;
  const auto& v = config[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) {
    return v["content"].get<std::string>();
  }
  throw InputError(path + ": \"" + key + "\" must be a string or {\"content\": ...}, got " +
                   v.dump());
}

std::optional<bool> bool_field(const nlohmann::json& config, const char* key,
                               const std::string& path) {
  if (!config.contains(key) || config[key].is_null()) return std::nullopt;
  if (!config[key].is_boolean()) {
    throw InputError(path + ": \"" + key + "\" must be true or false, got " + config[key].dump());
  }
  return config[key].get<bool>();
}

// The text of `path`, or nullopt when it cannot be opened.
std::optional<std::string> read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

TokenizerConfig read_json_config(const std::string& path) {
  TokenizerConfig out;
  std::ifstream in(path);
  if (!in) return out;
  nlohmann::json config;
  try {
    config = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw InputError(path + ": not valid JSON: " + e.what());
  }
  if (!config.is_object()) throw InputError(path + ": expected a JSON object");
  if (config.contains("tokenizer_class") && config["tokenizer_class"].is_string()) {
    out.tokenizer_class = config["tokenizer_class"].get<std::string>();
  }
  out.bos_token = token_field(config, "bos_token", path);
  out.eos_token = token_field(config, "eos_token", path);
  out.pad_token = token_field(config, "pad_token", path);
  out.unk_token = token_field(config, "unk_token", path);
  out.add_bos_token = bool_field(config, "add_bos_token", path);
  out.add_eos_token = bool_field(config, "add_eos_token", path);
  out.clean_up_tokenization_spaces =
      bool_field(config, "clean_up_tokenization_spaces", path).value_or(false);
  if (config.contains("chat_template")) {
    const auto& t = config["chat_template"];
    if (t.is_string()) {
      out.chat_template = t.get<std::string>();
    } else if (t.is_array()) {  // [{"name": "default", "template": "..."}, ...]
      for (const auto& entry : t) {
        if (entry.value("name", "") == "default") out.chat_template = entry.value("template", "");
      }
    }
  }
  return out;
}

}  // namespace

TokenizerConfig read_tokenizer_config(const std::string& model_dir) {
  const std::filesystem::path dir(model_dir);
  TokenizerConfig out = read_json_config((dir / "tokenizer_config.json").string());
  // As HF's from_pretrained: a chat_template.jinja file takes priority over the config's entry.
  if (auto jinja = read_text(dir / "chat_template.jinja")) out.chat_template = std::move(*jinja);
  return out;
}

}  // namespace rlhf::tokenizer
