// Channels over real sockets: wildcard tcp binding reads the port back, multipart
// messages cross tcp and ipc bit-exact, receive timeouts give an empty optional.
#include "transport/channel.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include "transport/job_token.h"

namespace rlhf {
namespace {

using std::chrono::milliseconds;

void round_trip(const std::string& bind_endpoint) {
  zmq::context_t ctx(1);
  Channel server(ctx, zmq::socket_type::router), client(ctx, zmq::socket_type::dealer);
  const std::string endpoint = server.bind(bind_endpoint);
  EXPECT_EQ(endpoint.find('*'), std::string::npos) << endpoint;
  client.connect(endpoint);
  Message m;
  m.op = "echo";
  m.add("w", at::randn({64, 33}).to(at::kBFloat16)).add("ids", at::arange(100, at::kLong));
  client.send(m);
  auto frames = server.recv(milliseconds(5000));
  ASSERT_TRUE(frames.has_value());
  frames->erase(frames->begin());  // routing id
  Message back = decode(std::move(*frames), MessageLimits{});
  EXPECT_TRUE(at::equal(back.tensor("w"), m.tensor("w")));
  EXPECT_TRUE(at::equal(back.tensor("ids"), m.tensor("ids")));
}

TEST(Channel, TcpWildcardBindReadsThePortBack) {
  zmq::context_t ctx(1);
  Channel c(ctx, zmq::socket_type::router);
  const std::string endpoint = c.bind(tcp_wildcard("127.0.0.1"));
  ASSERT_EQ(endpoint.rfind("tcp://127.0.0.1:", 0), 0u) << endpoint;
  EXPECT_GT(std::stoi(endpoint.substr(endpoint.rfind(':') + 1)), 0);
}

TEST(Channel, TensorsCrossTcpBitExact) {
  round_trip(tcp_wildcard("127.0.0.1"));
}

TEST(Channel, TensorsCrossIpcBitExact) {
  round_trip("ipc:///tmp/rlhf-channel-test-" + std::to_string(getpid()) + ".sock");
}

TEST(Channel, RecvTimesOutWithEmptyOptional) {
  zmq::context_t ctx(1);
  Channel c(ctx, zmq::socket_type::pull);
  c.bind(tcp_wildcard("127.0.0.1"));
  EXPECT_FALSE(c.recv(milliseconds(20)).has_value());
}

TEST(JobToken, RandomAndComparedExactly) {
  const std::string a = make_job_token(), b = make_job_token();
  EXPECT_EQ(a.size(), 64u);
  EXPECT_NE(a, b);
  EXPECT_TRUE(token_matches(a, a));
  EXPECT_FALSE(token_matches(a, b));
  EXPECT_FALSE(token_matches(a, a.substr(0, 63)));
  EXPECT_FALSE(token_matches(a, ""));
  EXPECT_FALSE(token_matches("", ""));
}

}  // namespace
}  // namespace rlhf
