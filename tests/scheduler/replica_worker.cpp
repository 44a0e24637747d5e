// Test helper process for the scheduler's replica dispatch (RoleGroup::set_ranks_per_replica):
// a worker with the built-in operations and "replica_sum", which behaves as one rank of a
// tensor-parallel engine would: it joins its replica's Gloo group (the ranks t*e .. t*e+t-1,
// store "<store_path>_engine<e>", as rollout workers do) and all-reduces the sum of its
// request's "rows", so a micro batch that did not reach every rank of the replica at once
// never completes, and one that reached them with different rows is caught here.
// Args: "store_path", "ranks_per_replica" t, optional "fail_rank" (that rank throws after
// the collective) and "diverge_rank" (that rank replies its rows plus one).
// Reply: tensors "rows" and "sum" (the replica's all-reduced sum of rows), args "rank",
// "replica", "served" (replica_sum calls served by this process).
// Started by the scheduler with the environment `rlhf worker` gets. With the argument
// --token-in-config-only it drops RLHF_TOKEN from its environment once read, as a worker joined
// by `rlhf worker --join-file` holds the token in its config only.
#include <torch/types.h>

#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>

#include "actors/builtin_operations.h"
#include "actors/worker.h"
#include "core/errors.h"
#include "core/placement.h"
#include "transport/collective_group.h"

using namespace rlhf;

namespace {

Message replica_sum(const Message& request, const WorkerIdentity& self) {
  static std::map<std::string, std::unique_ptr<transport::CollectiveGroup>> groups;
  static int64_t served = 0;
  ++served;
  const int t = request.args.at("ranks_per_replica").get<int>();
  const int replica = self.rank / t;
  const std::string store =
      request.args.at("store_path").get<std::string>() + "_engine" + std::to_string(replica);
  auto& group = groups[store];
  if (!group) {
    transport::CollectiveConfig config;
    config.rank = self.rank % t;
    config.size = t;
    config.store_path = store;
    // A replica whose other ranks never got the call fails this test in 20 s, not 5 minutes.
    config.timeout = std::chrono::seconds(20);
    group = transport::make_collective_group(config);
  }
  const torch::Tensor rows = request.tensor("rows");
  torch::Tensor sum = rows.sum().to(torch::kDouble).reshape({1}).contiguous();
  const double own = sum.item<double>();
  group->all_reduce(sum, transport::ReduceOp::kSum);
  if (sum.item<double>() != own * t)
    throw RuntimeError("rank " + std::to_string(self.rank) +
                       ": the replica's ranks got other rows");
  if (request.args.value("fail_rank", -1) == self.rank)
    throw RuntimeError("failing on purpose (fail_rank)");
  Message reply;
  reply.args = {{"rank", self.rank}, {"replica", replica}, {"served", served}};
  reply.add("rows", request.args.value("diverge_rank", -1) == self.rank ? rows + 1 : rows);
  reply.add("sum", sum.expand({rows.size(0)}).contiguous());
  return reply;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    WorkerConfig config = WorkerConfig::from_env();
    if (argc > 1 && std::string(argv[1]) == "--token-in-config-only") ::unsetenv(kEnvToken);
    OperationRegistry registry;
    add_builtin_operations(registry);
    registry.add("replica_sum", replica_sum);
    return Worker(std::move(config), std::move(registry)).run();
  } catch (const std::exception& e) {
    std::cerr << "replica worker: " << e.what() << std::endl;
    return 1;
  }
}
