// Collective groups with real processes: N = 1, 2, 4 Gloo ranks meet through a file store
// or a TCP store hosted outside the group (as the scheduler does); every collective's result
// is checked against values computed here. The NCCL test needs a GPU (`*_CUDA`).
#include <ATen/cuda/Sleep.h>
#include <arpa/inet.h>
#include <c10/cuda/CUDAStream.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <torch/cuda.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <sstream>
#include <thread>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "core/errors.h"
#include "test_paths.h"
#include "tests/transport/child_process.h"
#include "transport/c10d_work.h"
#include "transport/collective_group.h"
#include "transport/job_token.h"
#include "transport/nccl_group.h"
#include "transport/store.h"

namespace fs = std::filesystem;
using rlhf::testing::ChildProcess;

namespace {

const std::string kWorker =
    std::string(RLHF_BINARY_DIR) + "/tests/transport/rlhf_collective_worker";

fs::path fresh_dir(const std::string& name) {
  fs::path dir =
      fs::temp_directory_path() / ("rlhf_collective_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::map<std::string, std::vector<double>> read_results(const fs::path& path) {
  std::map<std::string, std::vector<double>> results;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string name;
    words >> name;
    auto& values = results[name];  // a line without values ("done") still counts
    double v;
    while (words >> v) values.push_back(v);
  }
  return results;
}

// Runs `n` workers meeting through `store_args` (then "nccl": that backend, rank r on GPU r),
// then checks each rank's results.
void run_group(int n, const std::vector<std::string>& store_args, const fs::path& dir,
               bool nccl = false) {
  std::vector<std::unique_ptr<ChildProcess>> workers;
  for (int r = 0; r < n; ++r) {
    std::vector<std::string> argv{kWorker, std::to_string(r), std::to_string(n)};
    argv.insert(argv.end(), store_args.begin(), store_args.end());
    argv.push_back((dir / ("out" + std::to_string(r))).string());
    if (nccl) argv.push_back("nccl");
    workers.push_back(std::make_unique<ChildProcess>(argv, (dir / "log").string()));
  }
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(workers[r]->wait(std::chrono::seconds(60)), 0)
        << "rank " << r << ", log " << dir / "log";
  }
  const double s = n * (n + 1) / 2.0;  // sum over ranks of (r + 1)
  for (int r = 0; r < n; ++r) {
    auto got = read_results(dir / ("out" + std::to_string(r)));
    SCOPED_TRACE("rank " + std::to_string(r) + " of " + std::to_string(n));
    // All values are small integers or halves: exact in float and bf16, so compare exactly.
    EXPECT_EQ(got["rank"], std::vector<double>{double(r)});
    EXPECT_EQ(got["size"], std::vector<double>{double(n)});
    EXPECT_EQ(got["sum"], (std::vector<double>{s, 10 * s, -s}));
    EXPECT_EQ(got["max"], (std::vector<double>{double(n), 10.0 * n, -1.0}));
    std::vector<double> gather;
    for (int k = 0; k < n; ++k) gather.insert(gather.end(), {double(k), k + 0.5});
    EXPECT_EQ(got["gather"], gather);
    std::vector<double> gather3;
    for (int k = 0; k < n; ++k) gather3.insert(gather3.end(), {double(k), k + 0.25, k + 0.5});
    EXPECT_EQ(got["gather3"], gather3);
    std::vector<double> scatter;
    for (int i = 3 * r; i < 3 * r + 3; ++i) scatter.push_back(i * s);
    EXPECT_EQ(got["scatter"], scatter);
    EXPECT_EQ(got["bcast"], std::vector<double>(4, 100.0 + n - 1));
    EXPECT_EQ(got["scatter_from_root"], (std::vector<double>{double(r), 2.0 * r}));
    // all_to_all: rank k sent this rank (2k + r) % 3 rows [k * 10 + r, j], in rank order.
    std::vector<double> counts, a2a;
    for (int k = 0; k < n; ++k) {
      counts.push_back((2 * k + r) % 3);
      for (int j = 0; j < (2 * k + r) % 3; ++j) a2a.insert(a2a.end(), {k * 10.0 + r, double(j)});
    }
    EXPECT_EQ(got["a2a_counts"], counts);
    EXPECT_EQ(got["a2a"], a2a);
    if (nccl) {
      EXPECT_EQ(got["async"], (std::vector<double>{s, s, 1.0}));
    }
    EXPECT_EQ(got.count("done"), 1u);
  }
}

}  // namespace

class CollectiveGroupSizes : public ::testing::TestWithParam<int> {};

