// Prompt datasets, rule rewards, and the remote reward client against a real HTTP server
// on loopback (a Beast server on 127.0.0.1:0 in a thread; the port is read back).
#include <gtest/gtest.h>

#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "core/errors.h"
#include "ppo/prompt_dataset.h"
#include "rewards/remote_reward.h"
#include "rewards/rule_rewards.h"
#include "test_paths.h"

namespace rlhf::ppo {
using rewards::find_rule_reward;
using rewards::RemoteReward;
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

std::string temp_file(const std::string& name, const std::string& text) {
  auto dir =
      std::filesystem::temp_directory_path() / ("rlhf-ppo-test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::string path = (dir / name).string();
  std::ofstream(path) << text;
  return path;
}

TEST(PromptDataset, ReadsInputsLabelsAndMessageLists) {
  std::string path = temp_file("p.jsonl",
                               "{\"q\": \"2+2=\", \"a\": \"4\"}\n\n"
                               "{\"q\": [{\"role\": \"user\", \"content\": \"hi\"}], \"a\": 7}\n");
  PromptDataConfig c;
  c.source = path;
  c.input_key = "q";
  c.label_key = "a";
  auto ds = load_prompts(c);
  ASSERT_EQ(ds.rows.size(), 2u);
  EXPECT_EQ(ds.rows[0].input, "2+2=");
  EXPECT_EQ(ds.rows[0].label, "4");
  EXPECT_EQ(ds.rows[1].line, 3);
  EXPECT_EQ(ds.rows[1].label, "7");  // non-string labels keep their JSON text
  EXPECT_EQ(prompt_text(ds.rows[1].input), "user: hi\n");
}

TEST(PromptDataset, BadLineIsFatalWithFileAndLine) {
  std::string path = temp_file("bad.jsonl", "{\"input\": \"a\"}\n{\"input\": 5}\n{oops\n");
  PromptDataConfig c;
  c.source = path;
  try {
    load_prompts(c);
    FAIL() << "accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(path + ":2: key \"input\": expected a string"),
              std::string::npos)
        << e.what();
  }
}

TEST(PromptDataset, BadLinesSkippedAndCounted) {
  std::string path =
      temp_file("skip.jsonl", "{\"input\": \"a\"}\n{oops\n{\"other\": 1}\n{\"input\": \"b\"}\n");
  PromptDataConfig c;
  c.source = path;
  c.bad_lines = BadLinePolicy::kSkip;
  auto ds = load_prompts(c);
  EXPECT_EQ(ds.rows.size(), 2u);
  EXPECT_EQ(ds.stats.skipped, 2);
  EXPECT_NE(ds.stats.first_problem.find(path + ":2: malformed JSON"), std::string::npos)
      << ds.stats.first_problem;
  c.max_samples = 1;
  EXPECT_EQ(load_prompts(c).rows.size(), 1u);
}

TEST(PromptDataset, NestedKeysAndGsm8kLabels) {
  // veRL's layout (a nested ground truth) and GSM8K's (#### at the end of the answer).
  std::string path =
      temp_file("nested.jsonl",
                "{\"extra\": {\"q\": \"Q1\"}, \"reward_model\": {\"ground_truth\": \"1,234\"}, "
                "\"answer\": \"so 3 + 4 = 7 clips.\\n#### 1,234\"}\n");
  PromptDataConfig c;
  c.source = path;
  c.input_key = "extra.q";
  c.label_key = "reward_model.ground_truth";
  auto ds = load_prompts(c);
  ASSERT_EQ(ds.rows.size(), 1u);
  EXPECT_EQ(ds.rows[0].input, "Q1");
  EXPECT_EQ(ds.rows[0].label, "1,234");
  c.label_key = "answer";
  c.label_from = "gsm8k";
  EXPECT_EQ(load_prompts(c).rows[0].label, "1234");
  // An answer without "####" is named with its line.
  std::string bad = temp_file("nogsm.jsonl", "{\"extra\": {\"q\": \"Q\"}, \"answer\": \"7\"}\n");
  c.source = bad;
  try {
    load_prompts(c);
    FAIL() << "accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(bad + ":1: data.label_from gsm8k"), std::string::npos)
        << e.what();
  }
}

