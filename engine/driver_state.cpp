#include "engine/driver_state.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "core/errors.h"
#include "core/spec_schema.h"
#include "core/text.h"

namespace rlhf::engine {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kTagPrefix = "global_step";

// Keys that change where or how fast a job runs, or what it writes, never what it computes.
bool affects_trajectory(const std::string& key, bool schedule_counts_steps) {
  for (const char* prefix : {"cluster.", "scheduler.", "logger.", "ckpt.", "eval."})
    if (key.rfind(prefix, 0) == 0) return false;
  for (const char* tail :
       {".devices", ".colocate_with", ".gradient_checkpointing", ".adam_offload"})
    if (ends_with(key, tail)) return false;
  if (key == "name" || key == "train.max_tokens_per_micro_batch" ||
      key == "rollout.kv_cache_memory_gb" || key == "rollout.kv_block_size" ||
      key == "rollout.max_num_seqs" || key == "rollout.enforce_eager" ||
      key == "rollout.gpu_kernels" || key == "rollout.tensor_parallel_size" ||
      key == "reward.remote_timeout_s")
    return false;
  if (key == "train.max_steps" || key == "train.num_episodes") return schedule_counts_steps;
  return true;
}

// The driver files under <ckpt>/driver, with their steps.
std::vector<std::pair<int64_t, fs::path>> driver_files(const fs::path& dir) {
  std::vector<std::pair<int64_t, fs::path>> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& f : fs::directory_iterator(dir)) {
    const std::string name = f.path().filename().string();
    if (f.path().extension() != ".json" || name.rfind(kTagPrefix, 0) != 0) continue;
    try {
      out.push_back({std::stoll(name.substr(std::string(kTagPrefix).size())), f.path()});
    } catch (const std::exception&) {
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

Role checkpointed_role(const JobSpec& spec) {
  return spec.kind() == JobKind::kRm ? Role::kReward : Role::kActor;
}

json trajectory_settings(const JobSpec& spec) {
  bool schedule_counts_steps = false;
  for (Role r : spec.used_roles()) {
    if (!spec.trains(r)) continue;
    const std::string role = role_name(r);
    schedule_counts_steps |= spec.get_string(role + ".lr_scheduler") != "constant" ||
                             spec.get_float(role + ".lr_warmup_ratio") > 0;
  }
  json out = json::object();
  for (const auto& key : spec_keys()) {
    if (!affects_trajectory(key.path, schedule_counts_steps)) continue;
    json value = spec.at(key.path);
    if (key.type == KeyType::kPath && !is_builtin_source(value.get<std::string>()))
      value = fs::weakly_canonical(fs::absolute(value.get<std::string>())).string();
    out[key.path] = value;
  }
  return out;
}

std::vector<std::string> changed_settings(const json& saved, const JobSpec& spec) {
  std::vector<std::string> out;
  if (!saved.is_object()) return out;
  const json now = trajectory_settings(spec);
  for (const auto& [key, value] : now.items()) {
    // A key the checkpoint did not record (added to the table since) is no change.
    if (!saved.contains(key) || saved[key] == value) continue;
    out.push_back(key + ": " + saved[key].dump() + " -> " + value.dump());
  }
  return out;
}

std::string write_driver_state(const std::string& ckpt_dir, int64_t step, json state,
                               const json& settings, int64_t max_num) {
  const std::string tag = kTagPrefix + std::to_string(step);
  const fs::path dir = fs::path(ckpt_dir) / "driver";
  fs::create_directories(dir);
  state["step"] = step;
  state["tag"] = tag;
  state["settings"] = settings;
  const fs::path file = dir / (tag + ".json"), tmp = dir / (tag + ".json.tmp");
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << state.dump(2) << '\n';
    out.flush();
    if (!out) throw RuntimeError(tmp.string() + ": cannot write the driver state");
  }
  fs::rename(tmp, file);
  // The trainers keep the newest max_num checkpoints; the driver files follow them.
  auto files = driver_files(dir);
  for (size_t i = 0; max_num > 0 && i + static_cast<size_t>(max_num) < files.size(); ++i)
    fs::remove(files[i].second);
  return file.string();
}

std::optional<DriverState> latest_driver_state(const std::string& ckpt_dir, Role role) {
  auto files = driver_files(fs::path(ckpt_dir) / "driver");
  for (auto it = files.rbegin(); it != files.rend(); ++it) {
    std::ifstream in(it->second);
    json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.value("step", json()).is_number_integer() ||
        !j.value("tag", json()).is_string())
      continue;
    const std::string tag = j["tag"].get<std::string>();
    if (!fs::exists(fs::path(ckpt_dir) / role_name(role) / tag)) continue;
    return DriverState{j["step"].get<int64_t>(), tag, it->second.string(), j};
  }
  return std::nullopt;
}

}  // namespace rlhf::engine
