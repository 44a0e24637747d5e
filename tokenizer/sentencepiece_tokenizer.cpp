// Encoding follows SentencePiece's bpe_model.cc (greedy merges of adjacent symbols by piece
// score, ties to the leftmost pair, unused pieces re-split) and unigram_model.cc
// (EncodeOptimized: Viterbi over the pieces starting at each character, float scores, an
// unknown character costs min_score - 10, user-defined symbols always win); then
// SentencePieceProcessor's post-processing (unknown pieces to <0xXX> bytes with byte
// fallback, else consecutive unknowns merged into one) and its Decode rules.
#include "tokenizer/sentencepiece_tokenizer.h"

#include <algorithm>
#include <cfloat>
#include <cstdio>
#include <functional>
#include <queue>

#include "core/errors.h"
#include "tokenizer/unicode.h"

namespace rlhf::tokenizer {
namespace {

constexpr float kUnigramUnknownPenalty = 10.0f;  // unigram_model.h kUnkPenalty

std::vector<std::string> user_defined_pieces(const SentencePieceModel& model) {
  std::vector<std::string> out;
  for (const auto& p : model.pieces)
    if (p.type == PieceType::kUserDefined) out.push_back(p.piece);
  return out;
}

// "<0x41>" -> 0x41; -1 when `piece` is not a byte piece's spelling.
int byte_of_piece(const std::string& piece) {
  unsigned value = 0;
  char close = 0;
  if (piece.size() != 6 || std::sscanf(piece.c_str(), "<0x%2X%c", &value, &close) != 2 ||
      close != '>')
    return -1;
  return static_cast<int>(value);
}

// Bytes decoded as UTF-8, each byte of an invalid sequence becoming U+FFFD (ProcessBytePieces).
void append_bytes_as_text(const std::string& bytes, std::string& out) {
  size_t i = 0;
  while (i < bytes.size()) {
    const size_t n = utf8_length(static_cast<unsigned char>(bytes[i]));
    if (i + n <= bytes.size() && is_valid_utf8(std::string_view(bytes).substr(i, n))) {
      out.append(bytes, i, n);
      i += n;
    } else {
      out += "\xEF\xBF\xBD";
      i += 1;
    }
  }
}

// `piece` with every "▁" turned into a space.
std::string unescape_spaces(std::string_view piece) {
  std::string out;
  while (!piece.empty()) {
    if (piece.substr(0, kSentencePieceSpace.size()) == kSentencePieceSpace) {
      out += ' ';
      piece.remove_prefix(kSentencePieceSpace.size());
    } else {
      out += piece.front();
      piece.remove_prefix(1);
    }
  }
  return out;
}

template <typename Node>
void insert_into_trie(std::vector<Node>& trie, const std::string& piece, TokenId id) {
  size_t node = 0;
  for (char c : piece) {
    const auto byte = static_cast<unsigned char>(c);
    auto& children = trie[node].children;
    auto it = std::lower_bound(children.begin(), children.end(), byte,
                               [](const auto& child, unsigned char b) { return child.first < b; });
    if (it != children.end() && it->first == byte) {
      node = static_cast<size_t>(it->second);
      continue;
    }
    const auto next = static_cast<int32_t>(trie.size());
    children.insert(it, {byte, next});
    trie.emplace_back();  // may reallocate: `children` is not used after this
    node = static_cast<size_t>(next);
  }
  trie[node].id = id;
}

template <typename Node>
int32_t trie_child(const Node& node, unsigned char byte) {
  const auto it =
      std::lower_bound(node.children.begin(), node.children.end(), byte,
                       [](const auto& child, unsigned char b) { return child.first < b; });
  return it != node.children.end() && it->first == byte ? it->second : -1;
}

}  // namespace

SentencePieceTokenizer::SentencePieceTokenizer(const std::string& path,
                                               const TokenizerConfig& config)
    : model_(SentencePieceModel::load(path)),
      normalizer_(model_.normalizer, user_defined_pieces(model_), path) {
  if (model_.algorithm != SentencePieceAlgorithm::kBpe &&
      model_.algorithm != SentencePieceAlgorithm::kUnigram) {
    throw InputError(path + ": SentencePiece model_type " +
                     (model_.algorithm == SentencePieceAlgorithm::kWord ? "WORD" : "CHAR") +
                     " is not supported (BPE and UNIGRAM are)");
  }
  if (model_.treat_whitespace_as_suffix)
    throw InputError(path + ": SentencePiece treat_whitespace_as_suffix is not supported");
  if (model_.has_denormalizer)
    throw InputError(path +
                     ": SentencePiece denormalizer_spec with a character map is not supported");
  byte_ids_.fill(-1);
  trie_.emplace_back();
  min_score_ = FLT_MAX;
  max_score_ = FLT_MIN;  // sic: SentencePiece starts from FLT_MIN (the smallest positive float)
  for (size_t i = 0; i < model_.pieces.size(); ++i) {
    const auto& p = model_.pieces[i];
    const auto id = static_cast<TokenId>(i);
    const bool ordinary = p.type == PieceType::kNormal || p.type == PieceType::kUserDefined ||
                          p.type == PieceType::kUnused;
    auto& table = ordinary ? pieces_ : reserved_;
    if (!table.emplace(p.piece, id).second)
      throw InputError(path + ": SentencePiece piece '" + p.piece + "' appears twice");
    if (p.type == PieceType::kUnknown) unk_id_ = id;
    if (p.type == PieceType::kByte) {
      const int byte = byte_of_piece(p.piece);
      if (byte < 0) throw InputError(path + ": byte piece '" + p.piece + "' is not <0xXX>");
      byte_ids_[static_cast<size_t>(byte)] = id;
    }
    if (p.type == PieceType::kNormal) {
      min_score_ = std::min(min_score_, p.score);
      max_score_ = std::max(max_score_, p.score);
    }
    if (ordinary) insert_into_trie(trie_, p.piece, id);
    if (p.type == PieceType::kControl || p.type == PieceType::kUnknown)
      special_pieces_.emplace_back(p.piece, id);
  }
  if (unk_id_ < 0) throw InputError(path + ": SentencePiece model has no unknown piece");
  if (model_.byte_fallback && std::count(byte_ids_.begin(), byte_ids_.end(), -1) > 0)
    throw InputError(path +
                     ": byte_fallback is on but the model lacks some of the 256 byte pieces");
  std::stable_sort(special_pieces_.begin(), special_pieces_.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });

