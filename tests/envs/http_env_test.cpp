// HTTP environments against a real local server (tests/envs/http_env_server.py, started by
// the test with the venv's Python): the protocol, answers out of order, a per-call timeout,
// an HTTP error, and a URL that refuses connections.
#include "envs/http_env.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <set>

#include "core/errors.h"
#include "test_paths.h"
#include "tests/envs/process_checks.h"
#include "tests/support/http_env_server.h"

namespace rlhf::envs {
namespace {

using nlohmann::json;
using testing::children_of_this_process;
using testing::message_of;

// The test server, started and stopped (killed, reaped) by the fixture.
class HttpEnvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    children_before_ = children_of_this_process();
    server_ = std::make_unique<test::HttpEnvServer>();
    ASSERT_GT(server_->port(), 0) << "the test server did not start";
    url_ = server_->url();
  }
  void TearDown() override {
    server_.reset();  // killed and reaped
    EXPECT_EQ(children_of_this_process(), children_before_);
  }
  EnvironmentConfig config(double timeout_s = 30) const {
    EnvironmentConfig c;
    c.url = url_;
    c.timeout_s = timeout_s;
    return c;
  }
  static std::vector<std::pair<int64_t, Observation>> wait_for(Environment& env, size_t n) {
    std::vector<std::pair<int64_t, Observation>> got;
    for (int i = 0; i < 600 && got.size() < n; ++i) {
      for (auto& r : env.poll(0.1)) got.push_back(std::move(r));
    }
    EXPECT_EQ(got.size(), n);
    return got;
  }

  std::unique_ptr<test::HttpEnvServer> server_;
  std::string url_;
  std::set<pid_t> children_before_;
};

TEST_F(HttpEnvTest, StepsFollowTheProtocolAndAnswerOutOfOrder) {
  HttpEnvironment env(config());
  EXPECT_EQ(env.name(), url_);
  env.reset(0, {{"label", "A"}});
  env.reset(1, {{"label", "B"}});
  env.step(0, "slow");  // answered after 0.5 s
  env.step(1, "fast");  // at once: overtakes trajectory 0
  const auto got = wait_for(env, 2);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].first, 1);
  EXPECT_EQ(got[1].first, 0);
  EXPECT_EQ(got[0].second.text, "B fast 1");
  EXPECT_EQ(got[1].second.text, "A slow 1");
  EXPECT_EQ(got[0].second.role, "user");
  EXPECT_EQ(got[0].second.reward, 0.5);
  EXPECT_EQ(got[0].second.tool_calls, 1);
  EXPECT_FALSE(got[0].second.done);

  env.step(1, "stop");
  const auto last = wait_for(env, 1);
  ASSERT_EQ(last.size(), 1u);
  EXPECT_EQ(last[0].second.text, "B stop 2");  // the server kept trajectory 1's state
  EXPECT_TRUE(last[0].second.done);
  env.close(0);
  env.close(1);
  EXPECT_TRUE(env.poll(1).empty());
}

// /reset's {"observation": str} comes back from poll_resets ("" for null); /step's body
// carries the turn's tool calls parsed in env.options.tool_format (the server echoes them).
TEST_F(HttpEnvTest, ResetObservationsAndParsedToolCalls) {
  EnvironmentConfig c = config();
  c.options = {{"tool_format", "llama3"}};
  HttpEnvironment env(c);
  env.reset(0, {{"secret", 7}});
  env.reset(1, {{"label", "tools"}});
  std::map<int64_t, std::string> resets;
  for (int i = 0; i < 600 && resets.size() < 2; ++i)
    for (auto& [id, text] : env.poll_resets(0.1)) resets[id] = text;
  EXPECT_EQ(resets, (std::map<int64_t, std::string>{{0, "The secret is 7."}, {1, ""}}));
  EXPECT_TRUE(env.poll_resets(1).empty());
  env.step(0, "I read: The secret is 7.");
  env.step(1, R"({"name": "calculator", "parameters": {"expression": "1+1"}})");
  std::map<int64_t, Observation> got;
  for (auto& [id, obs] : wait_for(env, 2)) got[id] = obs;
  EXPECT_EQ(got[0].reward, 1.0);
  const json calls = json::parse(got[1].text);
  ASSERT_EQ(calls.size(), 1u) << got[1].text;
  EXPECT_EQ(calls[0]["name"], "calculator");
  EXPECT_EQ(calls[0]["arguments"], json({{"expression", "1+1"}}));
  env.close(0);
  env.close(1);
}

