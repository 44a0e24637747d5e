// HF tokenizer.json normalizers: NFC, NFD, NFKC, NFKD, Lowercase, Prepend, Replace, Strip and
// Sequence of them. Any other type is an InputError naming it. No offset tracking.
#pragma once

#include <functional>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace rlhf::tokenizer {

class Normalizer {
 public:
  // From tokenizer.json's "normalizer" (null: the identity). `where` names the file.
  Normalizer(const nlohmann::json& spec, const std::string& where);
  std::string operator()(std::string text) const;
  bool empty() const { return steps_.empty(); }

 private:
  void add(const nlohmann::json& spec, const std::string& where);
  std::vector<std::function<std::string(std::string)>> steps_;
};

}  // namespace rlhf::tokenizer
