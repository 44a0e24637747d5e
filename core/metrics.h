// The metrics sink: one JSON object per line appended to <run_dir>/metrics.jsonl and
// flushed after each record, so a crash loses at most the record being written.
#pragma once

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace rlhf {

class MetricsSink {
 public:
  // Opens `path` for appending (creating its directory). Throws RuntimeError on failure.
  explicit MetricsSink(const std::string& path);
  void write(const nlohmann::json& record);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::ofstream out_;
};

}  // namespace rlhf
