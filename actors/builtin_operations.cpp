// ping, echo, info.
#include "actors/builtin_operations.h"

#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "actors/device.h"
#include "transport/worker_ops.h"

namespace rlhf {
namespace {

Message ping(const ops::Ping&, const Message&, const WorkerIdentity& self) {
  return reply_message(ops::PingReply{self.role, self.rank});
}

// Returns the request's tensors and args, plus the rank that served it and how many echo
// calls this worker has served so far (`served`, this one included). `delay_ms` makes
// lower ranks answer later (delay_ms * (world_size - 1 - rank)) so tests can check that
// results are gathered in batch order, not arrival order.
Message echo(const Message& request, const WorkerIdentity& self) {
  static int64_t served = 0;  // a worker serves one request at a time
  ++served;
  int64_t delay_ms = request.args.value("delay_ms", int64_t{0});
  if (delay_ms > 0)
    std::this_thread::sleep_for(
        std::chrono::milliseconds(delay_ms * (self.world_size - 1 - self.rank)));
  Message reply;
  reply.args = request.args;
  reply.args["rank"] = self.rank;
  reply.args["served"] = served;
  reply.tensors = request.tensors;
  return reply;
}

Message info(const ops::Info&, const Message&, const WorkerIdentity& self) {
  rusage usage{};
  if (getrusage(RUSAGE_SELF, &usage) != 0) throw RuntimeError("getrusage failed");
  ops::InfoReply r;
  r.pid = static_cast<int64_t>(getpid());
  r.role = self.role;
  r.rank = self.rank;
  r.world_size = self.world_size;
  r.device = self.device;
  r.node = self.node;
  r.peak_rss_bytes = static_cast<int64_t>(usage.ru_maxrss) * 1024;
  // GPU workers: the CUDA caching allocator's peaks, overall and per operation.
  r.cuda = device_memory_log().to_json();
  return reply_message(r);
}

}  // namespace

void add_builtin_operations(OperationRegistry& registry) {
  registry.add<ops::Ping>(ping);
  registry.add("echo", echo);  // free args by design: it returns what it was sent
  registry.add<ops::Info>(info);
}

}  // namespace rlhf
