// The BPE model of an HF tokenizer.json: vocabulary, ranked merges, unknown characters
// (byte fallback or <unk>), and a word cache. It maps one pre-tokenized word to ids; the
// splitting of text into words lives in the pre-tokenizer, not here.
#pragma once

#include <array>
#include <memory>
#include <mutex>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace rlhf::tokenizer {

class BpeModel {
 public:
  // Reads `model` (tokenizer.json's "model" object). Throws InputError naming `where` and the
  // field when something is missing or unsupported (dropout, continuing_subword_prefix...).
  BpeModel(const nlohmann::json& model, const std::string& where);
  ~BpeModel();

  // Appends the ids of `word` to `out`. Thread-safe (the cache is sharded and locked).
  void encode_word(std::string_view word, std::vector<TokenId>& out) const;

  std::optional<TokenId> token_to_id(std::string_view token) const;
  // The vocabulary string of `id`, or nullptr when the model has no such id.
  const std::string* id_to_token(TokenId id) const;
  int64_t size() const { return static_cast<int64_t>(id_to_token_.size()); }

 private:
  void merge_word(std::string_view word, std::vector<TokenId>& out) const;
  void initial_symbols(std::string_view word, std::vector<TokenId>& symbols) const;

  std::unordered_map<std::string, TokenId> vocab_;
  std::vector<std::string> id_to_token_;            // [vocab] "" where the id is unused
  std::unordered_map<uint32_t, TokenId> char_ids_;  // single-code-point tokens
  struct Merge {
    int32_t rank;    // lower merges first (its line in "merges")
    TokenId merged;  // id of the concatenation
  };
  // Open addressing on the pair key (left id << 32 | right id): the lookup in the innermost
  // loop, about twice as fast as std::unordered_map here.
  class MergeTable {
   public:
    void build(const std::vector<std::pair<uint64_t, Merge>>& entries);
    const Merge* find(uint64_t key) const;

   private:
    std::vector<uint64_t> keys_;  // kEmpty where free
    std::vector<Merge> values_;
    uint64_t mask_ = 0;
    int shift_ = 64;
  };
  MergeTable merges_;
  std::array<TokenId, 256> byte_ids_{};  // "<0xAB>" tokens, -1 when absent
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;
  std::optional<TokenId> unk_id_;

  struct CacheShard;
  std::unique_ptr<CacheShard[]> cache_;  // [kCacheShards]
};

}  // namespace rlhf::tokenizer
