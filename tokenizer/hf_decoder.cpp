// Decoder steps on the token strings (Rust tokenizers/decoders decode_chain).
#include "tokenizer/hf_decoder.h"

#include <memory>
#include <nlohmann/json.hpp>

#include "core/errors.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace rlhf::tokenizer {

namespace {

const char* const kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

// The byte of a "<0xAB>" token, or -1.
int byte_token_value(const std::string& token) {
  if (token.size() != 6 || token.compare(0, 3, "<0x") != 0 || token[5] != '>') return -1;
  int value = 0;
  for (size_t i = 3; i < 5; ++i) {
    const char c = token[i];
    value <<= 4;
    if (c >= '0' && c <= '9')
      value |= c - '0';
    else if (c >= 'A' && c <= 'F')
      value |= c - 'A' + 10;
    else if (c >= 'a' && c <= 'f')
      value |= c - 'a' + 10;
    else
      return -1;
  }
  return value;
}

// Runs of <0xAB> tokens become their bytes when those are valid UTF-8, else one U+FFFD per
// byte token (Rust decoders/byte_fallback.rs).
void byte_fallback(std::vector<std::string>& tokens) {
  std::vector<std::string> out;
  std::string bytes;
  size_t byte_tokens = 0;
  const auto flush = [&] {
    if (byte_tokens == 0) return;
    if (is_valid_utf8(bytes)) {
      out.push_back(bytes);
    } else {
      for (size_t k = 0; k < byte_tokens; ++k) out.push_back(kReplacementChar);
    }
    bytes.clear();
    byte_tokens = 0;
  };
  for (auto& t : tokens) {
    const int b = byte_token_value(t);
    if (b >= 0) {
      bytes += static_cast<char>(b);
      ++byte_tokens;
    } else {
      flush();
      out.push_back(std::move(t));
    }
  }
  flush();
  tokens = std::move(out);
}

// The replacement character back to ' '. In the first token (unless prepend_scheme is "never")
// every replacement character is dropped, not just the one Metaspace prepended: Rust's
// decoders/metaspace.rs does so, and "   x" (tokens "▁▁", "▁x") decodes to " x".
void metaspace(std::vector<std::string>& tokens, const std::string& replacement, bool strip_first) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    std::string out;
    const std::string& t = tokens[i];
    for (size_t at = 0; at < t.size();) {
      if (t.compare(at, replacement.size(), replacement) == 0) {
        if (!(i == 0 && strip_first)) out += ' ';
        at += replacement.size();
      } else {
        out += t[at++];
      }
    }
    tokens[i] = std::move(out);
  }
}

}  // namespace

std::string utf8_lossy(const std::string& bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t i = 0;
  while (i < bytes.size()) {
    const size_t n = utf8_length(static_cast<unsigned char>(bytes[i]));
    if (i + n <= bytes.size() && (n > 1 || static_cast<unsigned char>(bytes[i]) < 0x80) &&
        is_valid_utf8(std::string_view(bytes).substr(i, n))) {
      out.append(bytes, i, n);
      i += n;
    } else {
      out += kReplacementChar;
      ++i;
    }
  }
  return out;
}

Decoder::Decoder(const nlohmann::json& spec, const std::string& where) {
  if (!spec.is_null()) add(spec, where);
}

void Decoder::add(const nlohmann::json& spec, const std::string& where) {
  const std::string type = spec.value("type", "");
  const std::string ctx = where + ": decoder " + type;
  if (type == "Sequence") {
    for (const auto& child : spec.at("decoders")) add(child, where);
  } else if (type == "ByteLevel") {
    steps_.push_back([](std::vector<std::string>& tokens) {
      std::string bytes;
      for (const auto& t : tokens) bytes += ByteLevelMap::get().decode(t);
      tokens.assign(1, utf8_lossy(bytes));
    });
  } else if (type == "Metaspace") {
    const auto replacement = spec.value("replacement", std::string("\xE2\x96\x81"));
    std::string scheme = spec.value("prepend_scheme", std::string());
    if (scheme.empty()) scheme = spec.value("add_prefix_space", true) ? "always" : "never";
    steps_.push_back([replacement, strip_first = scheme != "never"](std::vector<std::string>& t) {
      metaspace(t, replacement, strip_first);
    });
  } else if (type == "ByteFallback") {
    // Runs of <0xAB> tokens become their bytes when those are valid UTF-8, else one U+FFFD
    // per byte token (Rust decoders/byte_fallback.rs).
    steps_.push_back(byte_fallback);
  } else if (type == "Fuse") {
    steps_.push_back([](std::vector<std::string>& tokens) {
      std::string all;
      for (const auto& t : tokens) all += t;
      tokens.assign(1, std::move(all));
    });
  } else if (type == "Strip") {
    const auto content = spec.at("content").get<std::string>();
    const size_t start = spec.value("start", size_t{0}), stop = spec.value("stop", size_t{0});
    if (content.empty()) throw InputError(ctx + ": empty content");
    steps_.push_back([content, start, stop](std::vector<std::string>& tokens) {
      for (auto& t : tokens) {
        size_t b = 0, e = t.size();
        for (size_t k = 0; k < start && t.compare(b, content.size(), content) == 0 && b < e; ++k)
          b += content.size();
        for (size_t k = 0; k < stop && e >= b + content.size() &&
                           t.compare(e - content.size(), content.size(), content) == 0;
             ++k) {
          e -= content.size();
        }
        t = t.substr(b, e - b);
      }
    });
  } else if (type == "Replace") {
    auto regex = compile_pattern(spec.at("pattern"), ctx);
    const auto content = spec.at("content").get<std::string>();
    steps_.push_back([regex, content](std::vector<std::string>& tokens) {
      for (auto& t : tokens) t = replace_all(t, *regex, content);
    });
  } else {
    throw InputError(where + ": decoder type '" + type +
                     "' is not supported (supported: Sequence, ByteLevel, Metaspace, ByteFallback, "
                     "Fuse, Strip, Replace)");
  }
}

std::string Decoder::operator()(std::vector<std::string> tokens) const {
  for (const auto& step : steps_) step(tokens);
  std::string text;
  for (const auto& t : tokens) text += t;
  return text;
}

}  // namespace rlhf::tokenizer
