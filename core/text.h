// Small string helpers shared by the spec, the CLI and error messages.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace rlhf {

// Edit distance (insert, delete, substitute each cost 1); used for "did you mean" hints.
size_t edit_distance(std::string_view a, std::string_view b);

// The candidate closest to `word`, or "" when none is within a useful distance.
std::string closest_match(std::string_view word, const std::vector<std::string>& candidates);

std::vector<std::string> split(std::string_view s, char sep);
// A comma-separated list of names: "q_proj, v_proj" -> {"q_proj", "v_proj"} (spaces dropped,
// empty entries skipped).
std::vector<std::string> split_names(std::string_view s);
std::string join(const std::vector<std::string>& parts, std::string_view sep);
std::string trim(std::string_view s);
// Whether `s` ends with `suffix` (std::string::ends_with is C++20).
bool ends_with(std::string_view s, std::string_view suffix);

// 1-based line and column of a byte offset in `text`.
struct LineCol {
  size_t line;
  size_t column;
};
LineCol line_col(std::string_view text, size_t offset);

// Human-readable bytes: "512 B", "1.5 KiB", "3.00 GiB".
std::string format_bytes(double bytes);

}  // namespace rlhf
