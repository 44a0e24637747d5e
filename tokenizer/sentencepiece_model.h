// Reads a SentencePiece tokenizer.model (a serialized sentencepiece.ModelProto) straight from
// the protobuf wire format: pieces with scores and types, and the trainer and normalizer
// fields that encoding and decoding need. Nothing is trained or written here.
//
// Why not libsentencepiece: Debian's library embeds protobuf 3.14 while LibTorch links
// libprotobuf 3.21, and one process cannot hold both (protobuf's version check aborts).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace rlhf::tokenizer {

// sentencepiece_model.proto, ModelProto.SentencePiece.Type.
enum class PieceType : int {
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6
};
// TrainerSpec.ModelType.
enum class SentencePieceAlgorithm : int { kUnigram = 1, kBpe = 2, kWord = 3, kChar = 4 };

struct SentencePiece {
  std::string piece;  // as the vocabulary spells it: "▁the", "<0x0A>", "<s>"
  float score = 0.0f;
  PieceType type = PieceType::kNormal;
};

// NormalizerSpec (defaults as in the .proto when a field is absent).
struct SentencePieceNormalizerSpec {
  std::string name;
  std::string precompiled_charsmap;  // Darts trie + replacement strings; empty = identity
  bool add_dummy_prefix = true;
  bool remove_extra_whitespaces = true;
  bool escape_whitespaces = true;
};

struct SentencePieceModel {
  std::vector<SentencePiece> pieces;  // index = token id
  SentencePieceAlgorithm algorithm = SentencePieceAlgorithm::kUnigram;
  bool byte_fallback = false;
  bool treat_whitespace_as_suffix = false;
  std::string unk_surface = " \xE2\x81\x87 ";  // " ⁇ ", what decode() writes for <unk>
  std::string bos_piece = "<s>", eos_piece = "</s>", pad_piece = "<pad>";
  SentencePieceNormalizerSpec normalizer;
  bool has_denormalizer = false;  // a denormalizer_spec with a charsmap (unsupported)

  // Parses `bytes` (the whole file); `path` names the file in errors. Throws InputError on
  // a truncated or malformed message, or a model without pieces.
  static SentencePieceModel parse(const std::string& bytes, const std::string& path);
  static SentencePieceModel load(const std::string& path);
};

}  // namespace rlhf::tokenizer
