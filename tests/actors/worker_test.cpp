// A real `rlhf worker` process against a scheduler played by the test: it registers with
// the token, answers malformed frames (bad JSON, truncated, wrong sizes, huge declared
// sizes, wrong frame counts) with error replies and keeps serving, and exits by itself when
// the scheduler falls silent.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "actors/operation_registry.h"
#include "scheduler/worker_process.h"
#include "tests/support/processes.h"
#include "transport/channel.h"

namespace rlhf {
namespace {

using namespace std::chrono_literals;
using testing::poll_until;

zmq::message_t frame(const std::string& s) {
  return zmq::message_t(s.data(), s.size());
}

// The test's side of the job: a ROUTER that the worker registers with.
class FakeScheduler {
 public:
  FakeScheduler(const std::string& name, int64_t timeout_ms, const std::string& offered_token = "")
      : router_(ctx_, zmq::socket_type::router, 0ms), dir_(testing::fresh_run_dir(name)) {
    const std::string endpoint = router_.bind(tcp_wildcard("127.0.0.1"));
    const std::string token = "t0k3n";
    auto placement = testing::local_placement({{Role::kActor, 2}}).workers[1];
    worker_ = std::make_unique<WorkerProcess>(
        placement, RLHF_CLI_PATH, std::vector<std::string>{"worker"},
        std::vector<std::pair<std::string, std::string>>{
            {kEnvScheduler, endpoint},
            {kEnvToken, offered_token.empty() ? token : offered_token},
            {kEnvRunDir, dir_}},
        dir_ + "/actor-1.log");
    auto frames = router_.recv(30000ms);
    if (!frames) throw RuntimeError("the worker did not register");
    peer_ = std::string(static_cast<const char*>((*frames)[0].data()), (*frames)[0].size());
    frames->erase(frames->begin());
    hello_ = decode(std::move(*frames), MessageLimits{});
    Message answer;
    if (hello_.args.value("token", "") == token) {
      answer.kind = MessageKind::kRegistered;
      answer.args = {{"heartbeat_interval_ms", 100}, {"timeout_ms", timeout_ms}};
    } else {
      answer = make_error(0, "register", "registration refused: wrong or missing job token");
    }
    send(encode(answer));
  }

  void send(Frames frames) {
    frames.insert(frames.begin(), frame(peer_));
    router_.send(std::move(frames));
  }
  // The next message that is not a heartbeat.
  Message reply() {
    while (auto frames = router_.recv(20000ms)) {
      frames->erase(frames->begin());
      Message m = decode(std::move(*frames), MessageLimits{});
      if (m.kind != MessageKind::kHeartbeat) return m;
    }
    throw RuntimeError("no reply from the worker");
  }
  WorkerProcess& worker() { return *worker_; }
  const Message& hello() const { return hello_; }

