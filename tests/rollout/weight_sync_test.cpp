// Weight sync between real processes over real Gloo groups (FileStore rendezvous): after a
// sync every rollout rank's tensors equal the actor's (exact per-tensor checksums), from a
// plain model and from a ZeRO-3 trainer sharded over 2 ranks; a layout mismatch fails on
// both sides with a message instead of hanging.
#include "rollout/weight_sync.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "../transport/child_process.h"
#include "models/causal_lm.h"
#include "models/config.h"
#include "test_paths.h"

namespace rlhf::rollout {
namespace {

namespace fs = std::filesystem;
using testing::ChildProcess;

const std::string kWorker = std::string(RLHF_BINARY_DIR) + "/tests/rollout/rlhf_weight_sync_worker";

std::string fresh_dir(const std::string& name) {
  auto dir = fs::temp_directory_path() / ("rlhf_wsync_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

struct Digest {
  int64_t version = -1;
  std::map<std::string, std::pair<std::string, std::string>>
      tensors;  // name -> (sum, weighted sum)
};

Digest read_digest(const std::string& path) {
  Digest d;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream s(line);
    std::string name, a, b;
    s >> name >> a;
    if (name == "version") {
      d.version = std::stoll(a);
      continue;
    }
    s >> b;
    d.tensors[name] = {a, b};
  }
  return d;
}

std::string log_of(const std::string& dir) {
  std::string all;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".log") continue;
    std::ifstream in(e.path());
    all += "== " + e.path().filename().string() + "\n" +
           std::string(std::istreambuf_iterator<char>(in), {});
  }
  return all;
}

// Every tensor of the tiny model, with identical digests on both sides (printed with 17
// significant digits from FP64 sums of identical values in the same order: exact).
void expect_same_weights(const Digest& actor, const Digest& rollout) {
  models::CausalLM reference(models::preset_config("tiny"));
  ASSERT_EQ(actor.tensors.size(), reference.state_tensors().size());
  ASSERT_EQ(rollout.tensors.size(), actor.tensors.size());
  for (const auto& [name, digest] : actor.tensors) {
    auto it = rollout.tensors.find(name);
    ASSERT_NE(it, rollout.tensors.end()) << name;
    EXPECT_EQ(it->second, digest) << name;
  }
}

TEST(WeightSync, PlainModelToTwoRolloutRanksOverGloo) {
  const auto dir = fresh_dir("plain");
  const auto store = dir + "/sync.store";
  ChildProcess actor({kWorker, "model-sender", store, "0", "3", dir + "/actor.txt"},
                     dir + "/actor.log");
  ChildProcess r1({kWorker, "receiver", store, "1", "3", dir + "/r1.txt"}, dir + "/r1.log");
  ChildProcess r2({kWorker, "receiver", store, "2", "3", dir + "/r2.txt"}, dir + "/r2.log");
  ASSERT_EQ(actor.wait(std::chrono::seconds(90)), 0) << log_of(dir);
  ASSERT_EQ(r1.wait(std::chrono::seconds(90)), 0) << log_of(dir);
  ASSERT_EQ(r2.wait(std::chrono::seconds(90)), 0) << log_of(dir);
  const auto a = read_digest(dir + "/actor.txt");
  EXPECT_EQ(a.version, 7);
  for (const char* r : {"/r1.txt", "/r2.txt"}) {
    const auto d = read_digest(dir + r);
    EXPECT_EQ(d.version, 7);
    expect_same_weights(a, d);
  }
  fs::remove_all(dir);
}

TEST(WeightSync, Zero3ActorOverTwoRanksGathersOneUnitAtATime) {
  const auto dir = fresh_dir("zero3");
  const auto sync = dir + "/sync.store", train = dir + "/train.store";
  ChildProcess a0({kWorker, "trainer-sender", sync, "0", "2", dir + "/a0.txt", train, "0", "2"},
                  dir + "/a0.log");
  ChildProcess a1({kWorker, "trainer-sender", sync, "0", "2", dir + "/a1.txt", train, "1", "2"},
                  dir + "/a1.log");
  ChildProcess rollout({kWorker, "receiver", sync, "1", "2", dir + "/r.txt"}, dir + "/r.log");
  ASSERT_EQ(a0.wait(std::chrono::seconds(120)), 0) << log_of(dir);
  ASSERT_EQ(a1.wait(std::chrono::seconds(120)), 0) << log_of(dir);
  ASSERT_EQ(rollout.wait(std::chrono::seconds(120)), 0) << log_of(dir);
  const auto a = read_digest(dir + "/a0.txt");
  const auto r = read_digest(dir + "/r.txt");
  EXPECT_EQ(r.version, 7);
  expect_same_weights(a, r);
  // Both actor ranks gathered the same full weights.
  EXPECT_EQ(read_digest(dir + "/a1.txt").tensors, a.tensors);
  // The rollout started from different weights (seed 2), so equality means they arrived.
  models::CausalLM fresh(models::preset_config("tiny"));
  fresh.init_weights(2);
  const double before = fresh.embed_tokens->weight.to(torch::kFloat64).sum().item<double>();
  EXPECT_GT(std::abs(std::stod(r.tensors.at("model.embed_tokens.weight").first) - before), 1e-3);
  fs::remove_all(dir);
}

TEST(WeightSync, LayoutMismatchFailsOnBothSidesWithAMessage) {
  const auto dir = fresh_dir("mismatch");
  const auto store = dir + "/sync.store";
  ChildProcess actor({kWorker, "model-sender", store, "0", "2", dir + "/actor.txt"},
                     dir + "/actor.log");
  ChildProcess rollout({kWorker, "receiver-mismatch", store, "1", "2", dir + "/r.txt"},
                       dir + "/r.log");
  EXPECT_EQ(actor.wait(std::chrono::seconds(90)), 1);
  EXPECT_EQ(rollout.wait(std::chrono::seconds(90)), 1);
  std::ifstream a(dir + "/actor.log"), r(dir + "/r.log");
  const std::string actor_log(std::istreambuf_iterator<char>(a), {}),
      rollout_log(std::istreambuf_iterator<char>(r), {});
  EXPECT_NE(actor_log.find("layout differs"), std::string::npos) << actor_log;
  EXPECT_NE(rollout_log.find("differs from this model's"), std::string::npos) << rollout_log;
  fs::remove_all(dir);
}

TEST(WeightSync, LayoutHashDependsOnNamesAndShapesNotOrder) {
  std::vector<std::vector<TensorSpec>> a = {{{"x", {2, 3}}, {"y", {4}}}};
  std::vector<std::vector<TensorSpec>> b = {{{"y", {4}}, {"x", {2, 3}}}};
  std::vector<std::vector<TensorSpec>> c = {{{"x", {3, 2}}, {"y", {4}}}};
  EXPECT_EQ(layout_hash(a), layout_hash(b));
  EXPECT_NE(layout_hash(a), layout_hash(c));
}

}  // namespace
}  // namespace rlhf::rollout
