// RoleGroup: fan-out, micro-batch scatter/gather with bounded in-flight requests.
#include "scheduler/role_group.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <deque>
#include <future>
#include <map>

#include "scheduler/scheduler.h"
#include "scheduler/worker_process.h"

namespace rlhf {
namespace {
// The group whose revive this thread runs: its calls inside go straight to the worker.
thread_local const RoleGroup* reviving = nullptr;
}  // namespace

RoleGroup::RoleGroup(Scheduler& scheduler, Role role, std::vector<size_t> worker_indices)
    : scheduler_(scheduler),
      role_(role),
      workers_(std::move(worker_indices)),
      revived_(workers_.size(), 0) {}

void RoleGroup::set_revive(Revive revive) {
  revive_ = std::move(revive);
  if (revive_) scheduler_.allow_restarts(role_);
}

void RoleGroup::ready() {
  for (int rank = 0; rank < size(); ++rank) ready(rank, deadline(std::nullopt));
}

void RoleGroup::ready(int rank, std::chrono::steady_clock::time_point until, bool lost) {
  if (!revive_ || reviving == this) return;
  const size_t index = workers_[static_cast<size_t>(rank)];
  std::lock_guard<std::mutex> lock(*revive_mutex_);
  uint64_t& done = revived_[static_cast<size_t>(rank)];
  const uint64_t target = std::max(scheduler_.incarnation(index), done + (lost ? 1 : 0));
  if (target == done) return;
  scheduler_.await_serving(index, target, until);
  const uint64_t now = scheduler_.incarnation(index);
  const auto started = std::chrono::steady_clock::now();
  reviving = this;
  try {
    revive_(rank);
  } catch (...) {
    reviving = nullptr;
    throw;
  }
  reviving = nullptr;
  done = now;
  scheduler_.note_ready(
      index, std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
}

std::chrono::steady_clock::time_point RoleGroup::deadline(Timeout timeout) const {
  const auto limit = timeout.value_or(scheduler_.config().request_timeout);
  if (limit.count() <= 0) return std::chrono::steady_clock::time_point::max();
  return std::chrono::steady_clock::now() + limit;
}

Message RoleGroup::checked(const Message& reply, int rank) const {
  if (reply.kind != MessageKind::kError) return reply;
  const std::string what = std::string(role_name(role_)) + "[" + std::to_string(rank) +
                           "] operation \"" + reply.op + "\" failed: " + reply.error;
  // A lost worker, or a rank whose collective failed (a peer died or hung): a failure of the
  // job's workers, which rlhf run may restart from a checkpoint (fault.max_restarts).
  if (is_worker_lost(reply) ||
      (reply.args.is_object() && reply.args.value("collective_failed", false)))
    throw WorkerFailure(what + "\n");
  // The worker's bad input (a corrupt checkpoint, a model that does not match) is the
  // user's to fix, as the same error in the driver would be: exit 2, not 1.
  if (reply.args.is_object() && reply.args.value("bad_input", false)) throw InputError(what);
  throw RuntimeError(what);
}

std::vector<Message> RoleGroup::call_all(const std::string& op, const nlohmann::json& args,
                                         const std::vector<NamedTensor>& tensors, Timeout timeout) {
  const auto until = deadline(timeout);
  std::vector<uint64_t> ids;
  std::map<uint64_t, int> rank_of;
  for (int rank = 0; rank < size(); ++rank) ready(rank, until);
  for (int rank = 0; rank < size(); ++rank) {
    Message request;
    request.op = op;
    request.args = args;
    request.tensors = tensors;
    ids.push_back(scheduler_.submit(workers_[rank], std::move(request)));
    rank_of[ids.back()] = rank;
  }
  std::vector<Message> replies(size());
  std::vector<uint64_t> waiting = ids;
  while (!waiting.empty()) {
    auto [id, reply] = scheduler_.await_any(waiting, until);
    waiting.erase(std::find(waiting.begin(), waiting.end(), id));
    replies[rank_of[id]] = checked(reply, rank_of[id]);
    scheduler_.progress().count(std::string(role_name(role_)) + " " + op,
                                static_cast<int64_t>(ids.size() - waiting.size()), size());
  }
  return replies;
}

Message RoleGroup::call(int rank, Message request, Timeout timeout) {
  return wait(send(rank, std::move(request), timeout));
}

RoleGroup::Sent RoleGroup::send(int rank, Message request, Timeout timeout) {
  TORCH_CHECK(rank >= 0 && rank < size(), role_name(role_), " has no rank ", rank);
  const auto until = deadline(timeout);
  ready(rank, until);
  return {rank, scheduler_.submit(workers_[rank], std::move(request)), until};
}

Message RoleGroup::wait(const Sent& sent) {
  return checked(scheduler_.await_any({sent.id}, sent.until).second, sent.rank);
}

Dispatch dispatch_for(const JobSpec& spec, Role role) {
  // Trained roles at stage 3 or expert-parallel, and the ZeRO-3 reference or reward (sharded
  // inference): each forward runs collectives over the group, so every rank must make the
  // same calls.
  const std::string r = role_name(role);
  const bool has_stage =
      spec.trains(role) || role == Role::kRef || role == Role::kTeacher || role == Role::kReward;
  const bool sharded =
      has_stage && spec.get_int(r + ".zero_stage") == 3 && (spec.trains(role) || spec.uses(role));
  // Expert parallelism: every forward's tokens reach their experts by all-to-all.
  const bool experts_split = spec.trains(role) && spec.get_int(r + ".expert_parallel_size") > 1;
  return sharded || experts_split ? Dispatch::kEqualPerRank : Dispatch::kLeastLoaded;
}

std::map<Role, Dispatch> model_role_dispatch(const JobSpec& spec) {
  std::map<Role, Dispatch> out;
  for (Role role : {Role::kActor, Role::kCritic, Role::kRef, Role::kTeacher, Role::kReward})
    out.emplace(role, dispatch_for(spec, role));
  return out;
}

void RoleGroup::set_ranks_per_replica(int ranks) {
  if (ranks < 1 || size() % ranks != 0)
    throw InputError(std::string(role_name(role_)) + ": " + std::to_string(ranks) +
                     " ranks per replica do not divide the group's " + std::to_string(size()) +
                     " ranks");
  ranks_per_replica_ = ranks;
}

void RoleGroup::check_same_reply(const Message& first, int first_rank, const Message& other,
                                 int rank) const {
  const std::string who = std::string(role_name(role_)) + "[" + std::to_string(rank) + "]";
  const std::string lead = std::string(role_name(role_)) + "[" + std::to_string(first_rank) + "]";
  const std::string what = who + " operation \"" + other.op + "\": ";
  const std::string why = " (the ranks of one replica must reply alike: they diverged)";
  if (other.tensors.size() != first.tensors.size())
    throw RuntimeError(what + "replied " + std::to_string(other.tensors.size()) + " tensors, " +
                       lead + " " + std::to_string(first.tensors.size()) + why);
  for (size_t i = 0; i < first.tensors.size(); ++i) {
    const auto &a = first.tensors[i], &b = other.tensors[i];
    if (a.name != b.name || a.tensor.sizes() != b.tensor.sizes() ||
        a.tensor.scalar_type() != b.tensor.scalar_type())
      throw RuntimeError(what + "replied tensor \"" + b.name + "\" " +
                         std::string(at::toString(b.tensor.scalar_type())) + " " +
                         c10::str(b.tensor.sizes()) + " where " + lead + " replied \"" + a.name +
                         "\" " + std::string(at::toString(a.tensor.scalar_type())) + " " +
                         c10::str(a.tensor.sizes()) + why);
    // Token ids and masks must agree to the bit; floating-point outputs may differ in
    // rounding where a rank reduces in another order, so only their shapes are checked.
    const bool exact =
        !at::isFloatingType(a.tensor.scalar_type()) && !at::isComplexType(a.tensor.scalar_type());
    if (exact && !at::equal(a.tensor, b.tensor))
      throw RuntimeError(what + "replied a different \"" + b.name + "\" than " + lead + why);
  }
}

std::optional<Scheduler::Progress> RoleGroup::next_progress(
    const std::string& op, const std::vector<uint64_t>& waiting,
    std::map<int, std::future<void>>& down, std::chrono::steady_clock::time_point until) {
  if (down.empty()) return scheduler_.await_progress(waiting, until);
  // Revivals under way: look at them every 50 ms.
  auto got = scheduler_.poll_progress(
      waiting, std::min(until, std::chrono::steady_clock::now() + std::chrono::milliseconds(50)));
  for (auto it = down.begin(); it != down.end();) {
    if (it->second.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
      ++it;
      continue;
    }
    it->second.get();  // a revival that failed fails the call
    it = down.erase(it);
  }
  if (!got && std::chrono::steady_clock::now() >= until)
    throw RuntimeError("scatter \"" + op + "\" on " + role_name(role_) +
                       ": a lost worker did not come back before the deadline");
  return got;
}

namespace {

// Which call of a scatter goes to which replica next, within max_inflight per replica: with
// kLeastLoaded the lost calls first (`again`), then new ones, to the least-loaded replica not
// being revived (`down`); with kEqualPerRank replica u makes calls u, u + U, ...
struct Dispatcher {
  Dispatcher(Dispatch d, int units, int64_t calls, int max_inflight)
      : dispatch(d), calls(calls), max_inflight(max_inflight), inflight(units, 0), next_of(units) {
    for (int u = 0; u < units; ++u) next_of[u] = u;
  }
  // The calls to send now, as (call, replica), counted in flight.
  std::vector<std::pair<int64_t, int>> take() {
    std::vector<std::pair<int64_t, int>> out;
    const int units = static_cast<int>(inflight.size());
    if (dispatch == Dispatch::kEqualPerRank) {
      for (int u = 0; u < units; ++u)
        for (; inflight[u] < max_inflight && next_of[u] < calls; next_of[u] += units, ++inflight[u])
          out.emplace_back(next_of[u], u);
      return out;
    }
    while (!again.empty() || next < calls) {
      int u = -1;
      for (int r = 0; r < units; ++r)
        if (!down.count(r) && (u < 0 || inflight[r] < inflight[u])) u = r;
      if (u < 0 || inflight[u] >= max_inflight) break;
      if (again.empty()) {
        out.emplace_back(next++, u);
      } else {
        out.emplace_back(again.front(), u);
        again.pop_front();
      }
      ++inflight[u];
    }
    return out;
  }
  Dispatch dispatch;
  int64_t calls;
  int max_inflight;
  std::vector<int> inflight;              // calls in flight per replica
  std::vector<int64_t> next_of;           // kEqualPerRank: each replica's next call
  int64_t next = 0;                       // kLeastLoaded: the next new call
  std::deque<int64_t> again;              // lost calls to send again
  std::map<int, std::future<void>> down;  // replica -> its revival
};

// The rows every tensor of a scattered batch has (the same for all; > 0).
int64_t batch_rows(const std::string& op, const std::vector<NamedTensor>& batch) {
  const int64_t rows = batch.front().tensor.dim() > 0 ? batch.front().tensor.size(0) : 0;
  TORCH_CHECK(rows > 0, "scatter \"", op, "\": tensor \"", batch.front().name,
              "\" has no rows to split");
  for (const auto& t : batch)
    TORCH_CHECK(t.tensor.dim() > 0 && t.tensor.size(0) == rows, "scatter \"", op, "\": tensor \"",
                t.name, "\" has shape ", t.tensor.sizes(), ", expected ", rows, " rows like \"",
                batch.front().name, "\"");
  return rows;
}

// Micro batch `chunk` (of `micro_batch_size` rows; the last may be shorter) of `batch` as a
// request for `op` with `args`.
Message micro_batch_request(const std::string& op, const nlohmann::json& args,
                            const std::vector<NamedTensor>& batch, int64_t chunk,
                            int64_t micro_batch_size) {
  Message request;
  request.op = op;
  request.args = args;
  const int64_t rows = batch.front().tensor.size(0), begin = chunk * micro_batch_size;
  const int64_t len = std::min(micro_batch_size, rows - begin);
  for (const auto& t : batch) request.add(t.name, t.tensor.narrow(0, begin, len));
  return request;
}

// The micro batches' replies as one: their args listed, their tensors concatenated by row.
Message gather_micro_batches(const std::string& op, const std::vector<Message>& results) {
  Message gathered;
  gathered.kind = MessageKind::kReply;
  gathered.op = op;
  gathered.args = {{"micro_batches", nlohmann::json::array()}};
  for (const auto& r : results) gathered.args["micro_batches"].push_back(r.args);
  for (const auto& first : results.front().tensors) {
    std::vector<at::Tensor> parts;
    for (size_t c = 0; c < results.size(); ++c) {
      TORCH_CHECK(results[c].has_tensor(first.name), "scatter \"", op, "\": micro batch ", c,
                  " reply lacks tensor \"", first.name, "\"");
      parts.push_back(results[c].tensor(first.name));
    }
    gathered.add(first.name, at::cat(parts, 0));
  }
  return gathered;
}

}  // namespace

Message RoleGroup::scatter(const std::string& op, const std::vector<NamedTensor>& batch,
                           int64_t micro_batch_size, const nlohmann::json& args, Timeout timeout,
                           Dispatch dispatch, const PartHandler& on_part) {
  TORCH_CHECK(!batch.empty(), "scatter \"", op, "\": empty batch");
  TORCH_CHECK(micro_batch_size > 0, "scatter \"", op, "\": micro_batch_size must be > 0, got ",
              micro_batch_size);
  const int64_t rows = batch_rows(op, batch);
  const auto until = deadline(timeout);
  const int64_t chunks = (rows + micro_batch_size - 1) / micro_batch_size;
  const int per = ranks_per_replica_;
  const int units = replicas();
  // Calls to make: one per micro batch, plus repeats of the last so that every replica gets
  // the same count (kEqualPerRank). Call c carries micro batch min(c, chunks - 1); each call
  // is one request to every rank of its replica.
  const int64_t calls =
      dispatch == Dispatch::kEqualPerRank ? (chunks + units - 1) / units * units : chunks;
  Dispatcher d(dispatch, units, calls, std::max(1, scheduler_.config().max_inflight));
  struct Owner {
    int64_t call;
    int replica;
    int member;  // rank within the replica
  };
  std::map<uint64_t, Owner> owner;                     // request id -> where it went
  std::map<int64_t, std::vector<Message>> replies_of;  // call -> its ranks' replies so far
  std::map<int64_t, int> answered;                     // call -> replies received
  std::vector<Message> results(chunks);
  int64_t done = 0;
  // Lost workers (set_revive): their calls run again, first, on the replicas that serve; a
  // lost replica is revived on its own thread meanwhile.
  const bool retries = revive_ && per == 1 && dispatch == Dispatch::kLeastLoaded;
  std::map<int64_t, int> parts_sent;  // call -> partial replies handed on
  while (done < calls) {
    for (const auto& [call, replica] : d.take()) {  // while a replica is below its bound
      const Message request =
          micro_batch_request(op, args, batch, std::min(call, chunks - 1), micro_batch_size);
      replies_of[call].resize(per);
      for (int m = 0; m < per; ++m)
        owner[scheduler_.submit(workers_[replica * per + m], request)] = {call, replica, m};
    }
    std::vector<uint64_t> waiting;
    for (const auto& [id, where] : owner) waiting.push_back(id);
    std::optional<Scheduler::Progress> got = next_progress(op, waiting, d.down, until);
    if (!got) continue;
    auto& [id, reply, partial] = *got;
    if (partial) {  // without a handler, or from another rank of the replica: not needed
      const Owner& o = owner.at(id);
      if (on_part && o.member == 0 && o.call < chunks) {
        ++parts_sent[o.call];
        on_part(o.call, std::move(reply));
      }
      continue;
    }
    const Owner o = owner.at(id);
    owner.erase(id);
    if (retries && is_worker_lost(reply) && !parts_sent.count(o.call)) {
      --d.inflight[o.replica];
      d.again.push_back(o.call);
      if (!d.down.count(o.replica))
        d.down[o.replica] =
            std::async(std::launch::async, [this, r = o.replica, until] { ready(r, until, true); });
      continue;
    }
    const int first_rank = o.replica * per;
    replies_of[o.call][o.member] = checked(reply, first_rank + o.member);
    if (++answered[o.call] < per) continue;
    std::vector<Message> all = std::move(replies_of[o.call]);
    replies_of.erase(o.call);
    answered.erase(o.call);
    for (int m = 1; m < per; ++m) check_same_reply(all[0], first_rank, all[m], first_rank + m);
    --d.inflight[o.replica];
    if (o.call < chunks) results[o.call] = std::move(all[0]);
    ++done;
    scheduler_.progress().count(std::string(role_name(role_)) + " " + op, done, calls);
  }
  return gather_micro_batches(op, results);
}

}  // namespace rlhf
