// The tokenizer interface every model family implements, and load_tokenizer(), which picks
// the implementation from the files in a model directory. No model code, no torch here.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace rlhf::tokenizer {

using TokenId = int32_t;

// Whether encode() wraps the ids in the model's special tokens (BOS, EOS: whatever the
// tokenizer's post-processor or tokenizer_config.json asks for), like HF add_special_tokens.
enum class AddSpecial { kNo, kYes };
// Whether decode() drops special tokens (BOS, EOS, PAD, <|eot_id|>...) from the text.
enum class SkipSpecial { kNo, kYes };

// Ids of the tokens the trainer and sampler need; empty when the tokenizer has none.
struct SpecialIds {
  std::optional<TokenId> bos;
  std::optional<TokenId> eos;
  std::optional<TokenId> pad;
  std::optional<TokenId> unk;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Token ids of `text` (UTF-8). Safe to call from several threads at once.
  // Throws InputError when the text is not valid UTF-8.
  virtual std::vector<TokenId> encode(std::string_view text, AddSpecial add_special) const = 0;
  // Text of `ids`; throws InputError on an id outside [0, vocab_size()).
  virtual std::string decode(const std::vector<TokenId>& ids, SkipSpecial skip_special) const = 0;
  // Id of one token as the vocabulary spells it ("<|eot_id|>", "▁the", "Ġthe").
  virtual std::optional<TokenId> token_to_id(std::string_view token) const = 0;
  // One more than the largest id (added tokens included), as HF len(tokenizer).
  virtual int64_t vocab_size() const = 0;
  // A short name for messages and the CLI: "hf-bpe", "sentencepiece", "rlhf-byte".
  virtual std::string kind() const = 0;

  const SpecialIds& special_ids() const { return special_ids_; }

 protected:
  SpecialIds special_ids_;
};

// encode() of every text, spread over `threads` std::threads (contiguous slices; 1 = the
// calling thread only). Output order follows `texts`. The first exception is rethrown.
std::vector<std::vector<TokenId>> encode_batch(const Tokenizer& tokenizer,
                                               const std::vector<std::string>& texts,
                                               AddSpecial add_special, unsigned threads);

// Why ids from `a` would not mean the same text to `b` ("" when they would): the vocabulary
// sizes, the special ids, the kinds, then every id's text (decoded alone, specials kept) in
// order, naming the first that differs. For a model that scores another's tokens (a teacher
// in on-policy distillation).
std::string tokenizer_difference(const Tokenizer& a, const Tokenizer& b);

// Loads the tokenizer of a model directory. In order of preference:
//   tokenizer_config.json with "tokenizer_class": "RlhfByteTokenizer" -> the byte tokenizer;
//   tokenizer.json (HF tokenizers format: BPE, byte-level or Metaspace/byte-fallback);
//   tokenizer.model (SentencePiece).
// tokenizer_config.json, when present, gives BOS/EOS/PAD and whether BOS/EOS are added.
// Throws InputError naming the directory or file when none fits or a component is unsupported.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& model_dir);

}  // namespace rlhf::tokenizer
