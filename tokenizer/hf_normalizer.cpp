// Each normalizer is a step string -> string, applied in order (Rust tokenizers/normalizers).
#include "tokenizer/hf_normalizer.h"

#include <memory>
#include <nlohmann/json.hpp>

#include "core/errors.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace rlhf::tokenizer {

namespace {

std::string replace_literal(const std::string& text, const std::string& from,
                            const std::string& to) {
  std::string out;
  size_t last = 0;
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, last)) {
    out.append(text, last, at - last);
    out += to;
    last = at + from.size();
  }
  out.append(text, last, std::string::npos);
  return out;
}

bool is_space(unsigned char c) {
  return c == ' ' || (c >= '\t' && c <= '\r');
}

}  // namespace

Normalizer::Normalizer(const nlohmann::json& spec, const std::string& where) {
  if (!spec.is_null()) add(spec, where);
}

void Normalizer::add(const nlohmann::json& spec, const std::string& where) {
  const std::string type = spec.value("type", "");
  const std::string ctx = where + ": normalizer " + type;
  const auto form = [&](NormalForm f) {
    steps_.push_back([f](std::string s) { return normalize(s, f); });
  };
  if (type == "Sequence") {
    for (const auto& child : spec.at("normalizers")) add(child, where);
  } else if (type == "NFC") {
    form(NormalForm::kNFC);
  } else if (type == "NFD") {
    form(NormalForm::kNFD);
  } else if (type == "NFKC") {
    form(NormalForm::kNFKC);
  } else if (type == "NFKD") {
    form(NormalForm::kNFKD);
  } else if (type == "Lowercase") {
    steps_.push_back([](std::string s) { return to_lower(s); });
  } else if (type == "Prepend") {
    const auto prefix = spec.at("prepend").get<std::string>();
    steps_.push_back([prefix](std::string s) { return s.empty() ? s : prefix + s; });
  } else if (type == "Replace" && spec.at("pattern").contains("String")) {
    const auto from = spec["pattern"]["String"].get<std::string>();
    const auto content = spec.at("content").get<std::string>();
    if (from.empty()) throw InputError(ctx + ": empty String pattern");
    steps_.push_back([from, content](std::string s) { return replace_literal(s, from, content); });
  } else if (type == "Replace") {
    auto regex = compile_pattern(spec.at("pattern"), ctx);
    const auto content = spec.at("content").get<std::string>();
    steps_.push_back([regex, content](std::string s) { return replace_all(s, *regex, content); });
  } else if (type == "Strip") {
    const bool left = spec.value("strip_left", true), right = spec.value("strip_right", true);
    steps_.push_back([left, right](std::string s) {
      size_t b = 0, e = s.size();
      while (left && b < e && is_space(static_cast<unsigned char>(s[b]))) ++b;
      while (right && e > b && is_space(static_cast<unsigned char>(s[e - 1]))) --e;
      return s.substr(b, e - b);
    });
  } else {
    throw InputError(where + ": normalizer type '" + type +
                     "' is not supported (supported: Sequence, NFC, NFD, NFKC, NFKD, Lowercase, "
                     "Prepend, Replace, Strip)");
  }
}

std::string Normalizer::operator()(std::string text) const {
  for (const auto& step : steps_) text = step(std::move(text));
  return text;
}

}  // namespace rlhf::tokenizer