  // SentencePieceProcessor::bos_id() and friends: the named piece when it is a control piece.
  const auto control_id = [&](const std::string& piece) -> std::optional<TokenId> {
    const auto it = reserved_.find(piece);
    if (it == reserved_.end() || type(it->second) != PieceType::kControl) return std::nullopt;
    return it->second;
  };
  special_ids_ = {control_id(model_.bos_piece), control_id(model_.eos_piece),
                  control_id(model_.pad_piece), unk_id_};
  // tokenizer_config.json names the tokens when it has them (e.g. a PAD that is not SP's).
  const auto from_config = [&](const std::optional<std::string>& token,
                               std::optional<TokenId>& id) {
    if (token) {
      if (auto found = token_to_id(*token)) id = found;
    }
  };
  from_config(config.bos_token, special_ids_.bos);
  from_config(config.eos_token, special_ids_.eos);
  from_config(config.pad_token, special_ids_.pad);
  from_config(config.unk_token, special_ids_.unk);
  add_bos_ = config.add_bos_token.value_or(true);
  add_eos_ = config.add_eos_token.value_or(false);
}

TokenId SentencePieceTokenizer::piece_to_id(std::string_view piece) const {
  const std::string key(piece);
  if (const auto it = reserved_.find(key); it != reserved_.end()) return it->second;
  if (const auto it = pieces_.find(key); it != pieces_.end()) return it->second;
  return unk_id_;
}

std::optional<TokenId> SentencePieceTokenizer::token_to_id(std::string_view token) const {
  const TokenId id = piece_to_id(token);
  // piece_to_id answers the unknown id for unknown pieces: only "<unk>" itself maps to it.
  if (id == unk_id_ && model_.pieces[static_cast<size_t>(id)].piece != token) return std::nullopt;
  return id;
}

TokenId SentencePieceTokenizer::find_ordinary_piece(std::string_view piece) const {
  int32_t node = 0;
  for (char c : piece) {
    node = trie_child(trie_[static_cast<size_t>(node)], static_cast<unsigned char>(c));
    if (node < 0) return -1;
  }
  return trie_[static_cast<size_t>(node)].id;
}

bool SentencePieceTokenizer::is_special(TokenId id) const {
  return type(id) == PieceType::kControl || type(id) == PieceType::kUnknown;
}

