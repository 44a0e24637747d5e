// Protobuf wire format (https://protobuf.dev/programming-guides/encoding/): each field is a
// varint key (field_number << 3 | wire_type) followed by a varint (type 0), 8 bytes (1),
// a varint length and that many bytes (2) or 4 bytes (5). Unknown fields are skipped, as
// protobuf does, so models written by newer SentencePiece versions still load.
#include "tokenizer/sentencepiece_model.h"

#include <cstring>
#include <fstream>
#include <sstream>

#include "core/errors.h"

namespace rlhf::tokenizer {
namespace {

enum class WireType : int { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

// A cursor over one message's bytes; `what` names the message in errors.
class WireReader {
 public:
  WireReader(std::string_view bytes, const std::string& path, std::string what, size_t base)
      : bytes_(bytes), path_(path), what_(std::move(what)), base_(base) {}

  bool done() const { return pos_ >= bytes_.size(); }

  // Reads the next key; returns the field number and sets `type`.
  int next_field(WireType& type) {
    const uint64_t key = varint();
    const int wire = static_cast<int>(key & 7);
    if (wire != 0 && wire != 1 && wire != 2 && wire != 5)
      fail("unsupported wire type " + std::to_string(wire));
    type = static_cast<WireType>(wire);
    const uint64_t field = key >> 3;
    if (field == 0) fail("field number 0");
    return static_cast<int>(field);
  }

  uint64_t varint() {
    uint64_t value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (done()) fail("truncated varint");
      const auto byte = static_cast<unsigned char>(bytes_[pos_++]);
      value |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if (!(byte & 0x80)) return value;
    }
    fail("varint longer than 10 bytes");
  }

  std::string_view length_delimited() {
    const uint64_t length = varint();
    if (length > bytes_.size() - pos_)
      fail("a field of " + std::to_string(length) + " bytes runs past the end of the message");
    const auto out = bytes_.substr(pos_, length);
    pos_ += length;
    return out;
  }

  float fixed32_float() {
    if (bytes_.size() - pos_ < 4) fail("truncated 32-bit field");
    uint32_t bits = 0;
    for (int i = 3; i >= 0; --i) bits = (bits << 8) | static_cast<unsigned char>(bytes_[pos_ + i]);
    pos_ += 4;
    float value;
    std::memcpy(&value, &bits, sizeof value);
    return value;
  }

  void skip(WireType type) {
    switch (type) {
      case WireType::kVarint:
        varint();
        return;
      case WireType::kLengthDelimited:
        length_delimited();
        return;
      case WireType::kFixed64:
      case WireType::kFixed32: {
        const size_t n = type == WireType::kFixed64 ? 8 : 4;
        if (bytes_.size() - pos_ < n) fail("truncated fixed-width field");
        pos_ += n;
        return;
      }
    }
  }

  // Checks a known field's wire type.
  void expect(WireType found, WireType wanted, const char* field) {
    if (found != wanted)
      fail(std::string("field ") + field + " has wire type " +
           std::to_string(static_cast<int>(found)) + ", expected " +
           std::to_string(static_cast<int>(wanted)));
  }

  // Offset of the cursor in the file, for nested readers and messages.
  size_t offset() const { return base_ + pos_; }

  [[noreturn]] void fail(const std::string& message) const {
    throw InputError(path_ + ": not a SentencePiece model: " + what_ + " at byte " +
                     std::to_string(base_ + pos_) + ": " + message);
  }

