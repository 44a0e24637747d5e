// plan.json written at run start, and planned vs measured read back from a run directory.
#include "engine/memory_check.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "core/errors.h"
#include "core/jsonl.h"
#include "engine/memory_plan.h"

namespace rlhf::engine {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

json read_json_file(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw InputError(path.string() + ": cannot read (was the run started by this rlhf?)");
  std::stringstream buf;
  buf << in.rdbuf();
  json j = json::parse(buf.str(), nullptr, false);
  if (j.is_discarded()) throw InputError(path.string() + ": not valid JSON");
  return j;
}

// The payload bytes of a CollectiveTraffic record, every kind summed.
int64_t collective_bytes(const json& traffic) {
  return traffic.get<transport::CollectiveTraffic>().total();
}

double relative_error(int64_t planned, int64_t measured) {
  return measured > 0 ? static_cast<double>(planned - measured) / static_cast<double>(measured)
                      : 0.0;
}

}  // namespace

void write_run_plan(const JobSpec& spec, const std::string& run_dir) {
  std::vector<std::string> missing;
  const auto models = load_role_models(spec, missing);
  json out = {{"spec", spec.source()}};
  // Which files each role's model is: the reference as written, the directory and the Hub
  // revision it resolved to (core/model_ref.h).
  json sources = json::object();
  for (Role r : spec.used_roles()) {
    const std::string key = std::string(role_name(r)) + ".model", path = spec.get_string(key);
    if (path.empty()) continue;
    ModelSource source{path, path, "directory", ""};
    for (const auto& [k, found] : spec.models())
      if (found.path == path) source = found;  // inherited (ref.model from actor.model) too
    sources[key] = {{"ref", source.ref},
                    {"path", path},
                    {"found_in", source.found_in},
                    {"revision", source.revision}};
  }
  out["models"] = sources;
  if (missing.empty())
    out["memory"] = plan_memory(spec, models).to_json();
  else
    out["missing"] = missing;
  std::error_code ec;
  fs::create_directories(run_dir, ec);
  const fs::path path = fs::path(run_dir) / kPlanFileName;
  std::ofstream file(path);
  file << out.dump(2) << '\n';
  file.close();
  if (!file) throw RuntimeError("cannot write " + path.string());
}

double MemoryCheckRow::tensor_error() const {
  return relative_error(planned_engine, measured_tensor);
}
double MemoryCheckRow::rss_error() const {
  return relative_error(planned_total, measured_rss);
}
double MemoryCheckRow::cuda_error() const {
  return relative_error(planned_cuda, measured_cuda);
}

double MemoryCheckRow::Phase::error() const {
  return relative_error(planned, measured);
}

std::string phase_of_operation(const std::string& op) {
  static const std::map<std::string, std::string> kPhases = {
      {"generate", "generate"}, {"log_probs", "score"},          {"values", "score"},
      {"score", "score"},       {"train_actor", "train"},        {"train_critic", "train"},
      {"train", "train"},       {"sync_weights", "sync"},        {"push_weights", "sync"},
      {"save", "save"},         {"export_hf", "save"},           {"load_model", "load"},
      {"init", "load"},         {"sequence_log_probs", "score"}, {"sequence_scores", "score"},
      {"train_dpo", "train"},   {"train_kto", "train"},          {"train_sft", "train"},
      {"train_rm", "train"}};
  auto it = kPhases.find(op);
  return it == kPhases.end() ? "" : it->second;
}

namespace {

// The plan's allocator bytes per phase for one role (plan.json's terms): what the role holds
// in the phase less what the allocator does not see.
std::map<std::string, int64_t> planned_cuda_phases(const json& role) {
  std::map<std::string, int64_t> out;
  if (role.value("cuda_workspace", int64_t{0}) == 0 || !role.contains("phases")) return out;
  const int64_t outside = role.value("overhead", int64_t{0}) -
                          role.value("cuda_workspace", int64_t{0}) + role.value("nccl", int64_t{0});
  for (const auto& [phase, bytes] : role["phases"].items())
    out[phase] = bytes.get<int64_t>() - outside -
                 (phase == "sync" ? role.value("sync_outside", int64_t{0}) : 0);
  return out;
}

// The plan's tracked bytes per phase (plan.json's engine_phases; empty for the rollout).
std::map<std::string, int64_t> planned_engine_phases(const json& role) {
  std::map<std::string, int64_t> out;
  if (!role.contains("engine_phases")) return out;
  for (const auto& [phase, bytes] : role["engine_phases"].items())
    out[phase] = bytes.get<int64_t>();
  return out;
}

// Folds one rank's measured per-operation peaks (cuda_phases: `key` peak_allocated_bytes;
// tensor_phases: peak_tensor_bytes) into `out`, one entry per phase the plan has. A phase's
// planned figure is its own, or with `per_op` (engine_operations) the largest of those of
// the operations that ran in it.
void add_measured_phases(const std::map<std::string, int64_t>& planned, const json& measured,
                         const char* key, std::vector<MemoryCheckRow::Phase>& out,
                         const json& per_op = json::object()) {
  for (const auto& [op, peaks] : measured.items()) {
    const std::string phase = phase_of_operation(op);
    auto plan_it = planned.find(phase);
    if (phase.empty() || plan_it == planned.end()) continue;
    const int64_t op_planned = per_op.contains(op) ? per_op[op].get<int64_t>() : plan_it->second;
    auto it = std::find_if(out.begin(), out.end(),
                           [&](const MemoryCheckRow::Phase& p) { return p.phase == phase; });
    if (it == out.end()) {
      out.push_back({phase, op_planned, -1});
      it = out.end() - 1;
    }
    it->planned = std::max(it->planned, op_planned);
    it->measured = std::max(it->measured, peaks.value(key, int64_t{-1}));
  }
}

// The step's order (load, generate, score, train, sync, save) rather than the operations'.
void sort_phases(std::vector<MemoryCheckRow::Phase>& phases) {
  const auto order = step_phases(true);
  auto rank = [&](const MemoryCheckRow::Phase& p) {
    return std::find(order.begin(), order.end(), p.phase) - order.begin();
  };
  std::stable_sort(phases.begin(), phases.end(),
                   [&](const auto& a, const auto& b) { return rank(a) < rank(b); });
}

}  // namespace

