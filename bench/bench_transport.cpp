// Transport figures: throughput of 1, 16 and 256 MiB tensors between two processes over
// ZeroMQ ipc, tcp loopback and the shared-memory path, each as a ratio to memcpy of the same
// bytes here; small-message round-trip latency; the scheduler's own time per operation.
// Usage: bench_transport [path/to/rlhf]   (the rlhf binary, for the scheduler part)
// (bench_transport --serve ENDPOINT is the receiving process it starts itself.)
#include <ATen/ATen.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "actors/wire_version.h"
#include "bench/rank_processes.h"
#include "core/timing.h"
#include "scheduler/role_group.h"
#include "scheduler/scheduler.h"
#include "transport/channel.h"

using namespace rlhf;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {

const std::vector<size_t> kSizes = {size_t{1} << 20, size_t{16} << 20, size_t{256} << 20};

int reps_for(size_t bytes) {
  return bytes >= (size_t{256} << 20) ? 5 : bytes >= (size_t{16} << 20) ? 20 : 100;
}

// memcpy into an already-touched buffer: the ceiling any copy of these bytes can reach.
double memcpy_gbs(size_t bytes) {
  std::vector<char> src(bytes, 1), dst(bytes, 2);
  double best = 1e9;
  for (int r = 0; r < reps_for(bytes); ++r) {
    auto t0 = Clock::now();
    std::memcpy(dst.data(), src.data(), bytes);
    best = std::min(best, seconds_since(t0));
  }
  if (dst[bytes / 2] != 1) std::abort();
  return bytes / best / 1e9;
}

// memcpy into a fresh allocation each time (page faults included): what a receiver that
// keeps the bytes in new memory pays at least.
double memcpy_fresh_gbs(size_t bytes) {
  std::vector<char> src(bytes, 1);
  double total = 0;
  for (int r = 0; r < reps_for(bytes); ++r) {
    auto t0 = Clock::now();
    at::Tensor dst = at::empty({static_cast<int64_t>(bytes)}, at::kByte);
    std::memcpy(dst.data_ptr(), src.data(), bytes);
    total += seconds_since(t0);
  }
  return bytes / (total / reps_for(bytes)) / 1e9;
}

// The receiving process (--serve ENDPOINT): connects to the sender's endpoint and answers
// every message with a small ack after decoding (and so validating) it, until "stop".
int serve(const std::string& endpoint) {
  zmq::context_t ctx(1);
  Channel rep(ctx, zmq::socket_type::rep, milliseconds(0));
  rep.connect(endpoint);
  while (auto frames = rep.recv(std::nullopt)) {
    Message m = decode(std::move(*frames), MessageLimits{});
    if (m.op == "stop") return 0;
    Message ack;
    ack.kind = MessageKind::kReply;
    ack.args = {{"bytes", m.tensors.empty() ? 0 : m.tensors[0].tensor.nbytes()}};
    rep.send(ack);
  }
  return 0;
}

struct Peer {
  pid_t pid;
  zmq::context_t ctx{1};
  Channel req{ctx, zmq::socket_type::req, milliseconds(0)};
};

// Binds `bind_endpoint`, then starts this program as the receiver connecting to it.
std::unique_ptr<Peer> start_peer(const std::string& bind_endpoint) {
  auto peer = std::make_unique<Peer>();
  const std::string endpoint = peer->req.bind(bind_endpoint);
  peer->pid = bench::start_process({"/proc/self/exe", "--serve", endpoint});
  return peer;
}

void stop_peer(Peer& peer) {
  Message stop;
  stop.op = "stop";
  peer.req.send(stop);
  bench::wait_process(peer.pid, "the receiving process");
}

double round_trip(Peer& peer, const Message& m, const EncodeOptions& options) {
  auto t0 = Clock::now();
  peer.req.send(encode(m, options));
  auto reply = peer.req.recv(std::nullopt);
  const double s = seconds_since(t0);
  if (!reply) throw std::runtime_error("no ack");
  return s;
}

void throughput(const std::string& label, const std::string& endpoint, const EncodeOptions& options,
                const std::vector<double>& memcpy_rates) {
  auto peer = start_peer(endpoint);
  for (size_t i = 0; i < kSizes.size(); ++i) {
    Message m;
    m.op = "push";
    m.add("batch", at::ones({static_cast<int64_t>(kSizes[i])}, at::kByte));
    round_trip(*peer, m, options);  // warm-up: connection and allocator
    double best = 1e9, total = 0;
    for (int r = 0; r < reps_for(kSizes[i]); ++r) {
      const double s = round_trip(*peer, m, options);
      best = std::min(best, s);
      total += s;
    }
    const double mean = total / reps_for(kSizes[i]);
    const double gbs = kSizes[i] / mean / 1e9;
    std::printf("  %-5s %4zu MiB: mean %8.3f ms  best %8.3f ms  %6.2f GB/s  = %5.1f%% of memcpy\n",
                label.c_str(), kSizes[i] >> 20, mean * 1e3, best * 1e3, gbs,
                100 * gbs / memcpy_rates[i]);
  }
  stop_peer(*peer);
}

double latency(const std::string& label, const std::string& endpoint) {
  auto peer = start_peer(endpoint);
  Message m;
  m.op = "ping";
  m.add("x", at::zeros({2}, at::kInt));
  std::vector<double> t;
  for (int r = 0; r < 200; ++r) round_trip(*peer, m, {});
  for (int r = 0; r < 3000; ++r) t.push_back(round_trip(*peer, m, {}));
  std::sort(t.begin(), t.end());
  std::printf("  %-5s round trip (8-byte tensor + header): median %6.1f us  p99 %6.1f us\n",
              label.c_str(), t[t.size() / 2] * 1e6, t[t.size() * 99 / 100] * 1e6);
  stop_peer(*peer);
  return t[t.size() / 2];
}

void scheduler_overhead(const std::string& rlhf_path, double raw_ipc_round_trip) {
  WorkerPlacement w;
  w.role = Role::kRollout;
  w.node = "local";
  w.host = "127.0.0.1";
  w.env = {{kEnvRole, "rollout"}, {kEnvRank, "0"},     {kEnvWorldSize, "1"},
           {kEnvDevice, "cpu:0"}, {kEnvNode, "local"}, {"OMP_NUM_THREADS", "1"}};
  Placement p;
  p.workers = {w};
  SchedulerConfig c;
  c.run_dir = "/tmp/rlhf-bench-transport";
  c.worker_program = rlhf_path;
  c.wire_version = wire_version();
  Scheduler s(c, p);
  s.start();
  RoleGroup& g = s.group(Role::kRollout);
  for (int r = 0; r < 200; ++r) g.call_all("ping");
  std::vector<double> t;
  for (int r = 0; r < 3000; ++r) {
    auto t0 = Clock::now();
    g.call_all("ping");
    t.push_back(seconds_since(t0));
  }
  std::sort(t.begin(), t.end());
  std::printf("  scheduler call_all(\"ping\") on 1 worker (ipc): median %6.1f us  p99 %6.1f us\n",
              t[t.size() / 2] * 1e6, t[t.size() * 99 / 100] * 1e6);
  const double overhead = t[t.size() / 2] - raw_ipc_round_trip;
  std::printf(
      "  scheduler's own time per operation: %.1f us (median minus the raw ipc round trip);\n"
      "    a PPO step of ~100 operations taking 1 s would spend %.3f%% of it in the scheduler\n",
      overhead * 1e6, 100.0 * 100 * overhead / 1.0);
  // scatter of a 64-row batch in micro batches of 8 (8 requests) with tensors of 64 KiB per row.
  auto batch = at::randn({64, 16384});
  auto t0 = Clock::now();
  const int n = 50;
  for (int r = 0; r < n; ++r) g.scatter("echo", {{"x", batch}}, 8);
  std::printf(
      "  scheduler scatter(\"echo\") 64x64 KiB rows, micro batch 8: %6.2f ms per call (%.1f MB "
      "each way)\n",
      seconds_since(t0) / n * 1e3, batch.nbytes() / 1e6);
  s.shutdown();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "--serve") return serve(argv[2]);
  const std::string rlhf_path = argc > 1 ? argv[1] : "build/cli/rlhf";
  at::set_num_threads(1);
  std::printf("bench_transport: %ld cores\n", sysconf(_SC_NPROCESSORS_ONLN));
  std::vector<double> memcpy_rates;
  std::printf("memcpy (pre-touched destination, best of reps):\n");
  for (size_t b : kSizes) {
    memcpy_rates.push_back(memcpy_gbs(b));
    std::printf("  %4zu MiB: %6.2f GB/s   (into a fresh allocation each time, mean: %6.2f GB/s)\n",
                b >> 20, memcpy_rates.back(), memcpy_fresh_gbs(b));
  }
  const std::string ipc = "ipc:///tmp/rlhf-bench-" + std::to_string(getpid()) + ".sock";
  std::printf(
      "one tensor per message, sender -> receiver process, decoded there, small ack back:\n");
  throughput("ipc", ipc, {}, memcpy_rates);
  throughput("tcp", tcp_wildcard("127.0.0.1"), {}, memcpy_rates);
  throughput("shm", ipc, EncodeOptions{1 << 20}, memcpy_rates);
  std::printf("latency:\n");
  const double raw_ipc = latency("ipc", ipc);
  latency("tcp", tcp_wildcard("127.0.0.1"));
  std::printf("scheduler (driver -> I/O thread -> worker -> I/O thread -> driver):\n");
  scheduler_overhead(rlhf_path, raw_ipc);
  return 0;
}
