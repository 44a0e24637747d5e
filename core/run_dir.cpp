#include "core/run_dir.h"

#include <filesystem>

namespace rlhf {

namespace fs = std::filesystem;

std::string run_directory(const JobSpec& spec) {
  return (fs::path(spec.get_string("logger.run_dir")) / spec.get_string("name")).string();
}

std::string checkpoint_directory(const JobSpec& spec) {
  const std::string path = spec.get_string("ckpt.path");
  return path.empty() ? (fs::path(run_directory(spec)) / "ckpt").string() : path;
}

std::optional<std::string> set_aside_previous_run(const JobSpec& spec) {
  const fs::path run_dir = run_directory(spec);
  const fs::path ckpt = checkpoint_directory(spec);
  const fs::path metrics = run_dir / "metrics.jsonl", plan = run_dir / "plan.json";
  if (!fs::exists(metrics) && !fs::exists(ckpt)) return std::nullopt;
  int k = 1;
  while (fs::exists(run_dir / ("previous-" + std::to_string(k)))) ++k;
  const fs::path keep = run_dir / ("previous-" + std::to_string(k));
  fs::create_directories(keep);
  if (fs::exists(metrics)) fs::rename(metrics, keep / "metrics.jsonl");
  if (fs::exists(plan)) fs::rename(plan, keep / "plan.json");
  if (fs::exists(ckpt)) fs::rename(ckpt, keep / "ckpt");
  return keep.string();
}

}  // namespace rlhf
