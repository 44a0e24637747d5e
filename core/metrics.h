// The metrics sink: one JSON object per line appended to <run_dir>/metrics.jsonl and
// flushed after each record, so a crash loses at most the record being written.
#pragma once

#include <cstdint>
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

// For --resume after step `step`: rewrites the metrics file at `path` without the records
// of later steps (they are logged again as the job repeats those steps), so every step
// appears once. Records without a "step" are kept. Written to a temporary name and renamed,
// so a crash leaves the old file whole. Returns how many records were dropped (0 when the
// file does not exist). Throws RuntimeError on I/O failure.
int64_t drop_records_after(const std::string& path, int64_t step);

}  // namespace rlhf
