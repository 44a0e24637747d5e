// A driver's handle on one role group: call an operation on every rank, or scatter a batch
// across the ranks in micro batches and gather the results back in batch order, with at
// most `max_inflight` requests per rank (back-pressure) and a deadline per call.
// Algorithm-agnostic: drivers send typed requests (transport/operation.h); the untyped
// forms by operation name remain for the transport's own tests (echo).
#pragma once

#include <chrono>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/spec.h"
#include "scheduler/scheduler.h"
#include "transport/message.h"
#include "transport/operation.h"

namespace rlhf {

class Scheduler;

// How scatter() assigns micro batches to replicas (a replica is one rank unless the group
// was given set_ranks_per_replica).
enum class Dispatch {
  // Each micro batch goes to the least-loaded replica: fastest when the replicas are
  // independent (rollout engines, replicated models).
  kLeastLoaded,
  // Round robin, and every replica receives the same number of calls: the last micro batch
  // is repeated on the replicas that would otherwise get one fewer, and those replies are
  // dropped. Needed when the operation runs collectives across the group (a ZeRO-3 forward
  // all-gathers each unit), where a rank left without a call would leave the others
  // waiting forever.
  kEqualPerRank,
};

// The dispatch a role's forward operations need: kEqualPerRank when its forwards run
// collectives over the group (a trained role at ZeRO stage 3 or with expert_parallel_size >
// 1, a ZeRO-3 reference or reward), kLeastLoaded otherwise.
Dispatch dispatch_for(const JobSpec& spec, Role role);
// dispatch_for of every model role (actor, critic, ref, reward).
std::map<Role, Dispatch> model_role_dispatch(const JobSpec& spec);

class RoleGroup {
 public:
  using Timeout = std::optional<std::chrono::milliseconds>;  // nullopt: the scheduler default

  RoleGroup(Scheduler& scheduler, Role role, std::vector<size_t> worker_indices);

  Role role() const { return role_; }
  int size() const { return static_cast<int>(workers_.size()); }

  // Makes scatter()'s unit `ranks` consecutive ranks that serve each micro batch together,
  // running collectives among themselves in lockstep (a tensor-parallel rollout engine of
  // rollout.tensor_parallel_size ranks): replica e is ranks e * ranks .. e * ranks + ranks - 1.
  // Every rank of the chosen replica gets the same request at once; the call is done when
  // all of them have answered; the replica's first rank's reply is kept. 1 (the default):
  // every rank is its own replica. Set it before any scatter. Throws InputError when `ranks`
  // is below 1 or does not divide size().
  void set_ranks_per_replica(int ranks);
  int ranks_per_replica() const { return ranks_per_replica_; }
  int replicas() const { return size() / ranks_per_replica_; }

  // Runs `op` with `args` (and `tensors`, sent to every rank) on every rank; replies in rank
  // order. Throws RuntimeError naming the rank when one answers with an error, WorkerFailure
  // or JobInterrupted when the job fails meanwhile, RuntimeError on timeout.
  std::vector<Message> call_all(const std::string& op,
                                const nlohmann::json& args = nlohmann::json::object(),
                                const std::vector<NamedTensor>& tensors = {},
                                Timeout timeout = std::nullopt);
  // The typed form drivers use (transport/operation.h): `request`'s operation on every rank,
  // each reply read strictly as Request::Reply (a field missing or unknown throws
  // RuntimeError naming the operation and the field), in rank order.
  template <typename Request, typename Reply = typename Request::Reply>
  std::vector<Answered<Reply>> call_all(const Request& request,
                                        const std::vector<NamedTensor>& tensors = {},
                                        Timeout timeout = std::nullopt) {
    std::vector<Answered<Reply>> out;
    for (Message& m :
         call_all(std::string(Request::kName), request_args(request), tensors, timeout)) {
      Answered<Reply> a{reply_of<Request>(m), m.args.value(kComputeSecondsField, 0.0), {}};
      a.tensors.op = m.op;
      a.tensors.tensors = std::move(m.tensors);
      out.push_back(std::move(a));
    }
    return out;
  }
  // One request to one rank.
  Message call(int rank, Message request, Timeout timeout = std::nullopt);
  template <typename Request>
  Message call(int rank, const Request& request, Timeout timeout = std::nullopt) {
    return call(rank, message_of(request), timeout);
  }
  // call() in two halves, for a request whose reply needs another group's call meanwhile:
  // send() now, wait() for its reply (checked as call's).
  struct Sent {
    int rank = 0;
    uint64_t id = 0;
    std::chrono::steady_clock::time_point until;
  };
  Sent send(int rank, Message request, Timeout timeout = std::nullopt);
  Message wait(const Sent& sent);
  template <typename Request>
  static Message message_of(const Request& request) {
    Message m;
    m.op = Request::kName;
    m.args = request_args(request);
    return m;
  }

