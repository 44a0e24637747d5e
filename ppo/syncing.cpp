// Syncing: the actor's new weights to the rollout group (a collective over a fresh
// rendezvous, bucket by bucket, by the route sync_route picks), and the colocation sleep
// mode that moves the rollout's weights and the actor's optimizer state out of the way of
// the phase that runs. The receiving side is rollout/weight_sync.h.
#include <utility>

#include "ppo/ppo_job.h"
#include "scheduler/role_group.h"
#include "scheduler/scheduler.h"

namespace rlhf::ppo::job {

using nlohmann::json;

// How the weight sync travels: CUDA IPC (over a Gloo group that carries only the handle and
// the signals) when every rollout rank is on actor rank 0's GPU and the rollout is not
// tensor-parallel (IPC hands over whole tensors; a TP rank takes only its slices); NCCL when
// actor rank 0 and every rollout rank have a GPU and none shares the actor's (NCCL refuses
// two ranks of one communicator on one device); else Gloo, which stages CUDA tensors through
// the host.
SyncRoute sync_route(const std::vector<Message>& actor, const std::vector<Message>& rollout,
                     int tensor_parallel_size) {
  auto where = [](const Message& m) {
    return std::make_pair(m.args.value("node", std::string()),
                          m.args.value("device", std::string()));
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

double PpoJob::sync_weights(Scheduler& s) {
  const std::string store = s.rendezvous("weight_sync");
  RoleGroup& rollout = s.group(Role::kRollout);
  auto receive = in_parallel([&] {
    return rollout.call_all("sync_weights",
                            {{"store_path", store}, {"backend", sync_route_.backend}});
  });
  const auto bucket_bytes = static_cast<int64_t>(spec_.get_float("rollout.sync_bucket_mb") *
                                                 static_cast<double>(1 << 20));
  auto pushed =
      s.group(Role::kActor)
          .call_all("push_weights", {{"store_path", store},
                                     {"sync_size", rollout.size() + 1},
                                     {"backend", sync_route_.backend},
                                     {"path", sync_route_.path},
                                     {"bucket_bytes", bucket_bytes},
                                     {"tensor_parallel_size", c_.tensor_parallel_size},
                                     {"lora_sync", spec_.get_string("rollout.lora_sync")}});
  const auto received = receive.get();
  const json& a = pushed.at(0).args;
  const double seconds = a.value("seconds", 0.0);
  const auto bytes = a.value("bytes", int64_t{0});
  last_sync_ = {{"path", a.value("path", sync_route_.path)},
                {"bytes", bytes},
                {"buckets", a.value("buckets", int64_t{0})},
                {"seconds", seconds},
                {"gb_per_s", seconds > 0 ? static_cast<double>(bytes) / 1e9 / seconds : 0.0}};
  return std::max(call_all_compute(pushed), call_all_compute(received));
}

double PpoJob::before_training(Scheduler& s) {
  offload_ = json::object();
  double compute = 0;
  if (sleep_rollout_) {
    const auto replies = s.group(Role::kRollout).call_all("sleep");
    const json& r = replies.at(0).args;
    offload_["rollout_bytes"] = r.value("offloaded_bytes", int64_t{0});
    offload_["rollout_sleep_s"] = r.value("seconds", 0.0);
    offload_["rollout_cuda_allocated_bytes_asleep"] = r.value("cuda_allocated_bytes", int64_t{0});
    offload_["rollout_cuda_reserved_bytes_asleep"] = r.value("cuda_reserved_bytes", int64_t{0});
    compute += call_all_compute(replies);
  }
  if (offload_optimizer_) {
    const auto replies = s.group(Role::kActor).call_all("restore_optimizer");
    offload_["actor_optimizer_restore_s"] = replies.at(0).args.value("seconds", 0.0);
    compute += call_all_compute(replies);
  }
  return compute;
}

double PpoJob::before_generating(Scheduler& s) {
  double compute = 0;
  if (offload_optimizer_) {
    const auto replies = s.group(Role::kActor).call_all("offload_optimizer");
    const json& r = replies.at(0).args;
    offload_["actor_optimizer_bytes"] = r.value("offloaded_bytes", int64_t{0});
    offload_["actor_optimizer_offload_s"] = r.value("seconds", 0.0);
    offload_["actor_cuda_allocated_bytes_offloaded"] = r.value("cuda_allocated_bytes", int64_t{0});
    compute += call_all_compute(replies);
  }
  if (sleep_rollout_) {
    const auto replies = s.group(Role::kRollout).call_all("wake_up");
    const json& r = replies.at(0).args;
    offload_["rollout_wake_s"] = r.value("seconds", 0.0);
    offload_["rollout_cuda_allocated_bytes_awake"] = r.value("cuda_allocated_bytes", int64_t{0});
    offload_["rollout_cuda_reserved_bytes_awake"] = r.value("cuda_reserved_bytes", int64_t{0});
    compute += call_all_compute(replies);
  }
  return compute;
}

}  // namespace rlhf::ppo::job
