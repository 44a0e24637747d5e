// Pre-tokenizer steps, each mapping a list of words to a finer list (Rust
// tokenizers/pre_tokenizers). Split behaviours follow SplitDelimiterBehavior.
#include "tokenizer/hf_pre_tokenizer.h"

#include <memory>
#include <nlohmann/json.hpp>

#include "core/errors.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace rlhf::tokenizer {

namespace {

// GPT-2's pattern, used by ByteLevel when use_regex is true.
const char* const kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

SplitBehavior parse_behavior(const std::string& name, const std::string& where) {
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  throw InputError(where + ": split behavior '" + name + "' is not supported");
}

// Splits `word` at the matches of `regex` (or between them when `invert`) and appends the
// parts to `out` as `behavior` says.
void split_word(const std::string& word, const Regex& regex, SplitBehavior behavior, bool invert,
                std::vector<std::string>& out) {
  struct Part {
    size_t begin, end;
    bool is_match;
  };
  std::vector<Part> parts;
  size_t last = 0;
  for (const auto& [begin, end] : regex.find_all(word)) {
    if (begin > last) parts.push_back({last, begin, invert});
    parts.push_back({begin, end, !invert});
    last = end;
  }
  if (last < word.size()) parts.push_back({last, word.size(), invert});

  const size_t first_out = out.size();
  bool previous_was_match = false, pending_merge = false;
  for (const Part& p : parts) {
    std::string text = word.substr(p.begin, p.end - p.begin);
    switch (behavior) {
      case SplitBehavior::kRemoved:
        if (!p.is_match) out.push_back(std::move(text));
        break;
      case SplitBehavior::kIsolated:
        out.push_back(std::move(text));
        break;
      case SplitBehavior::kMergedWithPrevious:
        if (p.is_match && out.size() > first_out && !previous_was_match) {
          out.back() += text;
        } else {
          out.push_back(std::move(text));
        }
        break;
      case SplitBehavior::kMergedWithNext:  // a match joins the next part unless that is a match
        if (pending_merge && !p.is_match) {
          out.back() += text;
        } else {
          out.push_back(std::move(text));
        }
        pending_merge = p.is_match;
        break;
      case SplitBehavior::kContiguous:
        if (p.is_match && previous_was_match) {
          out.back() += text;
        } else {
          out.push_back(std::move(text));
        }
        break;
    }
    previous_was_match = p.is_match;
  }
}

std::string replace_spaces(const std::string& word, const std::string& replacement) {
  std::string out;
  out.reserve(word.size() + 8);
  for (char c : word) {
    if (c == ' ') {
      out += replacement;
    } else {
      out += c;
    }
  }
  return out;
}

// ' ' -> replacement (U+2581), prepended per `scheme`, then split before each replacement
// character, which stays with the text that follows it (Rust pre_tokenizers/metaspace.rs).
void metaspace(std::vector<std::string>& words, const std::string& replacement,
               const std::string& scheme, bool split, bool at_text_start) {
  std::vector<std::string> out;
  for (size_t i = 0; i < words.size(); ++i) {
    std::string w = replace_spaces(words[i], replacement);
    const bool prepend = scheme == "always" || (scheme == "first" && i == 0 && at_text_start);
    if (prepend && w.compare(0, replacement.size(), replacement) != 0) w = replacement + w;
    if (!split) {
      out.push_back(std::move(w));
      continue;
    }
    size_t start = 0;
    for (size_t at = w.find(replacement, 1); at != std::string::npos;
         at = w.find(replacement, at + 1)) {
      if (at > start) out.push_back(w.substr(start, at - start));
      start = at;
    }
    if (start < w.size()) out.push_back(w.substr(start));
  }
  words = std::move(out);
}

}  // namespace

PreTokenizer::PreTokenizer(const nlohmann::json& spec, const std::string& where) {
  if (!spec.is_null()) add(spec, where);
}

void PreTokenizer::add(const nlohmann::json& spec, const std::string& where) {
  const std::string type = spec.value("type", "");
  const std::string ctx = where + ": pre_tokenizer " + type;
  // A step that splits every word at a regex.
  const auto add_split = [&](std::shared_ptr<Regex> regex, SplitBehavior behavior, bool invert) {
    steps_.push_back([regex, behavior, invert](std::vector<std::string>& words, bool) {
      std::vector<std::string> out;
      for (const auto& w : words) split_word(w, *regex, behavior, invert, out);
      words = std::move(out);
    });
  };
  if (type == "Sequence") {
    for (const auto& child : spec.at("pretokenizers")) add(child, where);
  } else if (type == "Split") {
    add_split(compile_pattern(spec.at("pattern"), ctx),
              parse_behavior(spec.at("behavior").get<std::string>(), ctx),
              spec.value("invert", false));
  } else if (type == "ByteLevel") {
    // Rust pre_tokenizers/byte_level.rs: prefix space, GPT-2 regex split, bytes -> characters.
    if (spec.value("add_prefix_space", false)) {
      steps_.push_back([](std::vector<std::string>& words, bool) {
        for (auto& w : words) {
          if (w.empty() || w[0] != ' ') w.insert(w.begin(), ' ');
        }
      });
    }
    if (spec.value("use_regex", true)) {
      add_split(std::make_shared<Regex>(kGpt2Pattern, ctx), SplitBehavior::kIsolated, false);
    }
    steps_.push_back([](std::vector<std::string>& words, bool) {
      for (auto& w : words) w = ByteLevelMap::get().encode(w);
    });
  } else if (type == "Metaspace") {
    const auto replacement = spec.value("replacement", std::string("\xE2\x96\x81"));
    std::string scheme = spec.value("prepend_scheme", std::string());
    if (scheme.empty()) scheme = spec.value("add_prefix_space", true) ? "always" : "never";
    if (scheme != "always" && scheme != "first" && scheme != "never") {
      throw InputError(ctx + ": prepend_scheme '" + scheme + "' is not supported");
    }
    const bool split = spec.value("split", true);
    steps_.push_back([replacement, scheme, split](std::vector<std::string>& words, bool first) {
      metaspace(words, replacement, scheme, split, first);
    });
  } else if (type == "Digits") {
    add_split(std::make_shared<Regex>(R"(\p{N})", ctx),
              spec.value("individual_digits", false) ? SplitBehavior::kIsolated
                                                     : SplitBehavior::kContiguous,
              false);
  } else if (type == "Whitespace") {
    add_split(std::make_shared<Regex>(R"(\w+|[^\w\s]+)", ctx), SplitBehavior::kRemoved, true);
  } else if (type == "WhitespaceSplit") {
    add_split(std::make_shared<Regex>(R"(\s+)", ctx), SplitBehavior::kRemoved, false);
  } else {
    throw InputError(
        where + ": pre_tokenizer type '" + type +
        "' is not supported (supported: Sequence, Split, ByteLevel, Metaspace, Digits, "
        "Whitespace, WhitespaceSplit)");
  }
}

std::vector<std::string> PreTokenizer::operator()(std::string text, bool at_text_start) const {
  std::vector<std::string> words;
  words.push_back(std::move(text));
  for (const auto& step : steps_) step(words, at_text_start);
  return words;
}

}  // namespace rlhf::tokenizer