  // Fault tolerance (fault.max_restarts). `revive` brings the relaunched worker of rank `rank`
  // back to where the driver left it (its load request again; a rollout engine also the
  // weights it served), calling this group's ranks as usual. Setting it lets the scheduler
  // relaunch this role's lost workers (Scheduler::allow_restarts). From then on every call
  // first revives a rank that came back (ready()), and scatter() runs a lost micro batch again,
  // on the other replicas meanwhile or on the revived one, when a replica is one rank and the
  // dispatch is kLeastLoaded. Anywhere else a lost worker fails the call with WorkerFailure.
  using Revive = std::function<void(int rank)>;
  void set_revive(Revive revive);
  // Revives every rank relaunched since its last revival (waiting for it to register first).
  void ready();

  // Splits every tensor of `batch` along dim 0 (all must have the same size B > 0) into
  // micro batches of `micro_batch_size` rows (the last may be smaller), sends each to a
  // replica chosen by `dispatch` with `args` (at most max_inflight calls in flight per
  // replica), and concatenates every reply tensor along dim 0 in batch order. The result's
  // args hold "micro_batches": the reply args of each micro batch (its replica's first
  // rank's), in order (repeats sent for kEqualPerRank are not included). Throws as call_all,
  // naming the rank whose reply was an error; with several ranks per replica also
  // RuntimeError when a rank's reply differs from its replica's first rank's in tensor names,
  // shapes or dtypes, or in the values of an integer or bool tensor (the ranks diverged).
  // `on_part`, when set, is called on this thread with each partial reply (kPartial, from a
  // replica's first rank) as it arrives, with its micro batch's index: parts of a micro
  // batch's result its worker sends ahead of the reply (a streaming generate's finished
  // prompt groups).
  using PartHandler = std::function<void(int64_t micro_batch, Message part)>;
  Message scatter(const std::string& op, const std::vector<NamedTensor>& batch,
                  int64_t micro_batch_size, const nlohmann::json& args = nlohmann::json::object(),
                  Timeout timeout = std::nullopt, Dispatch dispatch = Dispatch::kLeastLoaded,
                  const PartHandler& on_part = {});
  // The typed form: every micro batch's reply is checked to be a Request::Reply
  // (micro_batch_replies<Request> reads them back).
  template <typename Request, typename Reply = typename Request::Reply>
  Message scatter(const Request& request, const std::vector<NamedTensor>& batch,
                  int64_t micro_batch_size, Dispatch dispatch = Dispatch::kLeastLoaded,
                  Timeout timeout = std::nullopt, const PartHandler& on_part = {}) {
    Message gathered = scatter(std::string(Request::kName), batch, micro_batch_size,
                               request_args(request), timeout, dispatch, on_part);
    micro_batch_replies<Request>(gathered);
    return gathered;
  }

 private:
  std::chrono::steady_clock::time_point deadline(Timeout timeout) const;
  Message checked(const Message& reply, int rank) const;
  // Throws RuntimeError when `other` (from `rank`) is not the reply `first` (from
  // `first_rank`) of the same replica (see scatter).
  void check_same_reply(const Message& first, int first_rank, const Message& other, int rank) const;

  // scatter's wait: the next reply or part of `waiting`; while `down` holds revivals (replica
  // -> its revival), polls them every 50 ms (a failed one throws) and returns nullopt when no
  // reply came meanwhile. Throws at `until`.
  std::optional<Scheduler::Progress> next_progress(const std::string& op,
                                                   const std::vector<uint64_t>& waiting,
                                                   std::map<int, std::future<void>>& down,
                                                   std::chrono::steady_clock::time_point until);
  // Revives `rank` when the scheduler relaunched it since its last revival; `lost`: a request
  // of it came back lost, so a relaunch is coming if it has not registered yet.
  void ready(int rank, std::chrono::steady_clock::time_point until, bool lost = false);

  Scheduler& scheduler_;
  Role role_;
  std::vector<size_t> workers_;  // scheduler worker index per rank
  int ranks_per_replica_ = 1;
  Revive revive_;
  std::unique_ptr<std::mutex> revive_mutex_ = std::make_unique<std::mutex>();
  std::vector<uint64_t> revived_;  // per rank: the incarnation last revived (guarded by it)
};

}  // namespace rlhf
