#include "report/tensorboard.h"

#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "core/errors.h"
#include "core/host.h"

namespace rlhf::report {
namespace {

// Protobuf wire format: a field's key is (number << 3) | wire type.
enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out += static_cast<char>((v & 0x7f) | 0x80);
    v >>= 7;
  }
  out += static_cast<char>(v);
}
void key(std::string& out, uint32_t field, WireType type) {
  varint(out, (field << 3) | type);
}
void bytes_field(std::string& out, uint32_t field, const std::string& value) {
  key(out, field, kLengthDelimited);
  varint(out, value.size());
  out += value;
}
template <typename T>
void fixed_field(std::string& out, uint32_t field, T value) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8);
  key(out, field, sizeof(T) == 8 ? kFixed64 : kFixed32);
  char raw[sizeof(T)];
  std::memcpy(raw, &value, sizeof(T));  // little-endian on every machine we build for
  out.append(raw, sizeof(T));
}

// tensorflow.Event: wall_time = 1 (double), step = 2 (int64), then one of file_version = 3
// (string), summary = 5 (tensorflow.Summary), session_log = 7 (tensorflow.SessionLog).
enum EventField : uint32_t { kFileVersion = 3, kSummary = 5, kSessionLog = 7 };
std::string event(int64_t step, EventField field, const std::string& payload) {
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::string e;
  fixed_field(e, 1, now);
  key(e, 2, kVarint);
  varint(e, static_cast<uint64_t>(step));
  bytes_field(e, field, payload);
  return e;
}

void flatten(const nlohmann::json& j, const std::string& prefix,
             std::vector<std::pair<std::string, double>>& out) {
  if (j.is_number()) {
    out.push_back({prefix, j.get<double>()});
  } else if (j.is_boolean()) {
    out.push_back({prefix, j.get<bool>() ? 1.0 : 0.0});
  } else if (j.is_object()) {
    for (const auto& [k, v] : j.items()) flatten(v, prefix.empty() ? k : prefix + "/" + k, out);
  } else if (j.is_array()) {
    for (size_t i = 0; i < j.size(); ++i) flatten(j[i], prefix + "/" + std::to_string(i), out);
  }
}

constexpr const char* kHistogramKey = "histogram";
constexpr const char* kTimelineKey = "timeline";  // intervals for the report's lanes

// Every number but those under a "histogram" key (histogram_metrics reads them) or a
// "timeline" key (intervals, not series).
void flatten_scalars(const nlohmann::json& j, const std::string& prefix,
                     std::vector<std::pair<std::string, double>>& out) {
  if (!j.is_object()) return flatten(j, prefix, out);
  for (const auto& [k, v] : j.items())
    if (k != kHistogramKey && k != kTimelineKey)
      flatten_scalars(v, prefix.empty() ? k : prefix + "/" + k, out);
}

void find_histograms(const nlohmann::json& j, const std::string& prefix,
                     std::vector<std::pair<std::string, std::vector<double>>>& out) {
  if (!j.is_object()) return;
  for (const auto& [k, v] : j.items()) {
    if (k == kHistogramKey && v.is_array()) {
      std::vector<double> counts;
      for (const auto& c : v) counts.push_back(c.is_number() ? c.get<double>() : 0.0);
      out.emplace_back(prefix, std::move(counts));
    } else {
      find_histograms(v, prefix.empty() ? k : prefix + "/" + k, out);
    }
  }
}

// A length-delimited field of packed doubles.
void packed_doubles(std::string& out, uint32_t field, const std::vector<double>& values) {
  std::string raw(values.size() * sizeof(double), '\0');
  if (!values.empty()) std::memcpy(raw.data(), values.data(), raw.size());
  bytes_field(out, field, raw);
}

}  // namespace

uint32_t crc32c(const std::string& data) {
  static const std::array<uint32_t, 256> kTable = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0x82f63b78u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  uint32_t crc = 0xffffffffu;
  for (unsigned char ch : data) crc = kTable[(crc ^ ch) & 0xff] ^ (crc >> 8);
  return crc ^ 0xffffffffu;
}

