// Plain-text tables with aligned columns, for `rlhf plan` and friends. A table wider than
// the terminal wraps its widest columns' cells, and drops columns from the right (saying so)
// only when wrapping cannot make it fit.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace rlhf::cli {

// The width to fit tables to: $COLUMNS when set to a number, else the terminal's width when
// stdout is one, else 0 (no limit: piped output keeps whole lines).
size_t terminal_columns();

class TextTable {
 public:
  explicit TextTable(std::vector<std::string> header) : header_(std::move(header)) {}
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  // Columns padded to their widest cell, two spaces apart; a dashed rule under the header;
  // fitted to terminal_columns().
  std::string str() const { return str(terminal_columns()); }
  // The same fitted to `max_width` columns (0: no limit).
  std::string str(size_t max_width) const;

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

}  // namespace rlhf::cli