TEST_P(CollectiveGroupSizes, GlooFileStoreCollectivesGiveExactResults) {
  const int n = GetParam();
  fs::path dir = fresh_dir("file" + std::to_string(n));
  run_group(n, {"file", (dir / "store").string()}, dir);
}

INSTANTIATE_TEST_SUITE_P(Gloo, CollectiveGroupSizes,
                         ::testing::Values(1, 2, 3, 4));  // 3: odd byte counts

TEST(CollectiveGroup, GlooOverTcpStoreHostedOutsideTheGroup) {
  c10d::TCPStoreOptions options;
  options.port = 0;  // any free port; read back below
  options.isServer = true;
  options.waitWorkers = false;
  c10d::TCPStore host("127.0.0.1", options);
  ASSERT_GT(host.getPort(), 0);
  fs::path dir = fresh_dir("tcp");
  run_group(2, {"tcp", std::to_string(host.getPort())}, dir);
}

TEST(CollectiveGroup, GlooOverTcpStoreHostedByRankZero) {
  // A port free a moment ago (the OS picks it; a clash in between would fail loudly).
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  ::close(fd);
  fs::path dir = fresh_dir("tcp0");
  run_group(2, {"tcp0", std::to_string(ntohs(addr.sin_port))}, dir);
}

TEST(StoreServer, TwoGroupsMeetAtOnceUnderTheirOwnPrefixes) {
  // The scheduler's way: one server, every group a prefix of it. Two 2-rank groups join at
  // the same time; were the prefixes not kept apart, their ranks would mix and fail.
  // The workers prove the job token, which they take from RLHF_TOKEN as a job's workers do.
  const std::string token = rlhf::make_job_token();
  ASSERT_EQ(::setenv("RLHF_TOKEN", token.c_str(), 1), 0);
  rlhf::transport::StoreServer server("127.0.0.1", 0, 0, token);
  ASSERT_GT(server.port(), 0);
  fs::path a = fresh_dir("server_a"), b = fresh_dir("server_b");
  std::vector<std::unique_ptr<ChildProcess>> workers;
  for (const auto& [dir, group] : {std::pair{a, "actor"}, std::pair{b, "critic"}})
    for (int r = 0; r < 2; ++r)
      workers.push_back(std::make_unique<ChildProcess>(
          std::vector<std::string>{kWorker, std::to_string(r), "2", "file",
                                   server.url("127.0.0.1", group).text(),
                                   (dir / ("out" + std::to_string(r))).string()},
          (dir / "log").string()));
  for (size_t i = 0; i < workers.size(); ++i)
    ASSERT_EQ(workers[i]->wait(std::chrono::seconds(60)), 0)
        << "worker " << i << ", logs in " << a << " and " << b;
  for (const auto& dir : {a, b})
    for (int r = 0; r < 2; ++r) {
      auto got = read_results(dir / ("out" + std::to_string(r)));
      EXPECT_EQ(got["rank"], std::vector<double>{double(r)});
      EXPECT_EQ(got["sum"], (std::vector<double>{3, 30, -3}));
      EXPECT_EQ(got.count("done"), 1u);
    }
  EXPECT_EQ(server.admitted(), 4);  // one connection per worker, each with the token
  EXPECT_EQ(server.refused(), 0);
  ::unsetenv("RLHF_TOKEN");
}

TEST(StoreServer, TakesTheFirstFreePortOfItsRange) {
  uint16_t taken = 0;
  const int fd = rlhf::transport::listen_on_port_range("127.0.0.1", 0, 0, taken);
  ASSERT_GE(fd, 0);
  // The range starts at a port in use: the server must skip it (or the range is too high).
  if (taken >= 65535) {
    ::close(fd);
    GTEST_SKIP() << "the OS gave the last port; no range above it to test";
  }
  rlhf::transport::StoreServer server("127.0.0.1", taken, static_cast<uint16_t>(taken + 1),
                                      "token");
  EXPECT_EQ(server.port(), taken + 1);
  EXPECT_THROW(rlhf::transport::StoreServer("127.0.0.1", taken, taken, "token"),
               rlhf::RuntimeError);
  ::close(fd);
}