uint32_t masked_crc32c(const std::string& data) {
  const uint32_t crc = crc32c(data);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

EventWriter::EventWriter(const std::string& dir) {
  std::filesystem::create_directories(dir);
  const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count();
  path_ = (std::filesystem::path(dir) /
           ("events.out.tfevents." + std::to_string(seconds) + "." +
            host_name().value_or("localhost") + "." + std::to_string(::getpid())))
              .string();
  out_.open(path_, std::ios::binary | std::ios::app);
  if (!out_) throw RuntimeError("cannot create TensorBoard event file " + path_);
  // Version 2 makes TensorBoard's EventAccumulator honour SessionLog START (session_start).
  write_event(event(0, kFileVersion, "brain.Event:2"));
  flush();
}

void EventWriter::write_event(const std::string& record) {
  // TFRecord: uint64 length, masked crc of the length, data, masked crc of the data.
  std::string length(8, '\0');
  const uint64_t n = record.size();
  std::memcpy(length.data(), &n, 8);
  const uint32_t length_crc = masked_crc32c(length), data_crc = masked_crc32c(record);
  out_.write(length.data(), 8);
  out_.write(reinterpret_cast<const char*>(&length_crc), 4);
  out_.write(record.data(), static_cast<std::streamsize>(record.size()));
  out_.write(reinterpret_cast<const char*>(&data_crc), 4);
  if (!out_) throw RuntimeError("cannot write TensorBoard event file " + path_);
}

void EventWriter::scalar(const std::string& tag, double value, int64_t step) {
  // Summary.Value: tag = 1, simple_value = 2 (float).
  std::string v;
  bytes_field(v, 1, tag);
  fixed_field(v, 2, static_cast<float>(value));
  std::string summary;
  bytes_field(summary, 1, v);  // Summary.value = 1 (repeated)
  write_event(event(step, kSummary, summary));
}

void EventWriter::histogram(const std::string& tag, const std::vector<double>& counts,
                            int64_t step) {
  // HistogramProto: min = 1, max = 2, num = 3, sum = 4, sum_squares = 5 (doubles),
  // bucket_limit = 6 and bucket = 7 (packed doubles; bucket i counts values below its limit
  // and at or above the previous one).
  double num = 0, sum = 0, squares = 0, lo = 0, hi = 0;
  bool any = false;
  std::vector<double> limits;
  for (size_t i = 0; i < counts.size(); ++i) {
    const auto x = static_cast<double>(i);
    limits.push_back(x + 0.5);
    if (counts[i] <= 0) continue;
    num += counts[i];
    sum += counts[i] * x;
    squares += counts[i] * x * x;
    hi = x;
    if (!any) lo = x;
    any = true;
  }
  std::string h;
  fixed_field(h, 1, lo);
  fixed_field(h, 2, hi);
  fixed_field(h, 3, num);
  fixed_field(h, 4, sum);
  fixed_field(h, 5, squares);
  packed_doubles(h, 6, limits);
  packed_doubles(h, 7, counts);
  // Summary.Value: tag = 1, histo = 5.
  std::string v;
  bytes_field(v, 1, tag);
  bytes_field(v, 5, h);
  std::string summary;
  bytes_field(summary, 1, v);
  write_event(event(step, kSummary, summary));
}

void EventWriter::text(const std::string& tag, const std::string& markdown, int64_t step) {
  // TensorProto: dtype = 1 (DT_STRING = 7), tensor_shape = 2 (a scalar: empty), string_val = 8.
  std::string tensor;
  key(tensor, 1, kVarint);
  varint(tensor, 7);
  bytes_field(tensor, 2, "");
  bytes_field(tensor, 8, markdown);
  // SummaryMetadata.plugin_data = 1 { plugin_name = 1: "text" }.
  std::string plugin, metadata;
  bytes_field(plugin, 1, "text");
  bytes_field(metadata, 1, plugin);
  // Summary.Value: tag = 1, tensor = 8, metadata = 9.
  std::string v;
  bytes_field(v, 1, tag);
  bytes_field(v, 8, tensor);
  bytes_field(v, 9, metadata);
  std::string summary;
  bytes_field(summary, 1, v);
  write_event(event(step, kSummary, summary));
}

void EventWriter::session_start(int64_t step) {
  // SessionLog: status = 1 (enum; START = 1).
  std::string log;
  key(log, 1, kVarint);
  varint(log, 1);
  write_event(event(step, kSessionLog, log));
}

void EventWriter::flush() {
  out_.flush();
  if (!out_) throw RuntimeError("cannot write TensorBoard event file " + path_);
}

bool mark_resumed_after(const std::string& dir, int64_t step) {
  std::error_code ec;
  bool earlier = false;
  for (const auto& f : std::filesystem::directory_iterator(dir, ec))
    earlier = earlier || f.path().filename().string().find("tfevents") != std::string::npos;
  if (!earlier) return false;
  EventWriter marker(dir);
  // TensorBoard keeps the events of steps below a START's step: step + 1 keeps `step`'s own.
  // Twice: the server's reader (plugin_event_accumulator) takes a run's first START as its
  // beginning, not a restart, and our writers write none; EventAccumulator purges at each.
  marker.session_start(step + 1);
  marker.session_start(step + 1);
  marker.flush();
  return true;
}

std::vector<std::pair<std::string, double>> scalar_metrics(const nlohmann::json& record) {
  std::vector<std::pair<std::string, double>> out;
  for (const auto& [k, v] : record.items())
    if (k != "step" && k != kTimelineKey) flatten_scalars(v, k, out);
  return out;
}

std::vector<std::pair<std::string, std::vector<double>>> histogram_metrics(
    const nlohmann::json& record) {
  std::vector<std::pair<std::string, std::vector<double>>> out;
  find_histograms(record, "", out);
  return out;
}

}  // namespace rlhf::report
