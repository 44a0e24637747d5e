// Sharded checkpoint save (temporary directory, commit by rename), load, rotation.
#include "engine/checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>

#include "core/errors.h"
#include "engine/sharded_unit.h"
#include "models/expert_parallel.h"
#include "models/safetensors.h"

namespace rlhf::engine {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kFormat = "rlhf-sharded-checkpoint";
constexpr int kVersion = 1;

std::string rank_file(int rank) {
  char name[64];
  std::snprintf(name, sizeof(name), "rank_%05d.safetensors", rank);
  return name;
}

// fsync a file or directory so a rename after it cannot expose unwritten data.
void fsync_path(const fs::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw RuntimeError("checkpoint: cannot open " + path.string() + " to sync");
  int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw RuntimeError("checkpoint: fsync failed for " + path.string());
}

// Rank 0's random suffix, the same on every rank.
std::string shared_suffix(transport::CollectiveGroup& group) {
  auto value = torch::zeros({1}, torch::kLong);
  if (group.rank() == 0) value[0] = static_cast<int64_t>(std::random_device{}() & 0x7fffffff);
  group.broadcast(value, 0);
  char text[16];
  std::snprintf(text, sizeof(text), "%08llx",
                static_cast<unsigned long long>(value[0].item<int64_t>()));
  return text;
}

json layout_of(const std::vector<std::unique_ptr<ShardedUnit>>& units) {
  json out = json::array();
  for (const auto& unit : units) {
    json params = json::array();
    // An expert unit's names by local index: every EP rank's shard file has the same layout,
    // and another expert_parallel_size (other unit sizes) does not match.
    for (const auto& slot : unit->slots())
      params.push_back(
          {{"name", unit->expert_count() == 0
                        ? slot.name
                        : models::with_expert_index(
                              slot.name, models::expert_index(slot.name) - unit->expert_first())},
           {"shape", slot.shape}});
    out.push_back({{"name", unit->name()}, {"numel", unit->numel()}, {"params", params}});
  }
  return out;
}

std::optional<json> read_manifest(const fs::path& dir) {
  std::ifstream in(dir / kManifestName);
  if (!in) return std::nullopt;
  json manifest = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (manifest.is_discarded() || !manifest.is_object() || manifest.value("format", "") != kFormat) {
    return std::nullopt;
  }
  return manifest;
}

// Keeps the newest `max_num` complete checkpoints beside `dir` and drops stale temporaries.
void rotate(const fs::path& dir, int max_num) {
  const fs::path root = dir.parent_path().empty() ? fs::path(".") : dir.parent_path();
  std::vector<std::pair<int64_t, fs::path>> complete;
  std::vector<fs::path> stale;
  for (const auto& entry : fs::directory_iterator(root)) {
    if (!entry.is_directory()) continue;
    const std::string name = entry.path().filename().string();
    if (name.find(".tmp-") != std::string::npos || name.find(".old-") != std::string::npos) {
      stale.push_back(entry.path());  // an interrupted save; ours was renamed already
    } else if (auto manifest = read_manifest(entry.path())) {
      complete.emplace_back((*manifest)["step"].get<int64_t>(), entry.path());
    }
  }
  for (const auto& path : stale) fs::remove_all(path);
  if (max_num <= 0 || static_cast<int>(complete.size()) <= max_num) return;
  std::sort(complete.begin(), complete.end());
  for (size_t i = 0; i + max_num < complete.size(); ++i) {
    if (complete[i].second != dir) fs::remove_all(complete[i].second);
  }
}

// Rank 0's part of the commit: manifest, then the rename.
void commit(const fs::path& tmp, const fs::path& dir, const json& manifest,
            const std::string& suffix) {
  {
    std::ofstream out(tmp / kManifestName);
    out << manifest.dump(1);
    out.close();
    if (!out) throw RuntimeError("checkpoint: cannot write " + (tmp / kManifestName).string());
  }
  fsync_path(tmp / kManifestName);
  fsync_path(tmp);
  std::error_code ec;
  const fs::path old = dir.string() + ".old-" + suffix;
  if (fs::exists(dir)) fs::rename(dir, old, ec);  // re-saving the same step
  if (ec) throw RuntimeError("checkpoint: cannot move aside " + dir.string() + ": " + ec.message());
  fs::rename(tmp, dir, ec);
  if (ec)
    throw RuntimeError("checkpoint: cannot rename " + tmp.string() + " to " + dir.string() + ": " +
                       ec.message());
  fsync_path(dir.parent_path().empty() ? fs::path(".") : dir.parent_path());
  fs::remove_all(old, ec);
}

}  // namespace