TEST(PromptDataset, ReadsParquetWithMessagesAndNestedLabels) {
  // A veRL-style GSM8K file as pyarrow writes it: chat messages and a nested ground truth.
  const std::string path = temp_file("gsm8k.parquet", "");
  const std::string script = temp_file(
      "write.py",
      "import sys, pyarrow as pa, pyarrow.parquet as pq\n"
      "msg = pa.struct([('role', pa.string()), ('content', pa.string())])\n"
      "rm = pa.struct([('ground_truth', pa.string())])\n"
      "t = pa.table({'prompt': pa.array([[{'role': 'user', 'content': 'What is 6*7?'}],"
      " [{'role': 'system', 'content': 'Be brief.'}, {'role': 'user', 'content': '2+2?'}]],"
      " pa.list_(msg)), 'reward_model': pa.array([{'ground_truth': '42'},"
      " {'ground_truth': '4'}], rm)})\n"
      "pq.write_table(t, sys.argv[1])\n");
  ASSERT_EQ(std::system(("'" + std::string(RLHF_PYTHON) + "' " + script + " " + path).c_str()), 0);
  PromptDataConfig c;
  c.source = path;
  c.input_key = "prompt";
  c.label_key = "reward_model.ground_truth";
  auto ds = load_prompts(c);
  ASSERT_EQ(ds.rows.size(), 2u);
  EXPECT_EQ(ds.rows[0].input[0]["content"], "What is 6*7?");
  EXPECT_EQ(ds.rows[1].input.size(), 2u);
  EXPECT_EQ(ds.rows[0].label, "42");
  EXPECT_EQ(ds.rows[1].line, 2);
  // A column that is not there is named with the file and row.
  c.label_key = "answer";
  try {
    load_prompts(c);
    FAIL() << "accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(path + ": row 1: missing key \"answer\""),
              std::string::npos)
        << e.what();
  }
}

TEST(PromptDataset, ArithmeticSplitsAreDisjointAndLabelsAreTheAnswers) {
  const auto train = synthetic_prompts("arith", 3000, 42);
  const auto test = synthetic_prompts("arith_test", 500, 42);
  const auto test_other_seed = synthetic_prompts("arith_test", 500, 7);
  ASSERT_EQ(train.size(), 3000u);
  ASSERT_EQ(test.size(), 500u);
  std::set<std::string> seen;
  for (const auto& r : train) seen.insert(r.input.get<std::string>());
  EXPECT_EQ(seen.size(), train.size()) << "repeated problems in the training split";
  int shared = 0;
  for (size_t i = 0; i < test.size(); ++i) {
    const std::string q = test[i].input.get<std::string>();
    shared += seen.count(q);
    EXPECT_EQ(q, test_other_seed[i].input.get<std::string>()) << "the held-out split moved";
  }
  EXPECT_EQ(shared, 0);
  // Every label is an integer; the "What is a + b?" and "a times b" ones are recomputed.
  int checked = 0;
  for (const auto& r : train) {
    const std::string q = r.input.get<std::string>();
    EXPECT_NO_THROW(std::stoll(r.label)) << r.label;
    int a = 0, b = 0;
    char op[8] = {0};
    if (std::sscanf(q.c_str(), "What is %d %7s %d?", &a, op, &b) == 3 &&
        q.find(" - ") == std::string::npos) {
      const int want = std::string(op) == "+" ? a + b : std::string(op) == "times" ? a * b : -1;
      if (want >= 0) {
        EXPECT_EQ(r.label, std::to_string(want)) << q;
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 300);
}

TEST(PromptDataset, SyntheticIsDeterministicPerSeed) {
  auto a = synthetic_prompts("letters", 16, 7), b = synthetic_prompts("letters", 16, 7);
  auto c = synthetic_prompts("letters", 16, 8);
  ASSERT_EQ(a.size(), 16u);
  int same = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].input, b[i].input);
    same += a[i].input == c[i].input;
  }
  EXPECT_LT(same, 16);
  EXPECT_THROW(synthetic_prompts("nope", 4, 1), InputError);
}

TEST(RuleRewards, Table) {
  const auto& letters = find_rule_reward("letters");
  EXPECT_DOUBLE_EQ(letters.fn("p", "abC1", ""), 0.5);
  EXPECT_DOUBLE_EQ(letters.fn("p", "", ""), 0.0);
  EXPECT_DOUBLE_EQ(letters.fn("p", "zzzz", ""), 1.0);
  const auto& match = find_rule_reward("match_label");
  EXPECT_DOUBLE_EQ(match.fn("2+2=", " 4\n", "4"), 1.0);
  EXPECT_DOUBLE_EQ(match.fn("2+2=", "5", "4"), 0.0);
  try {
    find_rule_reward("lettrs");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("known: letters, match_label"), std::string::npos);
  }
}