 private:
  zmq::context_t ctx_{1};
  Channel router_;
  std::string dir_;
  std::unique_ptr<WorkerProcess> worker_;
  std::string peer_;
  Message hello_;
};

// A request header declaring one tensor, followed by the given data frames.
Frames with_tensor(uint64_t id, const std::string& tensor_json, std::vector<size_t> frame_sizes) {
  Frames f;
  f.push_back(frame(R"({"v":1,"kind":"request","op":"echo","id":)" + std::to_string(id) +
                    R"(,"step":0,"args":{},"tensors":[)" + tensor_json + "]}"));
  for (size_t n : frame_sizes) f.emplace_back(n);
  return f;
}

TEST(Worker, RegistersWithTokenAndIdentity) {
  FakeScheduler s("worker-register", 20000);
  EXPECT_EQ(s.hello().kind, MessageKind::kRegister);
  EXPECT_EQ(s.hello().args.at("role"), "actor");
  EXPECT_EQ(s.hello().args.at("rank"), 1);
  EXPECT_EQ(s.hello().args.at("pid").get<int>(), s.worker().pid());
  EXPECT_EQ(s.hello().args.at("device"), "cpu:1");
}

TEST(Worker, MalformedFramesGetErrorRepliesAndServingContinues) {
  FakeScheduler s("worker-malformed", 20000);
  struct Case {
    const char* what;
    Frames frames;
    uint64_t id;         // the id the error reply must carry
    const char* reason;  // in the error text
  };
  std::vector<Case> cases;
  Frames bad_json;
  bad_json.push_back(frame("{\"v\":1,\"kind\":\"request\",\"op\":"));
  cases.push_back({"bad JSON", std::move(bad_json), 0, "header is not valid JSON"});
  cases.push_back(
      {"truncated",
       with_tensor(11, R"({"name":"x","dtype":"float32","shape":[8],"nbytes":32})", {20}), 11,
       "frame has 20 bytes, header declares 32"});
  cases.push_back(
      {"wrong nbytes",
       with_tensor(12, R"({"name":"x","dtype":"int64","shape":[2,2],"nbytes":16})", {16}), 12,
       "needs 32"});
  cases.push_back(
      {"huge",
       with_tensor(13, R"({"name":"x","dtype":"float32","shape":[1048576,1048576,16],"nbytes":4})",
                   {4}),
       13, "exceeds the size limit"});
  cases.push_back({"missing frame",
                   with_tensor(14, R"({"name":"x","dtype":"uint8","shape":[3],"nbytes":3})", {}),
                   14, "declares 1 tensors but 0 data frames"});
  cases.push_back({"bad dtype",
                   with_tensor(15, R"({"name":"x","dtype":"qint8","shape":[3],"nbytes":3})", {3}),
                   15, "unknown dtype"});
  Frames empty_header(1);  // a lone empty frame: not a stop signal, just a bad message
  cases.push_back({"empty header", std::move(empty_header), 0, "header is not valid JSON"});
  for (auto& c : cases) {
    SCOPED_TRACE(c.what);
    s.send(std::move(c.frames));
    Message r = s.reply();
    EXPECT_EQ(r.kind, MessageKind::kError);
    EXPECT_EQ(r.id, c.id);
    EXPECT_NE(r.error.find("malformed message"), std::string::npos) << r.error;
    EXPECT_NE(r.error.find(c.reason), std::string::npos) << r.error;
  }
  // Still serving: a valid echo comes back bit-exact.
  Message ok;
  ok.id = 99;
  ok.op = "echo";
  ok.add("x", at::randn({5, 7}).to(at::kBFloat16));
  s.send(encode(ok));
  Message r = s.reply();
  ASSERT_EQ(r.kind, MessageKind::kReply) << r.error;
  EXPECT_EQ(r.id, 99u);
  EXPECT_TRUE(at::equal(r.tensor("x"), ok.tensor("x")));
  EXPECT_NE(testing::read_file(s.worker().log_path()).find("rejected malformed message (id 13)"),
            std::string::npos);
  // Shutdown ends it with exit code 0.
  Message bye;
  bye.kind = MessageKind::kShutdown;
  s.send(encode(bye));
  std::optional<int> status;
  ASSERT_TRUE(poll_until([&] { return (status = s.worker().poll_exit()).has_value(); }, 10s));
  EXPECT_EQ(describe_wait_status(*status), "exit code 0");
}

TEST(Worker, ExitsWhenTheSchedulerFallsSilent) {
  FakeScheduler s("worker-orphaned", 500);  // and then the test sends nothing more
  std::optional<int> status;
  ASSERT_TRUE(poll_until([&] { return (status = s.worker().poll_exit()).has_value(); }, 10s));
  EXPECT_EQ(describe_wait_status(*status), "exit code 1");
  EXPECT_NE(
      testing::read_file(s.worker().log_path()).find("no message from the scheduler for 500 ms"),
      std::string::npos)
      << testing::read_file(s.worker().log_path());
}

TEST(Worker, RefusedRegistrationExits) {
  FakeScheduler s("worker-refused", 20000, "wrong-token");
  std::optional<int> status;
  ASSERT_TRUE(poll_until([&] { return (status = s.worker().poll_exit()).has_value(); }, 10s));
  EXPECT_EQ(describe_wait_status(*status), "exit code 1");
  EXPECT_NE(testing::read_file(s.worker().log_path()).find("wrong or missing job token"),
            std::string::npos);
}

TEST(OperationRegistry, FindsAndRefusesDuplicates) {
  OperationRegistry r;
  r.add("x", [](const Message&, const WorkerIdentity&) { return Message{}; });
  EXPECT_NE(r.find("x"), nullptr);
  EXPECT_EQ(r.find("y"), nullptr);
  EXPECT_THROW(r.add("x", [](const Message&, const WorkerIdentity&) { return Message{}; }),
               std::logic_error);
}

}  // namespace
}  // namespace rlhf
