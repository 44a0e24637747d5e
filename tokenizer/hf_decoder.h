// HF tokenizer.json decoders: ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace and
// Sequence. They turn token strings back into text; any other type is an InputError.
#pragma once

#include <functional>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace rlhf::tokenizer {

class Decoder {
 public:
  // From tokenizer.json's "decoder" (null: tokens are concatenated as they are).
  Decoder(const nlohmann::json& spec, const std::string& where);
  // The text of `tokens` (vocabulary strings, in order).
  std::string operator()(std::vector<std::string> tokens) const;

 private:
  using Step = std::function<void(std::vector<std::string>& tokens)>;
  void add(const nlohmann::json& spec, const std::string& where);
  std::vector<Step> steps_;
};

// `bytes` with every invalid UTF-8 sequence replaced by U+FFFD (as Rust from_utf8_lossy).
std::string utf8_lossy(const std::string& bytes);

}  // namespace rlhf::tokenizer
