// The job's rendezvous store admits only clients that prove the job token: a client with the
// token gets c10d's store semantics and a Gloo group forms through it; a client with a wrong
// token, c10d's own TCPStore client (which has no token to offer) and a raw socket that
// skips the proof are refused and see nothing; the server listens on the address it was
// given only; and a client never talks to a store that is not this job's.
#include <arpa/inet.h>
#include <dirent.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <thread>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "core/errors.h"
#include "transport/auth_store.h"
#include "transport/collective_group.h"
#include "transport/job_token.h"
#include "transport/store.h"

namespace {

using rlhf::transport::AuthStoreClient;
using rlhf::transport::StoreServer;
using std::chrono::milliseconds;

std::vector<uint8_t> bytes(const std::string& s) {
  return {s.begin(), s.end()};
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

// A TCP connection to 127.0.0.1:port (-1 on failure).
int raw_connect(const char* address, uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  ::inet_pton(AF_INET, address, &addr.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  timeval limit{10, 0};  // a reply that never comes fails the test instead of hanging it
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
  return fd;
}

// Everything the peer sends until it closes (or 10 s pass).
std::string read_to_end(int fd) {
  std::string all;
  char buf[256];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0) all.append(buf, static_cast<size_t>(n));
  return all;
}

TEST(StoreAuth, AClientWithTheTokenGetsTcpStoreSemantics) {
  const std::string token = rlhf::make_job_token();
  StoreServer server("127.0.0.1", 0, 0, token);
  AuthStoreClient a("127.0.0.1", server.port(), token, milliseconds(5000));
  auto b = a.clone();  // a second connection, as c10d clones stores
  a.set("id", bytes("nccl-unique-id"));
  EXPECT_EQ(b->get("id"), bytes("nccl-unique-id"));
  EXPECT_EQ(a.add("n", 3), 3);
  EXPECT_EQ(b->add("n", 4), 7);
  EXPECT_EQ(a.get("n"), bytes("7"));  // decimal text, as c10d's TCPStore keeps counters
  // compareSet: an absent key is set only when `expected` is empty; returns the value now.
  EXPECT_EQ(a.compareSet("c", bytes("x"), bytes("y")), bytes("x"));
  EXPECT_FALSE(a.check({"c"}));
  EXPECT_EQ(a.compareSet("c", {}, bytes("y")), bytes("y"));
  EXPECT_EQ(a.compareSet("c", bytes("z"), bytes("w")), bytes("y"));
  EXPECT_EQ(a.compareSet("c", bytes("y"), bytes("w")), bytes("w"));
  EXPECT_TRUE(a.check({"id", "n", "c"}));
  EXPECT_EQ(a.getNumKeys(), 3);
  EXPECT_TRUE(a.deleteKey("c"));
  EXPECT_FALSE(a.deleteKey("c"));
  EXPECT_EQ(a.getNumKeys(), 2);
  // A get blocks until another client sets the key.
  std::thread later([&] {
    std::this_thread::sleep_for(milliseconds(200));
    b->set("late", bytes("here"));
  });
  EXPECT_EQ(a.get("late"), bytes("here"));
  later.join();
  // A wait for a key nobody sets ends at its timeout with c10d's store error.
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(a.wait({"never"}, milliseconds(300)), c10::DistStoreError);
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(300));
  EXPECT_NE(error_of([&] { a.wait({"never"}, milliseconds(100)); }).find("waiting for never"),
            std::string::npos);
  EXPECT_EQ(server.admitted(), 2);
  EXPECT_EQ(server.refused(), 0);
}

TEST(StoreAuth, AWrongTokenIsRefusedAndSeesNothing) {
  const std::string token = rlhf::make_job_token();
  StoreServer server("127.0.0.1", 0, 0, token);
  AuthStoreClient job("127.0.0.1", server.port(), token, milliseconds(5000));
  job.set("rlhf_nccl_unique_id", bytes("secret"));
  for (const std::string& wrong : {rlhf::make_job_token(), token.substr(0, 63), std::string("x")}) {
    const std::string error =
        error_of([&] { AuthStoreClient("127.0.0.1", server.port(), wrong, milliseconds(5000)); });
    EXPECT_NE(error.find("rendezvous store 127.0.0.1:" + std::to_string(server.port()) +
                         ": the store refused this client: wrong or missing job token"),
              std::string::npos)
        << error;
  }
  EXPECT_EQ(server.refused(), 3);
  EXPECT_EQ(server.admitted(), 1);
  EXPECT_EQ(job.getNumKeys(), 1);  // nothing was written by the refused clients
  // A client with no token at all does not even try.
  EXPECT_THROW(AuthStoreClient("127.0.0.1", server.port(), "", milliseconds(1000)),
               rlhf::InputError);
}

TEST(StoreAuth, CollectiveConfigWithAWrongTokenCannotJoinAGroup) {
  const std::string token = rlhf::make_job_token();
  StoreServer server("127.0.0.1", 0, 0, token);
  rlhf::transport::CollectiveConfig config;
  config.store_path = server.url("127.0.0.1", "actor").text();
  config.token = rlhf::make_job_token();
  config.timeout = milliseconds(5000);
  const std::string error = error_of([&] { rlhf::transport::make_collective_group(config); });
  EXPECT_NE(error.find("cannot open the store " + config.store_path), std::string::npos) << error;
  EXPECT_NE(error.find("wrong or missing job token"), std::string::npos) << error;
  EXPECT_EQ(server.refused(), 1);
}

TEST(StoreAuth, C10dTcpStoreClientHasNoTokenAndIsRefused) {
  // What anyone who reaches the port could run: c10d's own client, as torchrun's workers do.
  const std::string token = rlhf::make_job_token();
  StoreServer server("127.0.0.1", 0, 0, token);
  c10d::TCPStoreOptions options;
  options.port = server.port();
  options.isServer = false;
  options.waitWorkers = false;
  options.timeout = milliseconds(3000);
  const std::string error = error_of([&] {
    c10d::TCPStore intruder("127.0.0.1", options);
    intruder.set("rlhf_nccl_unique_id", bytes("forged"));
  });
  EXPECT_NE(error, "(no error)");
  // The server counts the refusal once the intruder hangs up (it had no proof to send).
  for (int i = 0; i < 100 && server.refused() == 0; ++i)
    std::this_thread::sleep_for(milliseconds(100));
  EXPECT_GE(server.refused(), 1) << error;  // c10d's client retries: once per attempt
  EXPECT_EQ(server.admitted(), 0);
  // It fails on the greeting: its ping reads our magic instead of its own nonce.
  EXPECT_NE(error.find("Ping failed, invalid value returned from server"), std::string::npos)
      << error;
  AuthStoreClient job("127.0.0.1", server.port(), token, milliseconds(5000));
  EXPECT_FALSE(job.check({"rlhf_nccl_unique_id"}));
  EXPECT_EQ(job.getNumKeys(), 0);
}

TEST(StoreAuth, ARawSocketThatSkipsTheProofGetsOnlyTheRefusal) {
  const std::string token = rlhf::make_job_token();
  StoreServer server("127.0.0.1", 0, 0, token);
  // A forged proof (zeros): the greeting, then status 1 and the reason, then the server closes.
  int fd = raw_connect("127.0.0.1", server.port());
  ASSERT_GE(fd, 0);
  const std::string zeros(64, '\0');
  ASSERT_EQ(::send(fd, zeros.data(), zeros.size(), MSG_NOSIGNAL), 64);
  std::string got = read_to_end(fd);
  ::close(fd);
  ASSERT_EQ(got.size(), 10u + 32u + 1u + 4u + 26u) << got;
  EXPECT_EQ(got.substr(0, 10), "RLHFSTORE1");
  EXPECT_EQ(got[42], 1);
  EXPECT_EQ(got.substr(47), "wrong or missing job token");
  // A request sent straight away (op 1 = set, as if it were admitted) is taken as a bad proof.
  fd = raw_connect("127.0.0.1", server.port());
  ASSERT_GE(fd, 0);
  // op 1, wait 0 (8 bytes), 2 fields, "k" and "v" (u32 length + byte each): 23 bytes.
  std::string request = {1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 1, 'k', 0, 0, 0, 1, 'v'};
  request.resize(64, '\0');
  ASSERT_EQ(::send(fd, request.data(), request.size(), MSG_NOSIGNAL), 64);
  got = read_to_end(fd);
  ::close(fd);
  EXPECT_EQ(got.substr(47), "wrong or missing job token");
  EXPECT_EQ(server.refused(), 2);
  AuthStoreClient job("127.0.0.1", server.port(), token, milliseconds(5000));
  EXPECT_EQ(job.getNumKeys(), 0);
}

TEST(StoreAuth, TheServerListensOnItsAddressOnly) {
  // 127.0.0.2 is loopback too on Linux, so a wildcard listener would answer there.
  const std::string token = rlhf::make_job_token();
  StoreServer server("127.0.0.1", 0, 0, token);
  const int other = raw_connect("127.0.0.2", server.port());
  if (other >= 0) ::close(other);
  EXPECT_LT(other, 0) << "127.0.0.2:" << server.port() << " accepted a connection";
  const std::string error =
      error_of([&] { AuthStoreClient("127.0.0.2", server.port(), token, milliseconds(500)); });
  EXPECT_NE(error.find("rendezvous store 127.0.0.2:" + std::to_string(server.port()) +
                       ": cannot connect: Connection refused"),
            std::string::npos)
      << error;
  AuthStoreClient("127.0.0.1", server.port(), token, milliseconds(5000));  // the bound one works
  EXPECT_EQ(server.admitted(), 1);
}

TEST(StoreAuth, AClientNeverTalksToAStoreThatIsNotThisJobs) {
  // A c10d TCPStore server where the job's store should be: it sends no greeting, so the client
  // gives up within its timeout without having sent the token or anything derived from it.
  c10d::TCPStoreOptions options;
  options.port = 0;
  options.isServer = true;
  options.waitWorkers = false;
  c10d::TCPStore foreign("127.0.0.1", options);
  const std::string error = error_of(
      [&] { AuthStoreClient("127.0.0.1", foreign.getPort(), "token", milliseconds(1000)); });
  EXPECT_NE(error.find("no proof exchange with the store (timed out)"), std::string::npos) << error;
}

// The local addresses of the listening TCP sockets this process holds (from /proc).
std::multiset<std::string> listening_addresses() {
  std::set<std::string> inodes;
  DIR* dir = ::opendir("/proc/self/fd");
  while (dirent* e = dir ? ::readdir(dir) : nullptr) {
    char target[128] = {};
    const std::string link = std::string("/proc/self/fd/") + e->d_name;
    if (::readlink(link.c_str(), target, sizeof target - 1) > 0 &&
        std::string(target).rfind("socket:[", 0) == 0)
      inodes.insert(std::string(target).substr(8, std::strlen(target) - 9));
  }
  if (dir) ::closedir(dir);
  std::multiset<std::string> found;
  for (const char* table : {"/proc/self/net/tcp", "/proc/self/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream words(line);
      std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
      words >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >>
          timeout >> inode;
      if (state == "0A" && inodes.count(inode))  // 0A: TCP_LISTEN
        found.insert(local.substr(0, local.find(':')));
    }
  }
  return found;
}

TEST(StoreAuth, StoreAndGlooListenOnTheJobsAddressOnly) {
  // Two Gloo ranks (threads) meet through the store on 127.0.0.1 and sum a tensor; while the
  // group lives, every listening socket of this process (the store's and Gloo's) is bound to
  // 127.0.0.1 (0100007F in /proc/net/tcp), none to the wildcard.
  const std::string token = rlhf::make_job_token();
  StoreServer server("127.0.0.1", 0, 0, token);
  std::vector<std::unique_ptr<rlhf::transport::CollectiveGroup>> groups(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      rlhf::transport::CollectiveConfig config;
      config.rank = r;
      config.size = 2;
      config.store_path = server.url("127.0.0.1", "bind").text();
      config.token = token;
      config.host = "127.0.0.1";
      config.timeout = milliseconds(30000);
      groups[r] = rlhf::transport::make_collective_group(config);
    });
  for (auto& t : ranks) t.join();
  ASSERT_TRUE(groups[0] && groups[1]);
  std::vector<torch::Tensor> sums{torch::ones({3}), torch::ones({3}) * 2};
  std::vector<std::thread> reduce;
  for (int r = 0; r < 2; ++r)
    reduce.emplace_back(
        [&, r] { groups[r]->all_reduce(sums[r], rlhf::transport::ReduceOp::kSum); });
  for (auto& t : reduce) t.join();
  EXPECT_TRUE(torch::equal(sums[0], torch::full({3}, 3.0f)));
  const auto addresses = listening_addresses();
  EXPECT_GE(addresses.size(), 3u) << "expected the store's and each Gloo rank's listener";
  for (const auto& a : addresses) EXPECT_EQ(a, "0100007F") << "a listener bound elsewhere";
  EXPECT_EQ(server.admitted(), 2);
}

}  // namespace
