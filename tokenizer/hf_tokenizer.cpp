// HF tokenizer.json loading and the encode/decode pipelines (Rust tokenizers'
// TokenizerImpl::encode_single_sequence and decode, without offsets or truncation).
#include "tokenizer/hf_tokenizer.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/errors.h"
#include "tokenizer/unicode.h"

namespace rlhf::tokenizer {

namespace {

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InputError(path + ": cannot open");
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw InputError(path + ": not valid JSON: " + e.what());
  }
}

const nlohmann::json& field(const nlohmann::json& j, const char* key) {
  static const nlohmann::json kNull;
  return j.contains(key) ? j[key] : kNull;
}

bool is_space(char c) {
  return c == ' ' || (c >= '\t' && c <= '\r');
}

// A word character for single_word tokens: ASCII letters, digits, '_' and any non-ASCII byte
// (letters of other scripts; HF uses char::is_alphanumeric).
bool is_word_byte(char c) {
  const auto u = static_cast<unsigned char>(c);
  return u >= 0x80 || std::isalnum(u) || c == '_';
}

}  // namespace

std::string clean_up_tokenization(std::string text) {
  static const std::pair<const char*, const char*> kRules[] = {
      {" .", "."},     {" ?", "?"},   {" !", "!"},   {" ,", ","},     {" ' ", "'"},
      {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (const auto& [from, to] : kRules) {  // applied one after another, as HF does
    const std::string f = from, t = to;
    std::string out;
    size_t last = 0;
    for (size_t at = text.find(f); at != std::string::npos; at = text.find(f, last)) {
      out.append(text, last, at - last);
      out += t;
      last = at + f.size();
    }
    out.append(text, last, std::string::npos);
    text = std::move(out);
  }
  return text;
}

HfTokenizer::HfTokenizer(const std::string& path, const TokenizerConfig& config)
    : normalizer_(nullptr, path), pre_tokenizer_(nullptr, path), decoder_(nullptr, path) {
  const nlohmann::json json = read_json(path);
  try {
    const auto& model = field(json, "model");
    const std::string type = model.is_object() ? model.value("type", "BPE") : "";
    if (type != "BPE") {
      throw InputError(path + ": model type '" + type + "' is not supported (supported: BPE)");
    }
    model_ = std::make_unique<BpeModel>(model, path);
    normalizer_ = Normalizer(field(json, "normalizer"), path);
    pre_tokenizer_ = PreTokenizer(field(json, "pre_tokenizer"), path);
    decoder_ = Decoder(field(json, "decoder"), path);
    vocab_size_ = model_->size();
    read_added_tokens(field(json, "added_tokens"), path);
    const auto id_of = [&](const std::optional<std::string>& token) -> std::optional<TokenId> {
      return token ? token_to_id(*token) : std::nullopt;
    };
    special_ids_ = {id_of(config.bos_token), id_of(config.eos_token), id_of(config.pad_token),
                    id_of(config.unk_token)};
    read_post_processor(field(json, "post_processor"), path);
    // HF's LlamaTokenizerFast (and CodeLlama, Gemma) rebuild the post-processor from
    // tokenizer_config.json's add_bos_token/add_eos_token; other classes keep tokenizer.json's.
    const auto& cls = config.tokenizer_class;
    const bool rebuilds =
        cls.rfind("Llama", 0) == 0 || cls.rfind("CodeLlama", 0) == 0 || cls.rfind("Gemma", 0) == 0;
    if (rebuilds && (config.add_bos_token || config.add_eos_token)) {
      prefix_ids_.clear();
      suffix_ids_.clear();
      if (config.add_bos_token.value_or(true) && special_ids_.bos) {
        prefix_ids_.push_back(*special_ids_.bos);
      }
      if (config.add_eos_token.value_or(false) && special_ids_.eos) {
        suffix_ids_.push_back(*special_ids_.eos);
      }
    }
    clean_up_spaces_ = config.clean_up_tokenization_spaces;
  } catch (const nlohmann::json::exception& e) {
    throw InputError(path + ": unexpected structure: " + e.what());
  }
}

// "added_tokens": matched in the text before normalization, longest first at each position.
void HfTokenizer::read_added_tokens(const nlohmann::json& added_tokens, const std::string& path) {
  added_by_first_byte_.resize(256);
  for (const auto& t : added_tokens) {
    AddedToken token{t.at("id").get<TokenId>(), t.at("content").get<std::string>(),
                     t.value("special", false), t.value("lstrip", false),
                     t.value("rstrip", false),  t.value("single_word", false)};
    if (token.content.empty())
      throw InputError(path + ": added token " + std::to_string(token.id) + " is empty");
    vocab_size_ = std::max<int64_t>(vocab_size_, token.id + 1);
    added_by_id_[token.id] = added_.size();
    added_by_content_[token.content] = token.id;
    added_.push_back(std::move(token));
  }
  for (size_t i = 0; i < added_.size(); ++i) {
    added_by_first_byte_[static_cast<unsigned char>(added_[i].content[0])].push_back(i);
  }
  for (auto& bucket : added_by_first_byte_) {
    std::stable_sort(bucket.begin(), bucket.end(), [&](size_t a, size_t b) {
      return added_[a].content.size() > added_[b].content.size();
    });
  }
}

HfTokenizer::~HfTokenizer() = default;

void HfTokenizer::read_post_processor(const nlohmann::json& spec, const std::string& where) {
  if (spec.is_null()) return;
  const std::string type = spec.value("type", "");
  if (type == "Sequence") {
    for (const auto& child : spec.at("processors")) read_post_processor(child, where);
  } else if (type == "ByteLevel") {
    // Only adjusts offsets: no ids.
  } else if (type == "TemplateProcessing") {
    bool after_sequence = false;
    for (const auto& item : spec.at("single")) {
      if (item.contains("Sequence")) {
        after_sequence = true;
        continue;
      }
      const auto name = item.at("SpecialToken").at("id").get<std::string>();
      const auto& ids = spec.at("special_tokens").at(name).at("ids");
      for (const auto& id : ids)
        (after_sequence ? suffix_ids_ : prefix_ids_).push_back(id.get<TokenId>());
    }
  } else {
    throw InputError(where + ": post_processor type '" + type +
                     "' is not supported (supported: TemplateProcessing, ByteLevel, Sequence)");
  }
}

std::optional<TokenId> HfTokenizer::token_to_id(std::string_view token) const {
  if (auto it = added_by_content_.find(std::string(token)); it != added_by_content_.end()) {
    return it->second;
  }
  return model_->token_to_id(token);
}

// Leftmost-longest matches of the added tokens (HF's AddedVocabulary::split_with_indices).
std::vector<HfTokenizer::Segment> HfTokenizer::split_added(std::string_view text) const {
  std::vector<Segment> segments;
  size_t start = 0;  // beginning of the pending text segment
  size_t i = 0;
  while (i < text.size()) {
    const AddedToken* match = nullptr;
    for (size_t index : added_by_first_byte_[static_cast<unsigned char>(text[i])]) {
      const auto& t = added_[index];
      if (text.compare(i, t.content.size(), t.content) != 0) continue;
      const size_t end = i + t.content.size();
      if (t.single_word && ((i > 0 && is_word_byte(text[i - 1])) ||
                            (end < text.size() && is_word_byte(text[end])))) {
        continue;
      }
      match = &t;
      break;
    }
    if (!match) {
      ++i;
      continue;
    }
    size_t text_end = i;
    if (match->lstrip) {
      while (text_end > start && is_space(text[text_end - 1])) --text_end;
    }
    if (text_end > start) segments.push_back({text.substr(start, text_end - start), nullptr});
    segments.push_back({text.substr(i, match->content.size()), match});
    i += match->content.size();
    if (match->rstrip) {
      while (i < text.size() && is_space(text[i])) ++i;
    }
    start = i;
  }
  if (start < text.size()) segments.push_back({text.substr(start), nullptr});
  return segments;
}

void HfTokenizer::encode_text(std::string_view text, bool at_text_start,
                              std::vector<TokenId>& out) const {
  std::string normalized = normalizer_.empty() ? std::string(text) : normalizer_(std::string(text));
  for (const auto& word : pre_tokenizer_(std::move(normalized), at_text_start)) {
    model_->encode_word(word, out);
  }
}

std::vector<TokenId> HfTokenizer::encode(std::string_view text, AddSpecial add_special) const {
  if (!is_valid_utf8(text)) throw InputError("encode: text is not valid UTF-8");
  std::vector<TokenId> ids;
  ids.reserve(text.size() / 3 + 4);
  if (add_special == AddSpecial::kYes) ids = prefix_ids_;
  bool first = true;
  for (const auto& segment : split_added(text)) {
    if (segment.added) {
      ids.push_back(segment.added->id);
    } else {
      encode_text(segment.text, first && segment.text.data() == text.data(), ids);
    }
    first = false;
  }
  if (add_special == AddSpecial::kYes)
    ids.insert(ids.end(), suffix_ids_.begin(), suffix_ids_.end());
  return ids;
}

std::string HfTokenizer::decode(const std::vector<TokenId>& ids, SkipSpecial skip_special) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (TokenId id : ids) {
    if (auto it = added_by_id_.find(id); it != added_by_id_.end()) {
      const auto& t = added_[it->second];
      if (!(t.special && skip_special == SkipSpecial::kYes)) tokens.push_back(t.content);
      continue;
    }
    const std::string* token = model_->id_to_token(id);
    if (!token || id < 0) {
      throw InputError("decode: id " + std::to_string(id) + " is outside the vocabulary [0, " +
                       std::to_string(vocab_size_) + ")");
    }
    tokens.push_back(*token);
  }
  std::string text = decoder_(std::move(tokens));
  return clean_up_spaces_ ? clean_up_tokenization(std::move(text)) : text;
}

}  // namespace rlhf::tokenizer
