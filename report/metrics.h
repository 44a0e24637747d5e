// The metrics sink: one JSON object per line appended to <run_dir>/metrics.jsonl and
// flushed after each record, so a crash loses at most the record being written; with
// TensorBoard on, every number of each record also goes to <run_dir>/tensorboard as a scalar
// at the record's step. Sample generations go to samples.jsonl and TensorBoard's text tab.
#pragma once

#include <cstdint>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

namespace rlhf::report {

class EventWriter;

class MetricsSink {
 public:
  // Opens `path` for appending (creating its directory); with `tensorboard`, a new event file
  // under <dir of path>/tensorboard. Throws RuntimeError on failure.
  explicit MetricsSink(const std::string& path, bool tensorboard = false);
  ~MetricsSink();
  // One record; its numbers become scalars at record["step"] (tags prefixed "eval/" for a
  // record with "split": "eval").
  void write(const nlohmann::json& record);
  // Sample generations of `step` (objects such as {"prompt", "response", "reward"}): one
  // line each in samples.jsonl beside the metrics, and a table in TensorBoard's text tab.
  void samples(int64_t step, const nlohmann::json& rows);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::ofstream out_;
  std::ofstream samples_;
  std::unique_ptr<EventWriter> events_;
};

// For --resume after step `step`: rewrites the metrics file at `path` without the records
// of later steps (they are logged again as the job repeats those steps), so every step
// appears once. Records without a "step" are kept. Written to a temporary name and renamed,
// so a crash leaves the old file whole. Returns how many records were dropped (0 when the
// file does not exist). Throws RuntimeError on I/O failure.
int64_t drop_records_after(const std::string& path, int64_t step);

}  // namespace rlhf::report
