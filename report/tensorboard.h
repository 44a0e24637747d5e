// TensorBoard event files written by our own code: TFRecord framing (length, masked CRC-32C
// of the length, the record, masked CRC-32C of the record) around tensorflow.Event protobuf
// messages encoded by hand: scalars as simple_value, text as a string tensor with the text
// plugin's metadata. No TensorFlow or protobuf library; TensorBoard reads the files as its own.
#pragma once

#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace rlhf::report {

class EventWriter {
 public:
  // Creates <dir>/events.out.tfevents.<seconds>.<host>.<pid> (a new file per run, as
  // TensorBoard expects) and writes its file_version record. Throws RuntimeError.
  explicit EventWriter(const std::string& dir);
  void scalar(const std::string& tag, double value, int64_t step);
  // A histogram of integer values: counts[i] values equal to i (buckets [i - 0.5, i + 0.5)).
  void histogram(const std::string& tag, const std::vector<double>& counts, int64_t step);
  // `markdown` shown by TensorBoard's text dashboard.
  void text(const std::string& tag, const std::string& markdown, int64_t step);
  // A SessionLog START event at `step`: TensorBoard (purge_orphaned_data, on by default)
  // then drops the events read before it with a step >= `step`, as for a TensorFlow job
  // restarted from a checkpoint; its server's reader does so from a run's second START on.
  // (TensorBoard's Rust data server needs no marker: a point at step s drops its series'
  // points at steps >= s.)
  void session_start(int64_t step);
  // Writes buffered records to the file (each metrics record ends with one).
  void flush();
  const std::string& path() const { return path_; }

 private:
  void write_event(const std::string& event);

  std::string path_;
  std::ofstream out_;
};

// For --resume after step `step`: when `dir` holds event files of earlier runs, adds a new
// event file there that starts a session at step + 1, so the steps after `step` that the
// resumed run logs again replace the earlier ones instead of appearing twice (as
// drop_records_after does for metrics.jsonl). Returns whether it wrote one. Throws
// RuntimeError.
bool mark_resumed_after(const std::string& dir, int64_t step);

// Every number of a metrics record as (tag, value): nested objects joined with '/'
// ("time_s/generate", "memory/actor/0/peak_rss_bytes"); "step" itself, strings, histograms
// and a "timeline" (intervals the HTML report draws as lanes) left out.
std::vector<std::pair<std::string, double>> scalar_metrics(const nlohmann::json& record);
// The record's histograms as (tag, counts): an array under a key named "histogram" (counts of
// the values 0, 1, 2, ...), tagged by its parent ("staleness/histogram" -> "staleness").
std::vector<std::pair<std::string, std::vector<double>>> histogram_metrics(
    const nlohmann::json& record);

// CRC-32C (Castagnoli) of `data`, and TFRecord's masked form of it.
uint32_t crc32c(const std::string& data);
uint32_t masked_crc32c(const std::string& data);

}  // namespace rlhf::report
