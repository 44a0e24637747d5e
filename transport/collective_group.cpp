// make_collective_group: picks the backend named in the config.
#include "transport/collective_group.h"

#include "core/errors.h"
#include "transport/gloo_group.h"
#include "transport/nccl_group.h"
#include "transport/store.h"

namespace rlhf::transport {

CollectiveBackend collective_backend(const std::string& name) {
  if (name == "gloo") return CollectiveBackend::kGloo;
  if (name == "nccl") return CollectiveBackend::kNccl;
  throw InputError("collective backend \"" + name + "\": expected gloo or nccl");
}

std::unique_ptr<CollectiveGroup> make_collective_group(const CollectiveConfig& config) {
  if (config.backend == CollectiveBackend::kNccl)
    return make_nccl_group(config, open_store(config));
  return std::make_unique<GlooGroup>(config);
}

}  // namespace rlhf::transport