void save_sharded_checkpoint(const std::string& dir_name,
                             const std::vector<std::unique_ptr<ShardedUnit>>& units, int64_t step,
                             int zero_stage, transport::CollectiveGroup& group,
                             const CheckpointOptions& options) {
  const fs::path dir = fs::absolute(fs::path(dir_name)).lexically_normal();
  const std::string suffix = shared_suffix(group);
  const fs::path tmp = dir.string() + ".tmp-" + suffix;
  std::error_code ec;
  fs::create_directories(tmp, ec);
  if (ec) throw RuntimeError("checkpoint: cannot create " + tmp.string() + ": " + ec.message());

  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (size_t u = 0; u < units.size(); ++u) {
    const std::string prefix = "units." + std::to_string(u) + ".";
    tensors.emplace_back(prefix + "master", units[u]->master().to(torch::kCPU));
    if (!options.save_only_model) {
      tensors.emplace_back(prefix + "exp_avg", units[u]->exp_avg().to(torch::kCPU));
      tensors.emplace_back(prefix + "exp_avg_sq", units[u]->exp_avg_sq().to(torch::kCPU));
    }
  }
  {
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(generator.mutex());
    tensors.emplace_back("rng.cpu", generator.get_state());
  }
  std::vector<models::TensorInfo> layout;
  for (const auto& [name, t] : tensors)
    layout.push_back({name, t.scalar_type(), t.sizes().vec(), 0, 0});
  models::SafetensorsWriter writer((tmp / rank_file(group.rank())).string(), layout,
                                   {{"format", "pt"}, {"step", std::to_string(step)}});
  for (const auto& [name, t] : tensors) writer.write(name, t);
  writer.finish();  // fsync + rename inside the temporary directory
  if (options.before_commit) options.before_commit();
  group.barrier();  // every rank's shard is on disk

  if (group.rank() == 0) {
    json manifest = {{"format", kFormat},
                     {"version", kVersion},
                     {"step", step},
                     {"world_size", group.size()},
                     {"zero_stage", zero_stage},
                     {"save_only_model", options.save_only_model},
                     {"units", layout_of(units)}};
    if (!options.trainer_state.is_null()) manifest["trainer_state"] = options.trainer_state;
    commit(tmp, dir, manifest, suffix);
    rotate(dir, options.max_num);
  }
  group.barrier();  // committed before any rank goes on
}

int64_t load_sharded_checkpoint(const std::string& dir_name,
                                const std::vector<std::unique_ptr<ShardedUnit>>& units,
                                transport::CollectiveGroup& group, json* trainer_state) {
  const fs::path dir(dir_name);
  const std::string manifest_path = (dir / kManifestName).string();
  auto manifest = read_manifest(dir);
  if (!manifest)
    throw InputError("checkpoint: " + manifest_path +
                     ": missing or not an rlhf checkpoint manifest");
  const int world = manifest->value("world_size", -1);
  if (world != group.size()) {
    throw InputError("checkpoint: " + manifest_path + ": saved by " + std::to_string(world) +
                     " ranks, this group has " + std::to_string(group.size()) +
                     " (resharding is not supported; use an HF export)");
  }
  if ((*manifest)["units"] != layout_of(units)) {
    throw InputError("checkpoint: " + manifest_path +
                     ": the model's parameter layout differs from the checkpoint's");
  }
  const bool model_only = manifest->value("save_only_model", false);
  models::SafetensorsFile file((dir / rank_file(group.rank())).string());
  torch::NoGradGuard no_grad;
  for (size_t u = 0; u < units.size(); ++u) {
    const std::string prefix = "units." + std::to_string(u) + ".";
    auto load = [&](const std::string& name, torch::Tensor& into) {
      auto t = file.view(prefix + name);
      if (t.sizes() != into.sizes() || t.scalar_type() != torch::kFloat) {
        throw InputError("checkpoint: " + file.path() + ": " + prefix + name + " has shape " +
                         c10::str(t.sizes()) + ", expected " + c10::str(into.sizes()) + " FP32");
      }
      into.copy_(t);
    };
    load("master", units[u]->master());
    if (model_only) {
      units[u]->exp_avg().zero_();
      units[u]->exp_avg_sq().zero_();
    } else {
      load("exp_avg", units[u]->exp_avg());
      load("exp_avg_sq", units[u]->exp_avg_sq());
    }
    units[u]->zero_grads();
  }
  at::Generator generator = at::detail::getDefaultCPUGenerator();  // a handle to the global one
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(file.view("rng.cpu").clone());
  if (trainer_state) *trainer_state = manifest->value("trainer_state", json());
  return manifest->value("step", int64_t{0});
}

std::optional<std::string> latest_checkpoint(const std::string& root) {
  std::optional<std::pair<int64_t, std::string>> best;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    if (!entry.is_directory()) continue;
    auto manifest = read_manifest(entry.path());
    if (!manifest) continue;
    const int64_t step = (*manifest)["step"].get<int64_t>();
    if (!best || step > best->first) best = {step, entry.path().string()};
  }
  if (!best) return std::nullopt;
  return best->second;
}

}  // namespace rlhf::engine
