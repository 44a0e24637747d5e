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
  const fs::path metrics = run_dir / "metrics.jsonl", plan = run_dir / "plan.json",
                 exported = run_dir / "export", samples = run_dir / "samples.jsonl",
                 events = run_dir / "tensorboard";
  if (!fs::exists(metrics) && !fs::exists(ckpt) && !fs::exists(exported)) return std::nullopt;
  int k = 1;
  while (fs::exists(run_dir / ("previous-" + std::to_string(k)))) ++k;
  const std::string suffix = "previous-" + std::to_string(k);
  const fs::path keep = run_dir / suffix;
  fs::create_directories(keep);
  for (const fs::path& p : {metrics, plan, exported, samples, events})
    if (fs::exists(p)) fs::rename(p, keep / p.filename());
  if (fs::exists(ckpt)) {
    // A checkpoint directory inside the run directory moves with the rest; one elsewhere
    // (ckpt.path, perhaps another filesystem) is renamed beside itself: <ckpt>-previous-K.
    const auto relative = fs::relative(fs::weakly_canonical(ckpt), fs::weakly_canonical(run_dir));
    const bool inside = !relative.empty() && *relative.begin() != "..";
    fs::rename(ckpt, inside ? keep / "ckpt" : fs::path(ckpt.string() + "-" + suffix));
  }
  return keep.string();
}

}  // namespace rlhf
