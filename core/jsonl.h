// Reading JSONL datasets line by line, with the bad-line policy of the job spec: a bad line
// is fatal (InputError naming file:line and what was expected) or skipped and counted.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

namespace rlhf {

enum class BadLinePolicy { kFatal, kSkip };
// "fatal" | "skip" (data.bad_lines).
BadLinePolicy parse_bad_line_policy(const std::string& name);

struct JsonlStats {
  int64_t rows = 0;           // lines handed to the callback and accepted
  int64_t skipped = 0;        // bad lines skipped (kSkip only)
  std::string first_problem;  // "file:line: ..." of the first skipped line
};

// Calls `row(value, line_number)` for each non-blank line. `row` throws InputError for a
// line whose content is wrong (missing key, wrong type); malformed JSON is detected here.
// Either is fatal (rethrown as "file:line: message") or skipped, as `policy` says.
// Stops after `max_rows` accepted rows when max_rows > 0. Throws InputError when the file
// cannot be read.
JsonlStats read_jsonl(const std::string& path, BadLinePolicy policy, int64_t max_rows,
                      const std::function<void(const nlohmann::json&, int64_t)>& row);

// The string at `key` of a JSONL row; throws InputError("expected a string at key ...").
std::string string_field(const nlohmann::json& row, const std::string& key);

}  // namespace rlhf
