#include "report/metrics.h"

#include <filesystem>

#include "core/errors.h"
#include "report/tensorboard.h"

namespace rlhf::report {

MetricsSink::MetricsSink(const std::string& path, bool tensorboard) : path_(path) {
  auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  out_.open(path, std::ios::app);
  if (!out_) throw RuntimeError("cannot open metrics file " + path);
  if (tensorboard) events_ = std::make_unique<EventWriter>((parent / "tensorboard").string());
}

MetricsSink::~MetricsSink() = default;

void MetricsSink::write(const nlohmann::json& record) {
  out_ << record.dump() << '\n';
  out_.flush();
  if (!out_) throw RuntimeError("cannot write metrics file " + path_);
  if (!events_ || !record.value("step", nlohmann::json()).is_number_integer()) return;
  const int64_t step = record["step"].get<int64_t>();
  const std::string split = record.value("split", nlohmann::json()).is_string()
                                ? record["split"].get<std::string>() + "/"
                                : std::string();
  for (const auto& [tag, value] : scalar_metrics(record)) events_->scalar(split + tag, value, step);
  for (const auto& [tag, counts] : histogram_metrics(record))
    events_->histogram(split + tag, counts, step);
  events_->flush();
}

void MetricsSink::samples(int64_t step, const nlohmann::json& rows) {
  if (!samples_.is_open()) {
    const auto file = std::filesystem::path(path_).parent_path() / "samples.jsonl";
    samples_.open(file, std::ios::app);
    if (!samples_) throw RuntimeError("cannot open " + file.string());
  }
  // A markdown table: TensorBoard's text dashboard renders it.
  auto cell = [](std::string s) {
    std::string out;
    for (char c : s)
      out += c == '|' ? std::string("\\|") : c == '\n' ? std::string(" ") : std::string(1, c);
    return out;
  };
  std::string table = "| prompt | response | reward |\n| --- | --- | --- |\n";
  for (const auto& row : rows) {
    nlohmann::json line = row;
    line["step"] = step;
    // Generated text need not be valid UTF-8 (a young policy emits any byte): replace it.
    samples_ << line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
    table += "| " + cell(row.value("prompt", "")) + " | " + cell(row.value("response", "")) +
             " | " + (row.contains("reward") ? row["reward"].dump() : std::string()) + " |\n";
  }
  samples_.flush();
  if (!samples_) throw RuntimeError("cannot write samples.jsonl beside " + path_);
  if (events_) {
    events_->text("samples", table, step);
    events_->flush();
  }
}

int64_t drop_records_after(const std::string& path, int64_t step) {
  std::ifstream in(path);
  if (!in) return 0;
  std::string kept, line;
  int64_t dropped = 0;
  while (std::getline(in, line)) {
    const auto record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (record.is_object() && record.value("step", nlohmann::json()).is_number_integer() &&
        record["step"].get<int64_t>() > step) {
      ++dropped;
      continue;
    }
    kept += line + '\n';
  }
  if (dropped == 0) return 0;
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << kept;
    out.flush();
    if (!out) throw RuntimeError("cannot write " + tmp);
  }
  std::filesystem::rename(tmp, path);
  return dropped;
}

}  // namespace rlhf::report