 private:
  std::string_view bytes_;
  const std::string& path_;
  std::string what_;
  size_t base_;  // offset of bytes_[0] in the file
  size_t pos_ = 0;
};

WireReader nested(WireReader& outer, const std::string& path, const char* what) {
  const auto bytes = outer.length_delimited();
  // The cursor now sits at the body's end; the body began `bytes.size()` bytes earlier.
  return WireReader(bytes, path, what, outer.offset() - bytes.size());
}

SentencePiece parse_piece(WireReader reader) {
  SentencePiece piece;
  while (!reader.done()) {
    WireType type;
    switch (reader.next_field(type)) {
      case 1:
        reader.expect(type, WireType::kLengthDelimited, "piece");
        piece.piece = std::string(reader.length_delimited());
        break;
      case 2:
        reader.expect(type, WireType::kFixed32, "score");
        piece.score = reader.fixed32_float();
        break;
      case 3: {
        reader.expect(type, WireType::kVarint, "type");
        const uint64_t value = reader.varint();
        if (value < 1 || value > 6) reader.fail("piece type " + std::to_string(value));
        piece.type = static_cast<PieceType>(value);
        break;
      }
      default:
        reader.skip(type);
    }
  }
  return piece;
}

bool parse_bool(WireReader& reader, WireType type, const char* field) {
  reader.expect(type, WireType::kVarint, field);
  return reader.varint() != 0;
}

void parse_trainer_spec(WireReader reader, SentencePieceModel& model) {
  while (!reader.done()) {
    WireType type;
    switch (reader.next_field(type)) {
      case 3: {
        reader.expect(type, WireType::kVarint, "trainer_spec.model_type");
        const uint64_t value = reader.varint();
        if (value < 1 || value > 4) reader.fail("model_type " + std::to_string(value));
        model.algorithm = static_cast<SentencePieceAlgorithm>(value);
        break;
      }
      case 24:
        model.treat_whitespace_as_suffix = parse_bool(reader, type, "treat_whitespace_as_suffix");
        break;
      case 35:
        model.byte_fallback = parse_bool(reader, type, "byte_fallback");
        break;
      case 44:
        reader.expect(type, WireType::kLengthDelimited, "unk_surface");
        model.unk_surface = std::string(reader.length_delimited());
        break;
      case 46:
        reader.expect(type, WireType::kLengthDelimited, "bos_piece");
        model.bos_piece = std::string(reader.length_delimited());
        break;
      case 47:
        reader.expect(type, WireType::kLengthDelimited, "eos_piece");
        model.eos_piece = std::string(reader.length_delimited());
        break;
      case 48:
        reader.expect(type, WireType::kLengthDelimited, "pad_piece");
        model.pad_piece = std::string(reader.length_delimited());
        break;
      default:
        reader.skip(type);
    }
  }
}

SentencePieceNormalizerSpec parse_normalizer_spec(WireReader reader) {
  SentencePieceNormalizerSpec spec;
  while (!reader.done()) {
    WireType type;
    switch (reader.next_field(type)) {
      case 1:
        reader.expect(type, WireType::kLengthDelimited, "normalizer_spec.name");
        spec.name = std::string(reader.length_delimited());
        break;
      case 2:
        reader.expect(type, WireType::kLengthDelimited, "precompiled_charsmap");
        spec.precompiled_charsmap = std::string(reader.length_delimited());
        break;
      case 3:
        spec.add_dummy_prefix = parse_bool(reader, type, "add_dummy_prefix");
        break;
      case 4:
        spec.remove_extra_whitespaces = parse_bool(reader, type, "remove_extra_whitespaces");
        break;
      case 5:
        spec.escape_whitespaces = parse_bool(reader, type, "escape_whitespaces");
        break;
      default:
        reader.skip(type);
    }
  }
  return spec;
}

}  // namespace

SentencePieceModel SentencePieceModel::parse(const std::string& bytes, const std::string& path) {
  SentencePieceModel model;
  WireReader reader(bytes, path, "ModelProto", 0);
  while (!reader.done()) {
    WireType type;
    const int field = reader.next_field(type);
    if (field >= 1 && field <= 5 && field != 4)
      reader.expect(type, WireType::kLengthDelimited, "ModelProto message");
    switch (field) {
      case 1:
        model.pieces.push_back(parse_piece(nested(reader, path, "ModelProto.pieces")));
        break;
      case 2:
        parse_trainer_spec(nested(reader, path, "trainer_spec"), model);
        break;
      case 3:
        model.normalizer = parse_normalizer_spec(nested(reader, path, "normalizer_spec"));
        break;
      case 5: {
        const auto spec = parse_normalizer_spec(nested(reader, path, "denormalizer_spec"));
        model.has_denormalizer = !spec.precompiled_charsmap.empty();
        break;
      }
      default:
        reader.skip(type);
    }
  }
  if (model.pieces.empty())
    throw InputError(path + ": not a SentencePiece model: it has no pieces");
  return model;
}

SentencePieceModel SentencePieceModel::load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot open SentencePiece model");
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) throw InputError(path + ": read error");
  return parse(buffer.str(), path);
}

}  // namespace rlhf::tokenizer