std::vector<SentencePieceTokenizer::Segment> SentencePieceTokenizer::encode_bpe(
    std::string_view normalized) const {
  struct Symbol {
    int prev, next;
    std::string_view piece;
    bool frozen;  // a user-defined symbol: never merged
  };
  struct Pair {
    int left, right;
    float score;
    size_t size;
  };
  // Highest score first; among equal scores the leftmost pair.
  const auto lower = [](const Pair& a, const Pair& b) {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  };
  std::priority_queue<Pair, std::vector<Pair>, decltype(lower)> agenda(lower);
  std::unordered_map<std::string_view, std::pair<std::string_view, std::string_view>> unmerge;
  std::vector<Symbol> symbols;

  for (std::string_view rest = normalized; !rest.empty();) {
    size_t n = normalizer_.match_user_defined(rest);
    const bool frozen = n > 0;
    if (!frozen) n = std::min(rest.size(), utf8_length(static_cast<unsigned char>(rest[0])));
    const int index = static_cast<int>(symbols.size());
    symbols.push_back({index - 1, rest.size() == n ? -1 : index + 1, rest.substr(0, n), frozen});
    rest.remove_prefix(n);
  }
  const auto try_pair = [&](int left, int right) {
    if (left < 0 || right < 0 || symbols[left].frozen || symbols[right].frozen) return;
    const std::string_view joined(symbols[left].piece.data(),
                                  symbols[left].piece.size() + symbols[right].piece.size());
    const TokenId id = find_ordinary_piece(joined);
    if (id < 0) return;
    agenda.push({left, right, model_.pieces[static_cast<size_t>(id)].score, joined.size()});
    if (type(id) == PieceType::kUnused)
      unmerge[joined] = {symbols[left].piece, symbols[right].piece};
  };
  for (size_t i = 1; i < symbols.size(); ++i)
    try_pair(static_cast<int>(i) - 1, static_cast<int>(i));
  while (!agenda.empty()) {
    const Pair top = agenda.top();
    agenda.pop();
    auto& left = symbols[top.left];
    auto& right = symbols[top.right];
    // Stale entries: one side already merged elsewhere.
    if (left.piece.empty() || right.piece.empty() ||
        left.piece.size() + right.piece.size() != top.size)
      continue;
    left.piece = std::string_view(left.piece.data(), top.size);
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.left;
    right.piece = {};
    try_pair(left.prev, top.left);
    try_pair(top.left, left.next);
  }
  std::vector<Segment> out;
  // An unused piece produced by a merge is split back into the pieces it was made of.
  std::function<void(std::string_view)> resegment = [&](std::string_view piece) {
    const TokenId id = piece_to_id(piece);
    const auto it = unmerge.find(piece);
    if (type(id) != PieceType::kUnused || it == unmerge.end()) {
      out.emplace_back(piece, id);
      return;
    }
    resegment(it->second.first);
    resegment(it->second.second);
  };
  for (int i = symbols.empty() ? -1 : 0; i >= 0; i = symbols[i].next) resegment(symbols[i].piece);
  return out;
}

std::vector<SentencePieceTokenizer::Segment> SentencePieceTokenizer::encode_unigram(
    std::string_view normalized) const {
  struct Best {
    TokenId id = -1;
    float score = 0;
    int64_t start = -1;  // where the best path's last piece starts; -1 = unreached
  };
  const size_t size = normalized.size();
  const float unknown_score = min_score_ - kUnigramUnknownPenalty;
  std::vector<Best> best(size + 1);
  best[0].start = 0;
  const auto relax = [&](size_t start, size_t end, TokenId id, float piece_score) {
    const float candidate = best[start].score + piece_score;
    auto& node = best[end];
    if (node.start < 0 || candidate > node.score)
      node = {id, candidate, static_cast<int64_t>(start)};
  };
  for (size_t start = 0; start < size;) {
    const size_t char_len =
        std::min(size - start, utf8_length(static_cast<unsigned char>(normalized[start])));
    bool has_single_char_piece = false;
    int32_t node = 0;
    for (size_t length = 1; start + length <= size; ++length) {
      node = trie_child(trie_[static_cast<size_t>(node)],
                        static_cast<unsigned char>(normalized[start + length - 1]));
      if (node < 0) break;
      const TokenId id = trie_[static_cast<size_t>(node)].id;
      if (id < 0 || type(id) == PieceType::kUnused) continue;
      const float score = type(id) == PieceType::kUserDefined
                              ? static_cast<float>(length) * max_score_ - 0.1f
                              : model_.pieces[static_cast<size_t>(id)].score;
      relax(start, start + length, id, score);
      if (length == char_len) has_single_char_piece = true;
    }
    if (!has_single_char_piece) relax(start, start + char_len, unk_id_, unknown_score);
    start += char_len;
  }
  std::vector<Segment> out;
  for (size_t end = size; end > 0;) {
    const auto& node = best[end];
    const auto start = static_cast<size_t>(node.start);
    out.emplace_back(normalized.substr(start, end - start), node.id);
    end = start;
  }
  std::reverse(out.begin(), out.end());
  return out;
}

