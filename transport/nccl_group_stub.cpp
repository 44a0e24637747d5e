// make_nccl_group for builds without the CUDA toolkit's NCCL: it always throws.
#include "core/errors.h"
#include "transport/nccl_group.h"

namespace rlhf::transport {

std::string nccl_version() {
  return "";
}

namespace {

class DonePending final : public PendingCollective {
 public:
  void wait() override {}
};

}  // namespace

std::unique_ptr<PendingCollective> all_reduce_async(CollectiveGroup& group, torch::Tensor& tensor,
                                                    ReduceOp op) {
  group.all_reduce(tensor, op);
  return std::make_unique<DonePending>();
}

std::unique_ptr<CollectiveGroup> make_nccl_group(const CollectiveConfig& config,
                                                 const c10::intrusive_ptr<c10d::Store>&) {
  throw RuntimeError("collective group: rank " + std::to_string(config.rank) +
                     ": this build has no NCCL (configure with the CUDA toolkit installed)");
}

}  // namespace rlhf::transport
