#include "core/metrics.h"

#include <filesystem>

#include "core/errors.h"

namespace rlhf {

MetricsSink::MetricsSink(const std::string& path) : path_(path) {
  auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  out_.open(path, std::ios::app);
  if (!out_) throw RuntimeError("cannot open metrics file " + path);
}

void MetricsSink::write(const nlohmann::json& record) {
  out_ << record.dump() << '\n';
  out_.flush();
  if (!out_) throw RuntimeError("cannot write metrics file " + path_);
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

}  // namespace rlhf
