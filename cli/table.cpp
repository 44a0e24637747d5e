#include "cli/table.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <numeric>
#include <sstream>

namespace rlhf::cli {
namespace {

constexpr size_t kGap = 2;       // spaces between columns
constexpr size_t kMinWidth = 8;  // a column is not wrapped narrower than this

// `text` in lines of at most `width` characters, broken at spaces where possible.
std::vector<std::string> wrap(const std::string& text, size_t width) {
  std::vector<std::string> lines;
  std::string rest = text;
  while (rest.size() > width) {
    size_t cut = rest.rfind(' ', width);
    if (cut == std::string::npos || cut == 0) {
      lines.push_back(rest.substr(0, width));
      rest = rest.substr(width);
    } else {
      lines.push_back(rest.substr(0, cut));
      rest = rest.substr(cut + 1);
    }
  }
  lines.push_back(rest);
  return lines;
}

size_t total_width(const std::vector<size_t>& width) {
  if (width.empty()) return 0;
  return std::accumulate(width.begin(), width.end(), size_t{0}) + kGap * (width.size() - 1);
}

}  // namespace

size_t terminal_columns() {
  if (const char* env = std::getenv("COLUMNS")) {
    char* end = nullptr;
    const long v = std::strtol(env, &end, 10);
    if (end != env && *end == '\0' && v > 0) return static_cast<size_t>(v);
  }
  winsize ws{};
  if (::isatty(STDOUT_FILENO) && ::ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0)
    return ws.ws_col;
  return 0;
}

std::string TextTable::str(size_t max_width) const {
  std::vector<size_t> width(header_.size(), 0);
  auto measure = [&](const std::vector<std::string>& row) {
    for (size_t i = 0; i < row.size() && i < width.size(); ++i)
      width[i] = std::max(width[i], row[i].size());
  };
  measure(header_);
  for (const auto& r : rows_) measure(r);
  // Narrow the widest column until the table fits; drop columns from the right when no
  // column can be narrowed further.
  size_t shown = width.size();
  while (max_width > 0 && shown > 1 &&
         total_width({width.begin(), width.begin() + shown}) > max_width) {
    const size_t over = total_width({width.begin(), width.begin() + shown}) - max_width;
    const auto widest = std::max_element(width.begin(), width.begin() + shown);
    if (*widest > kMinWidth)
      *widest = std::max(kMinWidth, *widest > over ? *widest - over : kMinWidth);
    else
      --shown;
  }
  std::ostringstream out;
  auto print = [&](const std::vector<std::string>& row) {
    std::vector<std::vector<std::string>> cells;
    size_t height = 1;
    for (size_t i = 0; i < shown; ++i) {
      cells.push_back(wrap(i < row.size() ? row[i] : "", width[i]));
      height = std::max(height, cells.back().size());
    }
    for (size_t line = 0; line < height; ++line) {
      std::string text;
      for (size_t i = 0; i < shown; ++i) {
        const std::string part = line < cells[i].size() ? cells[i][line] : "";
        text += part;
        if (i + 1 < shown) text += std::string(width[i] - part.size() + kGap, ' ');
      }
      text.erase(text.find_last_not_of(' ') + 1);
      out << text << '\n';
    }
  };
  print(header_);
  std::vector<std::string> rule;
  for (size_t i = 0; i < shown; ++i) rule.push_back(std::string(width[i], '-'));
  print(rule);
  for (const auto& r : rows_) print(r);
  if (shown < header_.size()) {
    std::vector<std::string> hidden(header_.begin() + static_cast<long>(shown), header_.end());
    std::string names;
    for (const auto& h : hidden) names += (names.empty() ? "" : ", ") + h;
    out << "(" << hidden.size() << (hidden.size() == 1 ? " column" : " columns")
        << " not shown for a " << max_width << "-column terminal: " << names
        << "; widen it, or set COLUMNS)\n";
  }
  return out.str();
}

}  // namespace rlhf::cli
