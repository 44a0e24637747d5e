// wire_version: a fingerprint of every typed operation (see wire_version.h). A new
// operation is added to kOperations below.
#include "actors/wire_version.h"

#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "dpo/worker_ops.h"
#include "engine/worker_ops.h"
#include "ppo/worker_ops.h"
#include "rollout/worker_ops.h"
#include "transport/worker_ops.h"

namespace rlhf {
namespace {

// A JSON value's layout: objects by their keys (sorted) and the layouts of their values,
// arrays and scalars by their kind. Values themselves do not count.
std::string layout(const nlohmann::json& j) {
  if (j.is_object()) {
    std::string out = "{";
    for (const auto& [key, value] : j.items()) out += key + ":" + layout(value) + ",";
    return out + "}";
  }
  if (j.is_number()) return "number";  // an integer default may be a float on the wire
  return j.type_name();
}

template <typename Request>
std::string operation_layout() {
  return std::string(Request::kName) + " " + layout(nlohmann::json(Request{})) + " -> " +
         layout(nlohmann::json(typename Request::Reply{})) + "\n";
}

template <typename... Requests>
std::string layouts() {
  return (operation_layout<Requests>() + ...);
}

}  // namespace

std::string wire_layout() {
  return layouts<ops::Ping, ops::Info, ops::Memory, ops::Init, ops::LogProbs, ops::Values,
                 ops::Score, ops::Save, ops::Load, ops::ExportHf, ops::OffloadOptimizer,
                 ops::RestoreOptimizer, ops::TrainActor, ops::TrainCritic, ops::PushWeights,
                 ops::LoadModel, ops::Generate, ops::SyncWeights, ops::Sleep, ops::WakeUp,
                 ops::SequenceLogProbs, ops::SequenceScores, ops::TrainDpo, ops::TrainKto,
                 ops::TrainSft, ops::TrainRm>();
}

const std::string& wire_version() {
  static const std::string version = [] {
    uint64_t hash = 1469598103934665603ull;  // FNV-1a, 64 bits
    for (unsigned char c : wire_layout()) hash = (hash ^ c) * 1099511628211ull;
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(hash));
    return std::to_string(kWireVersion) + "-" + hex;
  }();
  return version;
}

}  // namespace rlhf
