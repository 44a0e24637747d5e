// rollout/worker_ops.h's conversions.
#include "rollout/worker_ops.h"

namespace rlhf::ops {

SyncReply sync_reply(const rollout::WeightSyncStats& stats) {
  SyncReply r;
  r.weight_version = stats.version;
  r.bytes = stats.bytes;
  r.buckets = stats.buckets;
  r.tensors = stats.tensors;
  r.seconds = stats.seconds;
  r.path = rollout::sync_path_name(stats.path);
  return r;
}

}  // namespace rlhf::ops