json planned_roles(const std::string& run_dir) {
  const fs::path plan_path = fs::path(run_dir) / kPlanFileName;
  if (!fs::exists(plan_path)) return nullptr;
  const json plan = read_json_file(plan_path);
  if (!plan.contains("memory") || !plan["memory"].contains("roles")) return nullptr;
  return plan["memory"]["roles"];
}

std::vector<MemoryCheckRow> check_run_memory(const std::string& run_dir) {
  const fs::path plan_path = fs::path(run_dir) / kPlanFileName;
  const json plan = read_json_file(plan_path);
  if (!plan.contains("memory"))
    throw InputError(plan_path.string() +
                     ": no memory plan (model directories were missing at run start)");
  const json& roles = plan["memory"]["roles"];
  const fs::path metrics = fs::path(run_dir) / "metrics.jsonl";
  std::vector<MemoryCheckRow> rows;
  auto row_for = [&rows](const std::string& role, int rank) -> MemoryCheckRow& {
    for (auto& r : rows)
      if (r.role == role && r.rank == rank) return r;
    MemoryCheckRow row;
    row.role = role;
    row.rank = rank;
    rows.push_back(row);
    return rows.back();
  };
  read_jsonl(metrics.string(), BadLinePolicy::kFatal, 0, [&](const json& rec, int64_t) {
    if (!rec.contains("memory")) return;
    for (const auto& [role, ranks] : rec["memory"].items()) {
      if (!roles.contains(role)) continue;
      for (const auto& m : ranks) {
        MemoryCheckRow& r = row_for(role, m.value("rank", 0));
        r.device = m.value("device", std::string());
        r.planned_engine = roles[role].value("engine_peak", int64_t{0});
        r.planned_total = roles[role].value("device_total", int64_t{0});
        if (m.contains("peak_tensor_bytes"))
          r.measured_tensor = std::max(r.measured_tensor, m["peak_tensor_bytes"].get<int64_t>());
        if (m.contains("peak_rss_bytes"))
          r.measured_rss = std::max(r.measured_rss, m["peak_rss_bytes"].get<int64_t>());
        r.planned_cuda = roles[role].value("cuda_allocated", int64_t{0});
        if (m.contains("cuda_peak_allocated_bytes"))
          r.measured_cuda =
              std::max(r.measured_cuda, m["cuda_peak_allocated_bytes"].get<int64_t>());
        if (roles[role].contains("collectives_per_step"))
          r.planned_collectives = collective_bytes(roles[role]["collectives_per_step"]);
        if (m.contains("step_collectives")) {
          r.measured_all_to_all = m["step_collectives"].value("all_to_all", int64_t{0});
          r.measured_collectives = collective_bytes(m["step_collectives"]) - r.measured_all_to_all;
        }
        if (m.contains("cuda_phases"))
          add_measured_phases(planned_cuda_phases(roles[role]), m["cuda_phases"],
                              "peak_allocated_bytes", r.phases);
        if (m.contains("tensor_phases"))
          add_measured_phases(planned_engine_phases(roles[role]), m["tensor_phases"],
                              "peak_tensor_bytes", r.tensor_phases,
                              roles[role].value("engine_operations", json::object()));
      }
    }
  });
  for (auto& r : rows) {
    sort_phases(r.phases);
    sort_phases(r.tensor_phases);
  }
  if (rows.empty())
    throw InputError(metrics.string() + ": no memory records (did the run reach a logging step?)");
  return rows;
}

json measured_peaks(const std::string& metrics_path) {
  json out = json::object();
  if (!fs::exists(metrics_path)) return out;
  read_jsonl(metrics_path, BadLinePolicy::kSkip, 0, [&](const json& rec, int64_t) {
    if (!rec.contains("memory")) return;
    for (const auto& [role, ranks] : rec["memory"].items()) {
      json& r = out[role];
      if (!r.is_object()) r = json::object();
      for (const auto& m : ranks) {
        for (const char* key : {"peak_tensor_bytes", "peak_rss_bytes"}) {
          if (!m.contains(key)) continue;
          r[key] = std::max(r.value(key, int64_t{0}), m[key].get<int64_t>());
        }
      }
    }
  });
  return out;
}

}  // namespace rlhf::engine