enum class ServerMode { kOk, kStatus500, kBadJson, kWrongCount, kSlow };

// Serves exactly one request on 127.0.0.1:<port> as `mode` says.
class RewardServer {
 public:
  explicit RewardServer(ServerMode mode)
      : acceptor_(ioc_, {net::ip::make_address("127.0.0.1"), 0}) {
    port_ = acceptor_.local_endpoint().port();
    thread_ = std::thread([this, mode] { serve(mode); });
  }
  ~RewardServer() {
    release_.set_value();
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/score"; }
  nlohmann::json last_request;

 private:
  void serve(ServerMode mode) {
    tcp::socket socket(ioc_);
    acceptor_.accept(socket);
    beast::flat_buffer buffer;
    http::request<http::string_body> req;
    http::read(socket, buffer, req);
    last_request = nlohmann::json::parse(req.body());
    if (mode == ServerMode::kSlow) {
      release_.get_future().wait();  // until the test has seen the client's timeout
      return;
    }
    http::response<http::string_body> res{http::status::ok, 11};
    nlohmann::json rewards = nlohmann::json::array();
    for (const auto& r : last_request["responses"]) rewards.push_back(r.get<std::string>().size());
    if (mode == ServerMode::kWrongCount) rewards.push_back(0);
    res.body() =
        mode == ServerMode::kBadJson ? "not json" : nlohmann::json{{"rewards", rewards}}.dump();
    if (mode == ServerMode::kStatus500) {
      res.result(http::status::internal_server_error);
      res.body() = "verifier crashed";
    }
    res.prepare_payload();
    beast::error_code ec;
    http::write(socket, res, ec);
  }

  net::io_context ioc_;
  tcp::acceptor acceptor_;
  unsigned short port_;
  std::promise<void> release_;
  std::thread thread_;
};

std::string error_of(ServerMode mode, double timeout_s = 5.0) {
  RewardServer server(mode);
  try {
    RemoteReward({server.url(), timeout_s}).score({"p1", "p2"}, {"abc", "de"}, {"l1", "l2"});
  } catch (const RuntimeError& e) {
    return e.what();
  }
  return "";
}

TEST(RemoteReward, ScoresInOrderAndSendsEveryField) {
  RewardServer server(ServerMode::kOk);
  auto scores = RemoteReward({server.url(), 5.0}).score({"p1", "p2"}, {"abc", "de"}, {"l1", "l2"});
  EXPECT_EQ(scores, (std::vector<double>{3, 2}));
  EXPECT_EQ(server.last_request["labels"], nlohmann::json({"l1", "l2"}));
  EXPECT_EQ(server.last_request["query"], nlohmann::json({"p1abc", "p2de"}));
}

TEST(RemoteReward, FailuresAreNamedErrors) {
  EXPECT_NE(error_of(ServerMode::kStatus500).find("HTTP 500: verifier crashed"), std::string::npos);
  EXPECT_NE(error_of(ServerMode::kBadJson).find("expected a JSON object with a \"rewards\" list"),
            std::string::npos);
  EXPECT_NE(error_of(ServerMode::kWrongCount).find("sent 2 samples, got 3 rewards"),
            std::string::npos);
  std::string slow = error_of(ServerMode::kSlow, 0.3);
  EXPECT_NE(slow.find("no reply within"), std::string::npos) << slow;
  EXPECT_NE(slow.find("/score"), std::string::npos) << slow;
}

TEST(RemoteReward, RefusedConnectionAndBadUrl) {
  // Bind then close a socket to get a port with nothing listening.
  unsigned short port;
  {
    net::io_context ioc;
    tcp::acceptor a(ioc, {net::ip::make_address("127.0.0.1"), 0});
    port = a.local_endpoint().port();
  }
  try {
    RemoteReward({"http://127.0.0.1:" + std::to_string(port) + "/", 2.0}).score({"p"}, {"r"}, {""});
    FAIL();
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("connect failed"), std::string::npos) << e.what();
  }
  EXPECT_THROW(RemoteReward({"https://x/", 1.0}), InputError);
}

}  // namespace
}  // namespace rlhf::ppo
