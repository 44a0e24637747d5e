// Sharded checkpoints: each rank writes only its own shards (FP32 master weights, AdamW
// moments, RNG state) to rank_NNNNN.safetensors, rank 0 adds rlhf_checkpoint.json (the
// manifest), all in DIR.tmp-XXXXXXXX that rank 0 renames to DIR once every rank is done:
// a crash mid-save leaves the previous checkpoint as it was. The model is never gathered.
// Resharding to another world size is not done here (export_hf is the portable format).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "transport/collective_group.h"

namespace rlhf::engine {

class ShardedUnit;

inline constexpr const char* kManifestName = "rlhf_checkpoint.json";

struct CheckpointOptions {
  bool save_only_model = false;  // skip AdamW moments (a resume restarts them at zero)
  int max_num = 3;               // OpenRLHF --max_ckpt_num: newest checkpoints kept in DIR's parent
  // The trainer's own small state beside the shards (the FP16 loss scaler's), in the manifest.
  nlohmann::json trainer_state;
  // Called on every rank after its shard file is on disk and before the commit; for
  // fault-injection tests (a process killed here must leave no checkpoint at DIR).
  std::function<void()> before_commit;
};

// Writes the checkpoint of `units` at optimizer step `step` to `dir`, then keeps only the
// newest `max_num` checkpoints (by step) among `dir`'s siblings that have a manifest, and
// removes stale *.tmp-* siblings (one trainer per parent directory). Collective. Throws
// RuntimeError on I/O failure (the previous checkpoint is untouched).
void save_sharded_checkpoint(const std::string& dir,
                             const std::vector<std::unique_ptr<ShardedUnit>>& units, int64_t step,
                             int zero_stage, transport::CollectiveGroup& group,
                             const CheckpointOptions& options);

// Loads this rank's shards from `dir` into `units` and restores the RNG; returns the step
// and, with `trainer_state`, sets it to what the save's options carried (null if none).
// Throws InputError naming the file when the manifest is missing or bad, the world size
// or the unit layout differ, or a shard file is missing or corrupt.
int64_t load_sharded_checkpoint(const std::string& dir,
                                const std::vector<std::unique_ptr<ShardedUnit>>& units,
                                transport::CollectiveGroup& group,
                                nlohmann::json* trainer_state = nullptr);

// The complete checkpoint with the highest step directly under `root`, if any.
std::optional<std::string> latest_checkpoint(const std::string& root);

}  // namespace rlhf::engine
