// HF tokenizer.json components on their own, against the examples in HF tokenizers'
// documentation (SplitDelimiterBehavior's "the-final--countdown", Digits, Whitespace).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/errors.h"
#include "tokenizer/hf_decoder.h"
#include "tokenizer/hf_normalizer.h"
#include "tokenizer/hf_pre_tokenizer.h"

namespace rlhf::tokenizer {
namespace {

using nlohmann::json;
using Words = std::vector<std::string>;

Words pre_tokenize(const char* spec, const std::string& text) {
  return PreTokenizer(json::parse(spec), "test")(text, true);
}

TEST(HfComponents, SplitBehaviorsAsDocumented) {
  const auto split = [](const char* behavior) {
    return pre_tokenize(
        (std::string(R"({"type": "Split", "pattern": {"String": "-"}, "behavior": ")") + behavior +
         R"(", "invert": false})")
            .c_str(),
        "the-final--countdown");
  };
  EXPECT_EQ(split("Removed"), (Words{"the", "final", "countdown"}));
  EXPECT_EQ(split("Isolated"), (Words{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(split("MergedWithPrevious"), (Words{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(split("MergedWithNext"), (Words{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(split("Contiguous"), (Words{"the", "-", "final", "--", "countdown"}));
  // invert: the matches are what is kept.
  EXPECT_EQ(pre_tokenize(R"({"type": "Split", "pattern": {"Regex": "\\w+"}, "behavior": "Removed",
                             "invert": true})",
                         "a, bc d"),
            (Words{"a", "bc", "d"}));
}

TEST(HfComponents, DigitsWhitespaceAndByteLevel) {
  EXPECT_EQ(pre_tokenize(R"({"type": "Digits", "individual_digits": true})", "Call 123 please"),
            (Words{"Call ", "1", "2", "3", " please"}));
  EXPECT_EQ(pre_tokenize(R"({"type": "Digits", "individual_digits": false})", "Call 123 please"),
            (Words{"Call ", "123", " please"}));
  EXPECT_EQ(pre_tokenize(R"({"type": "WhitespaceSplit"})", "Hey friend!  how\tare"),
            (Words{"Hey", "friend!", "how", "are"}));
  EXPECT_EQ(pre_tokenize(R"({"type": "Whitespace"})", "Hey friend!"),
            (Words{"Hey", "friend", "!"}));
  // GPT-2: ' ' -> 'Ġ', '\n' -> 'Ċ'; add_prefix_space puts a space before the first word.
  EXPECT_EQ(pre_tokenize(R"({"type": "ByteLevel", "add_prefix_space": true})", "Hi there\n"),
            (Words{"\xC4\xA0Hi", "\xC4\xA0there", "\xC4\x8A"}));
  // Metaspace: spaces become U+2581, prepended ("always"), split before each one.
  EXPECT_EQ(
      pre_tokenize(R"({"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always"})",
                   "Hey  friend"),
      (Words{"\xE2\x96\x81Hey", "\xE2\x96\x81",
             "\xE2\x96\x81"
             "friend"}));
  const Decoder metaspace(json::parse(R"({"type": "Metaspace", "replacement": "\u2581",
                                          "prepend_scheme": "always"})"),
                          "test");
  EXPECT_EQ(metaspace({"\xE2\x96\x81Hey", "\xE2\x96\x81",
                       "\xE2\x96\x81"
                       "friend"}),
            "Hey  friend");
  // Every U+2581 of the first token goes, not only the prepended one (Rust's decoder does so).
  EXPECT_EQ(metaspace({"\xE2\x96\x81\xE2\x96\x81", "\xE2\x96\x81x"}), " x");
  EXPECT_THROW(
      pre_tokenize(R"({"type": "Split", "pattern": {"Regex": "("}, "behavior": "Isolated"})", "x"),
      InputError);
}

TEST(HfComponents, NormalizersAndDecoders) {
  const Normalizer strip(json::parse(R"({"type": "Sequence", "normalizers": [
      {"type": "Strip", "strip_left": true, "strip_right": true},
      {"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "},
      {"type": "NFKC"}]})"),
                         "test");
  EXPECT_EQ(strip("  a   b \xEF\xAC\x81  "), "a b fi");  // U+FB01 'ﬁ' -> "fi" under NFKC
  const Decoder decoder(json::parse(R"({"type": "Sequence", "decoders": [
      {"type": "Replace", "pattern": {"String": "_"}, "content": " "},
      {"type": "ByteFallback"}, {"type": "Fuse"},
      {"type": "Strip", "content": " ", "start": 1, "stop": 1}]})"),
                        "test");
  // <0xC3><0xA9> is "é"; a lone <0xFF> is not UTF-8 and becomes U+FFFD.
  EXPECT_EQ(decoder({"_a", "<0xC3>", "<0xA9>", "_b", "<0xFF>", "_"}), "a\xC3\xA9 b\xEF\xBF\xBD");
  EXPECT_EQ(utf8_lossy("ok\xE4\xB8"), "ok\xEF\xBF\xBD\xEF\xBF\xBD");
}

}  // namespace
}  // namespace rlhf::tokenizer
