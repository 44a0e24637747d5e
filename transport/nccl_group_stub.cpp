// make_nccl_group for builds without the CUDA toolkit's NCCL: it always throws.
#include "core/errors.h"
#include "transport/nccl_group.h"

namespace rlhf::transport {

std::string nccl_version() {
  return "";
}

std::unique_ptr<CollectiveGroup> make_nccl_group(const CollectiveConfig& config,
                                                 const c10::intrusive_ptr<c10d::Store>&) {
  throw RuntimeError("collective group: rank " + std::to_string(config.rank) +
                     ": this build has no NCCL (configure with the CUDA toolkit installed)");
}

}  // namespace rlhf::transport