void SentencePieceTokenizer::encode_plain(std::string_view text, std::vector<TokenId>& ids) const {
  if (text.empty()) return;
  const std::string normalized = normalizer_.normalize(text);
  const auto segments = model_.algorithm == SentencePieceAlgorithm::kBpe
                            ? encode_bpe(normalized)
                            : encode_unigram(normalized);
  bool previous_unknown = false;
  for (const auto& [piece, id] : segments) {
    const bool unknown = id == unk_id_;
    if (unknown && model_.byte_fallback) {
      for (char c : piece) ids.push_back(byte_ids_[static_cast<unsigned char>(c)]);
    } else if (!(unknown && previous_unknown)) {
      ids.push_back(id);  // a run of unknowns becomes one <unk>
    }
    previous_unknown = unknown;
  }
}

std::vector<TokenId> SentencePieceTokenizer::encode(std::string_view text,
                                                    AddSpecial add_special) const {
  if (!is_valid_utf8(text)) throw InputError("encode: text is not valid UTF-8");
  std::vector<TokenId> ids;
  if (add_special == AddSpecial::kYes && add_bos_ && special_ids_.bos)
    ids.push_back(*special_ids_.bos);
  size_t start = 0, i = 0;
  while (i < text.size()) {
    const std::pair<std::string, TokenId>* match = nullptr;
    for (const auto& sp : special_pieces_) {
      if (!sp.first.empty() && text.compare(i, sp.first.size(), sp.first) == 0) {
        match = &sp;
        break;
      }
    }
    if (!match) {
      ++i;
      continue;
    }
    encode_plain(text.substr(start, i - start), ids);
    ids.push_back(match->second);
    i += match->first.size();
    start = i;
  }
  encode_plain(text.substr(start), ids);
  if (add_special == AddSpecial::kYes && add_eos_ && special_ids_.eos)
    ids.push_back(*special_ids_.eos);
  return ids;
}

std::string SentencePieceTokenizer::decode(const std::vector<TokenId>& ids,
                                           SkipSpecial skip_special) const {
  const bool strip_first_space =
      model_.normalizer.add_dummy_prefix || model_.normalizer.remove_extra_whitespaces;
  std::string text;
  std::string bytes;     // pending <0xXX> pieces, decoded together as UTF-8
  bool at_start = true;  // no text yet in this run: a leading "▁" is the dummy prefix
  const auto flush_bytes = [&] {
    if (bytes.empty()) return;
    const size_t before = text.size();
    append_bytes_as_text(bytes, text);
    if (text.size() > before) at_start = false;
    bytes.clear();
  };
  for (TokenId id : ids) {
    if (id < 0 || id >= vocab_size()) {
      throw InputError("decode: id " + std::to_string(id) + " is outside the vocabulary [0, " +
                       std::to_string(vocab_size()) + ")");
    }
    const auto& piece = model_.pieces[static_cast<size_t>(id)];
    if (piece.type == PieceType::kByte) {
      bytes += static_cast<char>(byte_of_piece(piece.piece));
      continue;
    }
    flush_bytes();
    if (is_special(id)) {
      // Skipped specials vanish (HF filters them first); kept ones appear as their piece
      // and start a new run, as HF decodes the pieces between specials on their own.
      if (skip_special == SkipSpecial::kYes) continue;
      text += piece.piece;
      at_start = true;
      continue;
    }
    std::string_view surface = piece.piece;
    bool consumed_space = false;
    if (at_start && strip_first_space &&
        surface.substr(0, kSentencePieceSpace.size()) == kSentencePieceSpace) {
      surface.remove_prefix(kSentencePieceSpace.size());
      // With remove_extra_whitespaces every leading space goes, not only the first.
      consumed_space = !model_.normalizer.remove_extra_whitespaces;
    }
    const size_t before = text.size();
    text += unescape_spaces(surface);
    if (consumed_space || text.size() > before) at_start = false;
  }
  flush_bytes();
  return text;
}

}  // namespace rlhf::tokenizer
