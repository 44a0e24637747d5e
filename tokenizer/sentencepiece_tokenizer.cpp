// SentencePiece wrapper: every util::Status is checked and turned into an exception.
#include "tokenizer/sentencepiece_tokenizer.h"

#include <sentencepiece_processor.h>

#include <algorithm>

#include "core/errors.h"
#include "tokenizer/unicode.h"

namespace rlhf::tokenizer {

SentencePieceTokenizer::SentencePieceTokenizer(const std::string& path,
                                               const TokenizerConfig& config)
    : sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {
  const auto status = sp_->Load(path);
  if (!status.ok())
    throw InputError(path + ": cannot load SentencePiece model: " + status.ToString());
  const auto id_or_none = [&](int id) -> std::optional<TokenId> {
    return id >= 0 ? std::optional<TokenId>(id) : std::nullopt;
  };
  special_ids_ = {id_or_none(sp_->bos_id()), id_or_none(sp_->eos_id()), id_or_none(sp_->pad_id()),
                  id_or_none(sp_->unk_id())};
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
  for (int id = 0; id < sp_->GetPieceSize(); ++id) {
    if (sp_->IsControl(id) || sp_->IsUnknown(id))
      special_pieces_.emplace_back(sp_->IdToPiece(id), id);
  }
  std::sort(special_pieces_.begin(), special_pieces_.end(),
            [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

int64_t SentencePieceTokenizer::vocab_size() const {
  return sp_->GetPieceSize();
}

std::optional<TokenId> SentencePieceTokenizer::token_to_id(std::string_view token) const {
  const int id = sp_->PieceToId(std::string(token));
  // PieceToId answers unk_id for unknown pieces: only the unk piece itself maps to it.
  if (id == sp_->unk_id() && sp_->IdToPiece(id) != token) return std::nullopt;
  return id;
}

bool SentencePieceTokenizer::is_special(TokenId id) const {
  return sp_->IsControl(id) || sp_->IsUnknown(id);
}

std::vector<TokenId> SentencePieceTokenizer::encode(std::string_view text,
                                                    AddSpecial add_special) const {
  if (!is_valid_utf8(text)) throw InputError("encode: text is not valid UTF-8");
  std::vector<TokenId> ids;
  if (add_special == AddSpecial::kYes && add_bos_ && special_ids_.bos)
    ids.push_back(*special_ids_.bos);
  const auto encode_piece = [&](std::string_view piece) {
    if (piece.empty()) return;
    std::vector<int> piece_ids;
    const auto status = sp_->Encode(std::string(piece), &piece_ids);
    if (!status.ok()) throw RuntimeError("SentencePiece Encode: " + status.ToString());
    ids.insert(ids.end(), piece_ids.begin(), piece_ids.end());
  };
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
    encode_piece(text.substr(start, i - start));
    ids.push_back(match->second);
    i += match->first.size();
    start = i;
  }
  encode_piece(text.substr(start));
  if (add_special == AddSpecial::kYes && add_eos_ && special_ids_.eos)
    ids.push_back(*special_ids_.eos);
  return ids;
}

std::string SentencePieceTokenizer::decode(const std::vector<TokenId>& ids,
                                           SkipSpecial skip_special) const {
  std::string text;
  std::vector<int> run;  // consecutive ordinary ids, decoded together
  const auto flush = [&] {
    if (run.empty()) return;
    std::string piece;
    const auto status = sp_->Decode(run, &piece);
    if (!status.ok()) throw RuntimeError("SentencePiece Decode: " + status.ToString());
    text += piece;
    run.clear();
  };
  for (TokenId id : ids) {
    if (id < 0 || id >= sp_->GetPieceSize()) {
      throw InputError("decode: id " + std::to_string(id) + " is outside the vocabulary [0, " +
                       std::to_string(sp_->GetPieceSize()) + ")");
    }
    if (is_special(id)) {
      // Skipped specials vanish without splitting the run (HF filters them first); kept
      // ones end the run and appear as their piece.
      if (skip_special == SkipSpecial::kYes) continue;
      flush();
      text += sp_->IdToPiece(id);
    } else {
      run.push_back(id);
    }
  }
  flush();
  return text;
}

}  // namespace rlhf::tokenizer
