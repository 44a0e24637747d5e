// RoleGroup: fan-out, micro-batch scatter/gather with bounded in-flight requests.
#include "scheduler/role_group.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <map>

#include "scheduler/scheduler.h"

namespace rlhf {

RoleGroup::RoleGroup(Scheduler& scheduler, Role role, std::vector<size_t> worker_indices)
    : scheduler_(scheduler), role_(role), workers_(std::move(worker_indices)) {}

std::chrono::steady_clock::time_point RoleGroup::deadline(Timeout timeout) const {
  const auto limit = timeout.value_or(scheduler_.config().request_timeout);
  if (limit.count() <= 0) return std::chrono::steady_clock::time_point::max();
  return std::chrono::steady_clock::now() + limit;
}

Message RoleGroup::checked(const Message& reply, int rank) const {
  if (reply.kind != MessageKind::kError) return reply;
  const std::string what = std::string(role_name(role_)) + "[" + std::to_string(rank) +
                           "] operation \"" + reply.op + "\" failed: " + reply.error;
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
  TORCH_CHECK(rank >= 0 && rank < size(), role_name(role_), " has no rank ", rank);
  const uint64_t id = scheduler_.submit(workers_[rank], std::move(request));
  return checked(scheduler_.await_any({id}, deadline(timeout)).second, rank);
}

Dispatch dispatch_for(const JobSpec& spec, Role role) {
  // Trained roles at stage 3, and the ZeRO-3 reference or reward (sharded inference): each
  // forward all-gathers over the group, so every rank must make the same calls.
  const std::string r = role_name(role);
  const bool has_stage = spec.trains(role) || role == Role::kRef || role == Role::kReward;
  const bool sharded =
      has_stage && spec.get_int(r + ".zero_stage") == 3 && (spec.trains(role) || spec.uses(role));
  return sharded ? Dispatch::kEqualPerRank : Dispatch::kLeastLoaded;
}

Message RoleGroup::scatter(const std::string& op, const std::vector<NamedTensor>& batch,
                           int64_t micro_batch_size, const nlohmann::json& args, Timeout timeout,
                           Dispatch dispatch) {
  TORCH_CHECK(!batch.empty(), "scatter \"", op, "\": empty batch");
  TORCH_CHECK(micro_batch_size > 0, "scatter \"", op, "\": micro_batch_size must be > 0, got ",
              micro_batch_size);
  const int64_t rows = batch.front().tensor.dim() > 0 ? batch.front().tensor.size(0) : 0;
  TORCH_CHECK(rows > 0, "scatter \"", op, "\": tensor \"", batch.front().name,
              "\" has no rows to split");
  for (const auto& t : batch)
    TORCH_CHECK(t.tensor.dim() > 0 && t.tensor.size(0) == rows, "scatter \"", op, "\": tensor \"",
                t.name, "\" has shape ", t.tensor.sizes(), ", expected ", rows, " rows like \"",
                batch.front().name, "\"");
  const auto until = deadline(timeout);
  const int64_t chunks = (rows + micro_batch_size - 1) / micro_batch_size;
  const int ranks = size();
  // Calls to make: one per micro batch, plus repeats of the last so that every rank gets
  // the same count (kEqualPerRank). Call c carries micro batch min(c, chunks - 1).
  const int64_t calls =
      dispatch == Dispatch::kEqualPerRank ? (chunks + ranks - 1) / ranks * ranks : chunks;
  const int max_inflight = std::max(1, scheduler_.config().max_inflight);
  std::vector<int> inflight(ranks, 0);
  std::vector<int64_t> next_call_of_rank(ranks);  // kEqualPerRank: rank r makes calls r, r + R, ...
  for (int r = 0; r < ranks; ++r) next_call_of_rank[r] = r;
  std::map<uint64_t, std::pair<int64_t, int>> owner;  // request id -> (call, rank)
  std::vector<Message> results(chunks);
  int64_t next = 0, done = 0;
  const auto submit = [&](int64_t call, int rank) {
    Message request;
    request.op = op;
    request.args = args;
    const int64_t chunk = std::min(call, chunks - 1);
    const int64_t begin = chunk * micro_batch_size, len = std::min(micro_batch_size, rows - begin);
    for (const auto& t : batch) request.add(t.name, t.tensor.narrow(0, begin, len));
    owner[scheduler_.submit(workers_[rank], std::move(request))] = {call, rank};
    ++inflight[rank];
  };
  while (done < calls) {
    // Dispatch while some rank is below its in-flight bound.
    if (dispatch == Dispatch::kLeastLoaded) {
      while (next < calls) {
        const int rank =
            static_cast<int>(std::min_element(inflight.begin(), inflight.end()) - inflight.begin());
        if (inflight[rank] >= max_inflight) break;
        submit(next++, rank);
      }
    } else {
      for (int r = 0; r < ranks; ++r) {
        while (inflight[r] < max_inflight && next_call_of_rank[r] < calls) {
          submit(next_call_of_rank[r], r);
          next_call_of_rank[r] += ranks;
        }
      }
    }
    std::vector<uint64_t> waiting;
    for (const auto& [id, where] : owner) waiting.push_back(id);
    auto [id, reply] = scheduler_.await_any(waiting, until);
    const auto [call, rank] = owner.at(id);
    owner.erase(id);
    --inflight[rank];
    Message checked_reply = checked(reply, rank);
    if (call < chunks) results[call] = std::move(checked_reply);
    ++done;
    scheduler_.progress().count(std::string(role_name(role_)) + " " + op, done, calls);
  }
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

}  // namespace rlhf
