// BPE merging as HF tokenizers does it (models/bpe/word.rs): repeatedly apply the merge of
// lowest rank, leftmost first. A heap of candidate pairs over a linked list of symbols makes
// a word of n characters O(n log n), so long words without spaces stay fast.
#include "tokenizer/bpe.h"

#include <cstdio>
#include <nlohmann/json.hpp>
#include <queue>

#include "core/errors.h"
#include "tokenizer/unicode.h"

namespace rlhf::tokenizer {

namespace {

constexpr size_t kCacheShards = 64;
constexpr size_t kCacheShardCapacity = 8192;  // per shard (512k words), then cleared
constexpr size_t kCacheMaxWordBytes = 128;    // longer words are rare; not worth caching

uint64_t pair_key(TokenId left, TokenId right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

uint32_t decode_code_point(std::string_view s, size_t n) {
  const auto b = [&](size_t i) { return static_cast<uint32_t>(static_cast<unsigned char>(s[i])); };
  switch (n) {
    case 1:
      return b(0);
    case 2:
      return ((b(0) & 0x1F) << 6) | (b(1) & 0x3F);
    case 3:
      return ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
    default:
      return ((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
  }
}

}  // namespace

constexpr uint64_t kEmptyKey = ~uint64_t{0};

void BpeModel::MergeTable::build(const std::vector<std::pair<uint64_t, Merge>>& entries) {
  size_t capacity = 16;
  while (capacity < entries.size() * 2) capacity *= 2;
  shift_ = 64 - __builtin_ctzll(capacity);
  mask_ = capacity - 1;
  keys_.assign(capacity, kEmptyKey);
  values_.assign(capacity, Merge{0, 0});
  for (const auto& [key, merge] : entries) {
    size_t slot = (key * 0x9E3779B97F4A7C15ull) >> shift_;
    while (keys_[slot] != kEmptyKey && keys_[slot] != key) slot = (slot + 1) & mask_;
    if (keys_[slot] == key) continue;  // a repeated merge keeps its first (lowest) rank
    keys_[slot] = key;
    values_[slot] = merge;
  }
}

const BpeModel::Merge* BpeModel::MergeTable::find(uint64_t key) const {
  if (keys_.empty()) return nullptr;
  for (size_t slot = (key * 0x9E3779B97F4A7C15ull) >> shift_;; slot = (slot + 1) & mask_) {
    if (keys_[slot] == key) return &values_[slot];
    if (keys_[slot] == kEmptyKey) return nullptr;
  }
}

struct BpeModel::CacheShard {
  std::mutex mutex;
  std::unordered_map<std::string, std::vector<TokenId>> words;
};

BpeModel::BpeModel(const nlohmann::json& model, const std::string& where)
    : cache_(new CacheShard[kCacheShards]) {
  const auto unsupported = [&](const char* field) {
    throw InputError(where + ": BPE model field '" + field + "' is not supported");
  };
  if (model.contains("dropout") && !model["dropout"].is_null() &&
      model["dropout"].get<double>() > 0) {
    unsupported("dropout");
  }
  for (const char* field : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(field) && !model[field].is_null() &&
        !model[field].get<std::string>().empty()) {
      unsupported(field);
    }
  }
  byte_fallback_ = model.value("byte_fallback", false);
  fuse_unk_ = model.value("fuse_unk", false);
  ignore_merges_ = model.value("ignore_merges", false);
  if (!model.contains("vocab") || !model["vocab"].is_object()) {
    throw InputError(where + ": BPE model has no \"vocab\" object");
  }
  for (const auto& [token, id_json] : model["vocab"].items()) {
    const auto id = id_json.get<TokenId>();
    if (id < 0) throw InputError(where + ": negative id for token '" + token + "'");
    vocab_.emplace(token, id);
    if (static_cast<size_t>(id) >= id_to_token_.size())
      id_to_token_.resize(static_cast<size_t>(id) + 1);
    id_to_token_[static_cast<size_t>(id)] = token;
    const size_t n = token.empty() ? 0 : utf8_length(static_cast<unsigned char>(token[0]));
    if (n == token.size() && n > 0) char_ids_.emplace(decode_code_point(token, n), id);
  }
  byte_ids_.fill(-1);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    if (auto it = vocab_.find(name); it != vocab_.end())
      byte_ids_[static_cast<size_t>(b)] = it->second;
  }
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    const auto unk = model["unk_token"].get<std::string>();
    auto it = vocab_.find(unk);
    if (it == vocab_.end())
      throw InputError(where + ": unk_token '" + unk + "' is not in the vocab");
    unk_id_ = it->second;
  }
  const auto& merges = model.at("merges");
  std::vector<std::pair<uint64_t, Merge>> entries;
  entries.reserve(merges.size());
  int32_t rank = 0;
  for (const auto& m : merges) {
    std::string left, right;
    if (m.is_string()) {  // "left right" (tokenizers < 0.20)
      const auto& s = m.get_ref<const std::string&>();
      const size_t space = s.find(' ');
      if (space == std::string::npos) throw InputError(where + ": merge '" + s + "' has no space");
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2) {  // ["left", "right"]
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    } else {
      throw InputError(where + ": merge #" + std::to_string(rank) +
                       " is neither \"a b\" nor [a, b]");
    }
    auto l = vocab_.find(left), r = vocab_.find(right), lr = vocab_.find(left + right);
    if (l == vocab_.end() || r == vocab_.end() || lr == vocab_.end()) {
      throw InputError(where + ": merge '" + left + " " + right + "' uses tokens not in the vocab");
    }
    entries.emplace_back(pair_key(l->second, r->second), Merge{rank, lr->second});
    ++rank;
  }
  merges_.build(entries);
}

BpeModel::~BpeModel() = default;

std::optional<TokenId> BpeModel::token_to_id(std::string_view token) const {
  auto it = vocab_.find(std::string(token));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(TokenId id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size()) return nullptr;
  return &id_to_token_[static_cast<size_t>(id)];
}

// One symbol per character; characters not in the vocabulary become their byte tokens
// (byte_fallback) or <unk> (fused when fuse_unk), as HF's BPE::merge_word.
void BpeModel::initial_symbols(std::string_view word, std::vector<TokenId>& symbols) const {
  size_t i = 0;
  while (i < word.size()) {
    const size_t n = std::min(utf8_length(static_cast<unsigned char>(word[i])), word.size() - i);
    auto it = char_ids_.find(decode_code_point(word.substr(i), n));
    if (it != char_ids_.end()) {
      symbols.push_back(it->second);
    } else {
      bool all_bytes = byte_fallback_;
      for (size_t k = 0; k < n && all_bytes; ++k) {
        all_bytes = byte_ids_[static_cast<unsigned char>(word[i + k])] >= 0;
      }
      if (all_bytes) {
        for (size_t k = 0; k < n; ++k)
          symbols.push_back(byte_ids_[static_cast<unsigned char>(word[i + k])]);
      } else if (unk_id_) {
        if (!(fuse_unk_ && !symbols.empty() && symbols.back() == *unk_id_))
          symbols.push_back(*unk_id_);
      } else {
        throw InputError("character '" + std::string(word.substr(i, n)) +
                         "' is not in the BPE vocabulary and the model has no unk_token");
      }
    }
    i += n;
  }
}

void BpeModel::merge_word(std::string_view word, std::vector<TokenId>& out) const {
  if (ignore_merges_) {
    if (auto it = vocab_.find(std::string(word)); it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  std::vector<TokenId> ids;
  initial_symbols(word, ids);
  const int n = static_cast<int>(ids.size());
  std::vector<int> prev(static_cast<size_t>(n)), next(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    prev[static_cast<size_t>(i)] = i - 1;
    next[static_cast<size_t>(i)] = i + 1 < n ? i + 1 : -1;
  }
  struct Candidate {
    int32_t rank;
    int left;  // position of the left symbol
    TokenId left_id, right_id;
    TokenId merged;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : left > o.left;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  const auto push = [&](int left) {
    if (left < 0) return;
    const int right = next[static_cast<size_t>(left)];
    if (right < 0) return;
    const TokenId a = ids[static_cast<size_t>(left)], b = ids[static_cast<size_t>(right)];
    if (const Merge* m = merges_.find(pair_key(a, b))) heap.push({m->rank, left, a, b, m->merged});
  };
  for (int i = 0; i + 1 < n; ++i) push(i);
  std::vector<bool> alive(static_cast<size_t>(n), true);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    const auto l = static_cast<size_t>(c.left);
    const int r = next[l];
    // Stale entries: a symbol merged away or changed since this pair was pushed.
    if (!alive[l] || r < 0 || ids[l] != c.left_id || ids[static_cast<size_t>(r)] != c.right_id)
      continue;
    ids[l] = c.merged;
    alive[static_cast<size_t>(r)] = false;
    next[l] = next[static_cast<size_t>(r)];
    if (next[l] >= 0) prev[static_cast<size_t>(next[l])] = c.left;
    push(prev[l]);
    push(c.left);
  }
  for (int i = n > 0 ? 0 : -1; i >= 0; i = next[static_cast<size_t>(i)])
    out.push_back(ids[static_cast<size_t>(i)]);
}

void BpeModel::encode_word(std::string_view word, std::vector<TokenId>& out) const {
  if (word.empty()) return;
  if (word.size() > kCacheMaxWordBytes) {
    merge_word(word, out);
    return;
  }
  std::string key(word);
  CacheShard& shard = cache_[std::hash<std::string>{}(key) % kCacheShards];
  {
    std::lock_guard<std::mutex> lock(shard.mutex);
    if (auto it = shard.words.find(key); it != shard.words.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<TokenId> ids;
  merge_word(word, ids);
  out.insert(out.end(), ids.begin(), ids.end());
  std::lock_guard<std::mutex> lock(shard.mutex);
  if (shard.words.size() >= kCacheShardCapacity) shard.words.clear();
  shard.words.emplace(std::move(key), std::move(ids));
}

}  // namespace rlhf::tokenizer