TEST_F(HttpEnvTest, MoreTrajectoriesThanConnections) {
  HttpEnvironment env(config());
  constexpr int64_t kTrajectories = 150;  // above the 64 connections at once
  for (int64_t id = 0; id < kTrajectories; ++id) env.reset(id, {{"label", std::to_string(id)}});
  for (int64_t id = 0; id < kTrajectories; ++id) env.step(id, "go");
  std::map<int64_t, std::string> got;
  for (auto& [id, obs] : wait_for(env, kTrajectories)) got[id] = obs.text;
  ASSERT_EQ(got.size(), static_cast<size_t>(kTrajectories));
  for (int64_t id = 0; id < kTrajectories; ++id) EXPECT_EQ(got[id], std::to_string(id) + " go 1");
}

TEST_F(HttpEnvTest, StepPastTheTimeoutEndsOnlyItsTrajectory) {
  HttpEnvironment env(config(/*timeout_s=*/1));
  env.reset(0, {{"label", "A"}});
  env.reset(1, {{"label", "B"}});
  env.step(0, "hang");
  env.step(1, "slow");
  std::map<int64_t, Observation> got;
  for (auto& [id, obs] : wait_for(env, 2)) got[id] = obs;
  ASSERT_EQ(got.size(), 2u);
  EXPECT_TRUE(got[0].timed_out);
  EXPECT_TRUE(got[0].done);
  EXPECT_FALSE(got[1].timed_out);
  EXPECT_EQ(got[1].text, "B slow 1");
}

TEST_F(HttpEnvTest, ResetPastTheTimeoutEndsTheStepWaitingBehindIt) {
  HttpEnvironment env(config(/*timeout_s=*/1));
  env.reset(0, {{"label", "hang_reset"}});
  env.step(0, "go");  // waits for the reset: never sent
  const auto got = wait_for(env, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].first, 0);
  EXPECT_TRUE(got[0].second.timed_out);
  EXPECT_TRUE(got[0].second.done);
  env.step(0, "go");  // stays timed out
  const auto again = env.poll(0);
  ASSERT_EQ(again.size(), 1u);
  EXPECT_TRUE(again[0].second.timed_out);
  env.close(0);
}

TEST_F(HttpEnvTest, HttpErrorIsNamed) {
  HttpEnvironment env(config());
  env.reset(3, {{"label", "A"}});
  env.step(3, "bad");
  const std::string m = message_of<RuntimeError>([&] { wait_for(env, 1); });
  EXPECT_EQ(m.rfind("HTTP environment " + url_ +
                        ": POST /env/step for trajectory 3 answered "
                        "HTTP 500: {\"error\": \"bad action\"}",
                    0),
            0u)
      << m;
  EXPECT_NE(message_of<RuntimeError>([&] { env.poll(0); }).find("stopped by an earlier failure"),
            std::string::npos);
}

TEST(HttpEnv, RefusedConnectionIsNamedWithTheUrl) {
  const auto children_before = children_of_this_process();
  // A port nothing listens on: bound, then closed.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  socklen_t len = sizeof addr;
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  ::close(fd);
  EnvironmentConfig c;
  c.url = "http://127.0.0.1:" + std::to_string(ntohs(addr.sin_port)) + "/env";
  c.timeout_s = 5;
  {
    HttpEnvironment env(c);
    env.reset(0, json::object());
    env.step(0, "go");
    const std::string m = message_of<RuntimeError>([&] {
      for (int i = 0; i < 100; ++i) env.poll(0.1);
    });
    EXPECT_EQ(m, "HTTP environment " + c.url +
                     ": POST /env/reset for trajectory 0 failed: connect: Connection refused");
  }
  EXPECT_EQ(children_of_this_process(), children_before);  // no process of its own
  c.url = "https://example.com";
  EXPECT_EQ(message_of<InputError>([&] { HttpEnvironment env(c); }),
            "env.url: expected http://host[:port][/path], found \"https://example.com\"");
}

}  // namespace
}  // namespace rlhf::envs
