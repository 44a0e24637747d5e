#include "core/jsonl.h"

#include <fstream>

#include "core/errors.h"

namespace rlhf {

BadLinePolicy parse_bad_line_policy(const std::string& name) {
  if (name == "fatal") return BadLinePolicy::kFatal;
  if (name == "skip") return BadLinePolicy::kSkip;
  throw InputError("data.bad_lines: expected fatal or skip, found \"" + name + "\"");
}

JsonlStats read_jsonl(const std::string& path, BadLinePolicy policy, int64_t max_rows,
                      const std::function<void(const nlohmann::json&, int64_t)>& row) {
  std::ifstream in(path);
  if (!in) throw InputError(path + ": cannot read the dataset (does it exist?)");
  JsonlStats stats;
  std::string line;
  int64_t number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    std::string problem;
    try {
      nlohmann::json value = nlohmann::json::parse(line);
      row(value, number);
    } catch (const nlohmann::json::parse_error& e) {
      std::string what = e.what();
      if (auto pos = what.find(": "); pos != std::string::npos) what = what.substr(pos + 2);
      problem = "malformed JSON: " + what;
    } catch (const InputError& e) {
      problem = e.what();
    }
    if (!problem.empty()) {
      std::string located = path + ":" + std::to_string(number) + ": " + problem;
      if (policy == BadLinePolicy::kFatal) throw InputError(located);
      if (stats.skipped++ == 0) stats.first_problem = located;
      continue;
    }
    if (++stats.rows == max_rows && max_rows > 0) break;
  }
  if (in.bad()) throw InputError(path + ": read error after line " + std::to_string(number));
  return stats;
}

std::string string_field(const nlohmann::json& row, const std::string& key) {
  if (!row.is_object())
    throw InputError("expected a JSON object, found " + row.dump().substr(0, 40));
  auto it = row.find(key);
  if (it == row.end()) throw InputError("missing key \"" + key + "\"");
  if (!it->is_string())
    throw InputError("expected a string at key \"" + key + "\", found " + it->dump().substr(0, 40));
  return it->get<std::string>();
}

}  // namespace rlhf
