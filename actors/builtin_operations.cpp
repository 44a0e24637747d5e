// ping, echo, info.
#include "actors/builtin_operations.h"

#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "actors/device.h"

namespace rlhf {
namespace {

Message ping(const Message&, const WorkerIdentity& self) {
  Message reply;
  reply.args = {{"role", self.role}, {"rank", self.rank}};
  return reply;
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

Message info(const Message&, const WorkerIdentity& self) {
  rusage usage{};
  if (getrusage(RUSAGE_SELF, &usage) != 0) throw RuntimeError("getrusage failed");
  Message reply;
  reply.args = {{"pid", static_cast<int64_t>(getpid())},
                {"role", self.role},
                {"rank", self.rank},
                {"world_size", self.world_size},
                {"device", self.device},
                {"node", self.node},
                {"peak_rss_bytes", static_cast<int64_t>(usage.ru_maxrss) * 1024}};
  // GPU workers: the CUDA caching allocator's peaks, overall and per operation.
  if (auto cuda = device_memory_log().to_json(); !cuda.is_null()) reply.args["cuda"] = cuda;
  return reply;
}

}  // namespace

void add_builtin_operations(OperationRegistry& registry) {
  registry.add("ping", ping);
  registry.add("echo", echo);
  registry.add("info", info);
}

}  // namespace rlhf