TEST(StoreServer, StoreUrlsParseAndBadOnesNameTheAddress) {
  auto url = rlhf::transport::parse_store_url("tcp://node-1:29500/weight_sync");
  ASSERT_TRUE(url);
  EXPECT_EQ(url->host, "node-1");
  EXPECT_EQ(url->port, 29500);
  EXPECT_EQ(url->group, "weight_sync");
  EXPECT_EQ(url->text(), "tcp://node-1:29500/weight_sync");
  EXPECT_FALSE(rlhf::transport::parse_store_url("/tmp/run/stores/actor.store"));
  for (const char* bad : {"tcp://node-1/actor", "tcp://node-1:0/actor", "tcp://node-1:29500",
                          "tcp://node-1:http/actor"}) {
    try {
      rlhf::transport::parse_store_url(bad);
      ADD_FAILURE() << bad << " parsed";
    } catch (const rlhf::InputError& e) {
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  }
}

TEST(StoreServer, UnreachableStoreNamesItsAddress) {
  uint16_t port = 0;
  const int fd = rlhf::transport::listen_on_port_range("127.0.0.1", 0, 0, port);
  ::close(fd);  // nothing listens there now
  rlhf::transport::CollectiveConfig config;
  config.store_path = "tcp://127.0.0.1:" + std::to_string(port) + "/actor";
  config.token = "token";
  config.timeout = std::chrono::milliseconds(1500);
  try {
    rlhf::transport::make_collective_group(config);
    FAIL() << "joined a group at a store nobody serves";
  } catch (const rlhf::RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find(config.store_path), std::string::npos) << e.what();
  }
}

TEST(CollectiveGroup, MissingPeerTimesOutWithRankInError) {
  // Rank 0 of 2 waits for a rank 1 that never comes: it must fail, naming its rank.
  fs::path dir = fresh_dir("timeout");
  rlhf::transport::CollectiveConfig config;
  config.rank = 0;
  config.size = 2;
  config.store_path = (dir / "store").string();
  config.timeout = std::chrono::milliseconds(1500);
  try {
    auto group = rlhf::transport::make_collective_group(config);
    FAIL() << "joined a group whose peer never started";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0/2"), std::string::npos) << e.what();
  }
}

// Issue 45.3: a collective whose peer joined but hangs fails at fault.collective_timeout_s,
// which the scheduler hands every worker as RLHF_COLLECTIVE_TIMEOUT_MS (the default of
// CollectiveConfig::timeout), as a CollectiveFailure naming the rank and the operation.
TEST(CollectiveGroup, AHungPeerFailsTheCollectiveAtTheTimeoutTheSchedulerSet) {
  fs::path dir = fresh_dir("hung-peer");
  ::setenv(rlhf::transport::kEnvCollectiveTimeout, "1200", 1);
  rlhf::transport::CollectiveConfig config;
  ::unsetenv(rlhf::transport::kEnvCollectiveTimeout);
  EXPECT_EQ(config.timeout, std::chrono::milliseconds(1200));
  EXPECT_EQ(rlhf::transport::CollectiveConfig{}.timeout, std::chrono::minutes(5)) << "unset";
  config.size = 2;
  config.store_path = (dir / "store").string();
  std::promise<void> joined, release;
  std::thread peer([&, config]() mutable {
    config.rank = 1;
    auto group = rlhf::transport::make_collective_group(config);
    joined.set_value();
    release.get_future().wait();  // never calls the all-reduce: a hang
  });
  config.rank = 0;
  auto group = rlhf::transport::make_collective_group(config);
  joined.get_future().wait();
  auto t = torch::ones({4});
  const auto t0 = std::chrono::steady_clock::now();
  try {
    group->all_reduce(t, rlhf::transport::ReduceOp::kSum);
    ADD_FAILURE() << "an all-reduce without its peer returned";
  } catch (const rlhf::transport::CollectiveFailure& e) {
    EXPECT_NE(std::string(e.what()).find("gloo all_reduce: rank 0/2"), std::string::npos)
        << e.what();
  }
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GT(waited, 1.0);
  EXPECT_LT(waited, 30.0) << "the timeout, not the 5-minute default";
  release.set_value();
  peer.join();
}

TEST(CollectiveGroup, BadRankIsInputError) {
  rlhf::transport::CollectiveConfig config;
  config.rank = 3;
  config.size = 2;
  config.store_path = "/tmp/unused";
  EXPECT_THROW(rlhf::transport::make_collective_group(config), rlhf::InputError);
}

// Issue 39.1.1: torch 2.11's ProcessGroupNCCL returns no Work for a collective launched with
// asyncOp false, and both backends finish every collective through wait_if_any. A null handle
// must be accepted (the old `launch()->wait()` dereferenced it: every synchronous NCCL
// collective crashed); a real handle must be waited on exactly once, and its failure thrown.
TEST(CollectiveGroup, CollectivesWithoutAWorkHandleNeedNoWait) {
  struct CountingWork : c10d::Work {
    int waits = 0;
    bool fail = false;
    bool wait(std::chrono::milliseconds) override {
      ++waits;
      if (fail) throw std::runtime_error("peer gone");
      return true;
    }
  };
  EXPECT_FALSE(rlhf::transport::wait_if_any(c10::intrusive_ptr<c10d::Work>()));
  auto work = c10::make_intrusive<CountingWork>();
  EXPECT_TRUE(rlhf::transport::wait_if_any(work));
  EXPECT_EQ(work->waits, 1);
  work->fail = true;
  EXPECT_THROW(rlhf::transport::wait_if_any(work), std::runtime_error);
}

