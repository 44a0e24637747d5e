// A driver's handle on one role group: call an operation on every rank, or scatter a batch
// across the ranks in micro batches and gather the results back in batch order, with at
// most `max_inflight` requests per rank (back-pressure) and a deadline per call.
// Algorithm-agnostic: operations are named strings served by the workers' registries.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "core/spec.h"
#include "transport/message.h"

namespace rlhf {

class Scheduler;

// How scatter() assigns micro batches to ranks.
enum class Dispatch {
  // Each micro batch goes to the least-loaded rank: fastest when the ranks are independent
  // (rollout engines, replicated models).
  kLeastLoaded,
  // Round robin, and every rank receives the same number of calls: the last micro batch is
  // repeated on the ranks that would otherwise get one fewer, and those replies are
  // dropped. Needed when the operation runs collectives across the group (a ZeRO-3 forward
  // all-gathers each unit), where a rank left without a call would leave the others
  // waiting forever.
  kEqualPerRank,
};

// The dispatch a role's forward operations need: kEqualPerRank when its weights are sharded
// over the group (a trained role at ZeRO stage 3), kLeastLoaded otherwise.
Dispatch dispatch_for(const JobSpec& spec, Role role);

class RoleGroup {
 public:
  using Timeout = std::optional<std::chrono::milliseconds>;  // nullopt: the scheduler default

  RoleGroup(Scheduler& scheduler, Role role, std::vector<size_t> worker_indices);

  Role role() const { return role_; }
  int size() const { return static_cast<int>(workers_.size()); }

  // Runs `op` with `args` (and `tensors`, sent to every rank) on every rank; replies in rank
  // order. Throws RuntimeError naming the rank when one answers with an error, WorkerFailure
  // or JobInterrupted when the job fails meanwhile, RuntimeError on timeout.
  std::vector<Message> call_all(const std::string& op,
                                const nlohmann::json& args = nlohmann::json::object(),
                                const std::vector<NamedTensor>& tensors = {},
                                Timeout timeout = std::nullopt);
  // One request to one rank.
  Message call(int rank, Message request, Timeout timeout = std::nullopt);

  // Splits every tensor of `batch` along dim 0 (all must have the same size B > 0) into
  // micro batches of `micro_batch_size` rows (the last may be smaller), sends each to a rank
  // chosen by `dispatch` with `args`, and concatenates every reply tensor along dim 0 in
  // batch order. The result's args hold "micro_batches": the reply args of each micro
  // batch, in order (repeats sent for kEqualPerRank are not included).
  Message scatter(const std::string& op, const std::vector<NamedTensor>& batch,
                  int64_t micro_batch_size, const nlohmann::json& args = nlohmann::json::object(),
                  Timeout timeout = std::nullopt, Dispatch dispatch = Dispatch::kLeastLoaded);

 private:
  std::chrono::steady_clock::time_point deadline(Timeout timeout) const;
  Message checked(const Message& reply, int rank) const;

  Scheduler& scheduler_;
  Role role_;
  std::vector<size_t> workers_;  // scheduler worker index per rank
};

}  // namespace rlhf
