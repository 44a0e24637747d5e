// HF tokenizer.json pre-tokenizers: Split, ByteLevel, Metaspace, Digits, Whitespace,
// WhitespaceSplit and Sequence. They cut normalized text into the words BPE merges inside.
// Any other type is an InputError naming it. No offset tracking.
#pragma once

#include <functional>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace rlhf::tokenizer {

class PreTokenizer {
 public:
  // From tokenizer.json's "pre_tokenizer" (null: the whole text is one word).
  PreTokenizer(const nlohmann::json& spec, const std::string& where);

  // The words of `text`. `at_text_start`: the text begins the user's input (not after an
  // added token), which Metaspace's prepend_scheme "first" needs.
  std::vector<std::string> operator()(std::string text, bool at_text_start) const;

 private:
  using Step = std::function<void(std::vector<std::string>& words, bool at_text_start)>;
  void add(const nlohmann::json& spec, const std::string& where);
  std::vector<Step> steps_;
};

// How a Split keeps the matched parts (HF SplitDelimiterBehavior).
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

}  // namespace rlhf::tokenizer
