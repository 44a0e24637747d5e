// Syncing: the actor's new weights to the rollout group (a collective over a fresh
// rendezvous, bucket by bucket, by the route sync_route picks), and the colocation sleep
// mode that moves the rollout's weights and the actor's optimizer state out of the way of
// the phase that runs. The receiving side is rollout/weight_sync.h.
#include <utility>

#include "ppo/phases.h"
#include "scheduler/role_group.h"

namespace rlhf::ppo::job {

using nlohmann::json;

// How the weight sync travels: CUDA IPC (over a Gloo group that carries only the handle and
// the signals) when every rollout rank is on actor rank 0's GPU and the rollout is not
// tensor-parallel (IPC hands over whole tensors; a TP rank takes only its slices); NCCL when
// actor rank 0 and every rollout rank have a GPU and none shares the actor's (NCCL refuses
// two ranks of one communicator on one device); else Gloo, which stages CUDA tensors through
// the host.
SyncRoute sync_route(const std::vector<Answered<ops::InfoReply>>& actor,
                     const std::vector<Answered<ops::InfoReply>>& rollout,
                     int tensor_parallel_size) {
  auto where = [](const Answered<ops::InfoReply>& m) {
    return std::make_pair(m.reply.node, m.reply.device);
  };
  auto on_cuda = [](const std::pair<std::string, std::string>& w) {
    return w.second.rfind("cuda", 0) == 0;
  };
  const auto root = where(actor.at(0));
  if (!on_cuda(root)) return {"gloo", "gloo"};
  bool all_shared = true, all_own = true;
  for (const auto& r : rollout) {
    all_shared = all_shared && where(r) == root;
    all_own = all_own && on_cuda(where(r)) && where(r) != root;
  }
  if (all_shared && tensor_parallel_size == 1) return {"gloo", "cuda_ipc"};
  if (all_own) return {"nccl", "nccl"};
  return {"gloo", "gloo"};
}

WeightSync::WeightSync(SyncSettings settings, RoleGroup& actor, RoleGroup& rollout,
                       std::function<std::string(const std::string&)> rendezvous)
    : s_(std::move(settings)),
      actor_(actor),
      rollout_(rollout),
      rendezvous_(std::move(rendezvous)) {}

void WeightSync::choose(std::ostream& out) {
  const auto actor = actor_.call_all(ops::Info{});
  const auto rollout = rollout_.call_all(ops::Info{});
  route_ = sync_route(actor, rollout, s_.tensor_parallel_size);
  // The same policy the memory planner planned the phases with (engine/phase_policy.h).
  const engine::PhasePolicy policy =
      engine::phase_policy(s_.phases, rollout.at(0).reply.device.rfind("cuda", 0) == 0);
  sleep_rollout_ = policy.rollout_sleeps;
  offload_optimizer_ = policy.actor_offloads_optimizer;
  if (sleep_rollout_ || offload_optimizer_)
    out << "ppo: colocated on the GPU:"
        << (sleep_rollout_ ? " the rollout's weights go to host memory while the actor trains" : "")
        << (sleep_rollout_ && offload_optimizer_ ? ";" : "")
        << (offload_optimizer_ ? " the actor's optimizer state goes to host memory while the "
                                 "rollout generates"
                               : "")
        << std::endl;
}

double WeightSync::sync() {
  rollout_.ready();  // a relaunched engine first catches up alone (resend)
  std::string store;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    store =
        rendezvous_(regroups_ == 0 ? "weight_sync" : "weight_sync." + std::to_string(regroups_));
  }
  auto receive = in_parallel([&] {
    return rollout_.call_all(ops::SyncWeights{store, route_.backend});
  });
  ops::PushWeights push;
  push.store_path = store;
  push.sync_size = rollout_.size() + 1;
  push.backend = route_.backend;
  push.path = route_.path;
  push.bucket_bytes = s_.bucket_bytes;
  push.tensor_parallel_size = s_.tensor_parallel_size;
  push.lora_sync = s_.lora_sync;
  auto pushed = actor_.call_all(push);
  const auto received = receive.get();
  const ops::SyncReply& a = pushed.at(0).reply;
  version_ = a.weight_version;
  last_sync_ = {{"path", a.path},
                {"weight_version", a.weight_version},
                {"bytes", a.bytes},
                {"buckets", a.buckets},
                {"seconds", a.seconds},
                {"gb_per_s", a.seconds > 0 ? static_cast<double>(a.bytes) / 1e9 / a.seconds : 0.0}};
  return std::max(slowest_compute(pushed), slowest_compute(received));
}

double WeightSync::before_training() {
  offload_ = json::object();
  double compute = 0;
  if (sleep_rollout_) {
    const auto replies = rollout_.call_all(ops::Sleep{});
    const ops::OffloadReply& r = replies.at(0).reply;
    offload_["rollout_bytes"] = r.offloaded_bytes;
    offload_["rollout_sleep_s"] = r.seconds;
    offload_["rollout_cuda_allocated_bytes_asleep"] = r.cuda_allocated_bytes;
    offload_["rollout_cuda_reserved_bytes_asleep"] = r.cuda_reserved_bytes;
    compute += slowest_compute(replies);
  }
  if (offload_optimizer_) {
    const auto replies = actor_.call_all(ops::RestoreOptimizer{});
    offload_["actor_optimizer_restore_s"] = replies.at(0).reply.seconds;
    compute += slowest_compute(replies);
  }
  return compute;
}

double WeightSync::before_generating() {
  double compute = 0;
  if (offload_optimizer_) {
    const auto replies = actor_.call_all(ops::OffloadOptimizer{});
    const ops::OffloadReply& r = replies.at(0).reply;
    offload_["actor_optimizer_bytes"] = r.offloaded_bytes;
    offload_["actor_optimizer_offload_s"] = r.seconds;
    offload_["actor_cuda_allocated_bytes_offloaded"] = r.cuda_allocated_bytes;
    compute += slowest_compute(replies);
  }
  if (sleep_rollout_) {
    const auto replies = rollout_.call_all(ops::WakeUp{});
    const ops::RestoreReply& r = replies.at(0).reply;
    offload_["rollout_wake_s"] = r.seconds;
    offload_["rollout_cuda_allocated_bytes_awake"] = r.cuda_allocated_bytes;
    offload_["rollout_cuda_reserved_bytes_awake"] = r.cuda_reserved_bytes;
    compute += slowest_compute(replies);
  }
  return compute;
}

void WeightSync::offload_optimizer_again() {
  if (offload_optimizer_) actor_.call_all(ops::OffloadOptimizer{});
}

bool WeightSync::revivable(bool actor_pushes_alone) const {
  return actor_pushes_alone && s_.tensor_parallel_size == 1 && !sleep_rollout_;
}

void WeightSync::resend(int rank) {
  std::string store;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    store = rendezvous_("weight_sync.revive" + std::to_string(++regroups_));
  }
  // On this thread (the revival's): the rank's calls go straight to it.
  const auto receive =
      rollout_.send(rank, RoleGroup::message_of(ops::SyncWeights{store, route_.backend, true}));
  ops::PushWeights push;
  push.store_path = store;
  push.sync_size = 2;
  push.backend = route_.backend;
  push.path = route_.path;
  push.bucket_bytes = s_.bucket_bytes;
  push.lora_sync = s_.lora_sync;
  push.again = true;
  actor_.call_all(push);
  rollout_.wait(receive);
}

}  // namespace rlhf::ppo::job
