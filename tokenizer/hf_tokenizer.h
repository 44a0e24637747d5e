// An HF tokenizer.json with a BPE model: added/special tokens matched first, then
// normalizer -> pre-tokenizer -> BPE per word; decoding through the decoder chain; BOS/EOS
// from the post-processor (TemplateProcessing) or tokenizer_config.json. Not WordPiece,
// Unigram or WordLevel models (an InputError names them).
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "tokenizer/bpe.h"
#include "tokenizer/hf_decoder.h"
#include "tokenizer/hf_normalizer.h"
#include "tokenizer/hf_pre_tokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_config.h"

namespace rlhf::tokenizer {

class HfTokenizer : public Tokenizer {
 public:
  // Reads `path` (a tokenizer.json). Throws InputError naming the file and the component.
  HfTokenizer(const std::string& path, const TokenizerConfig& config);
  ~HfTokenizer() override;

  std::vector<TokenId> encode(std::string_view text, AddSpecial add_special) const override;
  std::string decode(const std::vector<TokenId>& ids, SkipSpecial skip_special) const override;
  std::optional<TokenId> token_to_id(std::string_view token) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  std::string kind() const override { return "hf-bpe"; }

 private:
  struct AddedToken {
    TokenId id;
    std::string content;
    bool special;
    bool lstrip, rstrip;  // also swallow the whitespace to the left / right
    bool single_word;     // only where it is not part of a longer word
  };
  // A piece of the input: either text for the model or one added token.
  struct Segment {
    std::string_view text;
    const AddedToken* added;  // nullptr for text
  };
  std::vector<Segment> split_added(std::string_view text) const;
  void encode_text(std::string_view text, bool at_text_start, std::vector<TokenId>& out) const;
  void read_added_tokens(const nlohmann::json& added_tokens, const std::string& path);
  void read_post_processor(const nlohmann::json& spec, const std::string& where);

  std::vector<AddedToken> added_;
  std::unordered_map<TokenId, size_t> added_by_id_;            // id -> index in added_
  std::unordered_map<std::string, TokenId> added_by_content_;  // token string -> id
  std::vector<std::vector<size_t>> added_by_first_byte_;       // [256] longest first
  Normalizer normalizer_;
  PreTokenizer pre_tokenizer_;
  std::unique_ptr<BpeModel> model_;
  Decoder decoder_;
  std::vector<TokenId> prefix_ids_, suffix_ids_;  // added around the text with AddSpecial::kYes
  bool clean_up_spaces_ = false;
  int64_t vocab_size_ = 0;
};

// HF's clean_up_tokenization(): removes the space before . ? ! , and English contractions.
std::string clean_up_tokenization(std::string text);

}  // namespace rlhf::tokenizer