TEST(CollectiveGroup, NcclOneRankCollectives_CUDA) {
  if (!torch::cuda::is_available())
    GTEST_SKIP() << "no CUDA device (this LibTorch or machine has none)";
  const fs::path dir = fresh_dir("nccl");
  rlhf::transport::CollectiveConfig config;
  config.backend = rlhf::transport::CollectiveBackend::kNccl;
  config.store_path = (dir / "store").string();
  auto group = rlhf::transport::make_collective_group(config);
  auto t = torch::arange(4, torch::TensorOptions(torch::kFloat).device(torch::kCUDA));
  group->all_reduce(t, rlhf::transport::ReduceOp::kSum);
  EXPECT_TRUE(torch::equal(t.cpu(), torch::arange(4, torch::kFloat)));
  auto gathered = torch::empty({4}, t.options());
  group->all_gather(gathered, t);
  EXPECT_TRUE(torch::equal(gathered.cpu(), torch::arange(4, torch::kFloat)));
  auto piece = torch::zeros({4}, t.options());  // scatter: the root's own slot
  group->scatter(piece, {t * 2}, 0);
  EXPECT_TRUE(torch::equal(piece.cpu(), torch::arange(4, torch::kFloat) * 2));
  group->barrier();
}

// Issue 32.4: a collective is enqueued on torch's current stream and returns without waiting
// for the device. A sleep kernel of ~0.5 s holds the stream: every call returns while it
// still runs (the stream is busy right after), and the results read afterwards (a copy to
// the host, in stream order) are right. Only barrier() waits for the device.
TEST(CollectiveGroup, NcclCollectivesQueueOnTheCurrentStreamWithoutHostSync_CUDA) {
  if (!torch::cuda::is_available())
    GTEST_SKIP() << "no CUDA device (this LibTorch or machine has none)";
  const fs::path dir = fresh_dir("nccl_stream");
  rlhf::transport::CollectiveConfig config;
  config.backend = rlhf::transport::CollectiveBackend::kNccl;
  config.store_path = (dir / "store").string();
  auto group = rlhf::transport::make_collective_group(config);
  const auto cuda = torch::TensorOptions(torch::kFloat).device(torch::kCUDA);
  auto t = torch::arange(4, cuda);
  auto gathered = torch::empty({4}, cuda);
  auto piece = torch::zeros({4}, cuda);
  group->barrier();
  auto stream = c10::cuda::getCurrentCUDAStream();
  at::cuda::sleep(int64_t{1} << 30);  // ~0.5 s at 2 GHz
  const auto start = std::chrono::steady_clock::now();
  group->all_reduce(t, rlhf::transport::ReduceOp::kSum);
  group->all_gather(gathered, t);
  group->broadcast(t, 0);
  group->scatter(piece, {t * 2}, 0);
  auto pending =
      rlhf::transport::all_reduce_async(*group, gathered, rlhf::transport::ReduceOp::kMax);
  pending->wait();
  const double host_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_FALSE(stream.query()) << "the collectives waited for the device";
  EXPECT_LT(host_s, 0.1);
  EXPECT_TRUE(torch::equal(gathered.cpu(), torch::arange(4, torch::kFloat)));
  EXPECT_TRUE(torch::equal(piece.cpu(), torch::arange(4, torch::kFloat) * 2));
  at::cuda::sleep(int64_t{1} << 28);
  group->barrier();
  EXPECT_TRUE(stream.query()) << "barrier returned before the device was done";
}

// Two ranks on two GPUs, every collective (CPU tensors staged) and an all_reduce_async
// overlapped with a matmul: exact results on both ranks. `_CUDA2`: needs two GPUs, so a
// one-GPU machine skips it by design (scripts/gpu-test and gpu-check do not count it).
TEST(CollectiveGroup, NcclTwoRanksCollectivesAndAsyncAllReduce_CUDA2) {
  if (!torch::cuda::is_available() || torch::cuda::device_count() < 2)
    GTEST_SKIP() << "needs two CUDA devices (NCCL refuses two ranks on one GPU)";
  fs::path dir = fresh_dir("nccl2");
  run_group(2, {"file", (dir / "store").string()}, dir, /*nccl=*/true);
}
