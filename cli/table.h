// Plain-text tables with aligned columns, for `rlhf plan` and friends.
#pragma once

#include <string>
#include <vector>

namespace rlhf::cli {

class TextTable {
 public:
  explicit TextTable(std::vector<std::string> header) : header_(std::move(header)) {}
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  // Columns padded to their widest cell, two spaces apart; a dashed rule under the header.
  std::string str() const;

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

}  // namespace rlhf::cli
