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

}  // namespace rlhf
