// The model operations of a worker, called in process on a fixture model (no worker process,
// no scheduler): what they compute is checked against an independent computation from the
// model's full logits.
#include "actors/model_operations.h"

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <limits>

#include "actors/device.h"
#include "actors/operation_registry.h"
#include "actors/wire_version.h"
#include "dpo/worker_ops.h"
#include "engine/role_config.h"
#include "models/pretrained.h"
#include "ppo/worker_ops.h"
#include "test_paths.h"
#include "tests/support/jsd_reference.h"
#include "transport/worker_ops.h"

namespace rlhf {
namespace {

const std::string kModel = std::string(RLHF_SOURCE_DIR) + "/tests/fixtures/llama_tiny/llama_gqa";

Message call(const OperationRegistry& registry, Message request, const WorkerIdentity& self) {
  const Operation* op = registry.find(request.op);
  EXPECT_NE(op, nullptr) << request.op;
  return (*op)(request, self);
}

// A typed request as the wire carries it, with `tensors`.
template <typename Request>
Message message(const Request& request, std::vector<NamedTensor> tensors = {}) {
  Message m;
  m.op = Request::kName;
  m.args = request_args(request);
  m.tensors = std::move(tensors);
  return m;
}

engine::ModelRoleConfig fixture_config(const std::string& role) {
  engine::ModelRoleConfig config;
  config.role = role;
  config.model_dir = kModel;
  config.dtype = "fp32";
  return config;
}

// train.logits_chunk_tokens as the role config carries it: the default (one chunk here), 3
// (the 8 action tokens in chunks of 3, 3, 2 that span rows) and 0 (the path before chunks of
// tokens) all give the same log-probs and entropy.
class ModelOperationsChunks : public ::testing::TestWithParam<int64_t> {};

TEST_P(ModelOperationsChunks, LogProbsAndEntropyAtTheSamplingTemperature) {
  torch::set_num_threads(1);
  OperationRegistry registry;
  add_model_operations(registry);
  const WorkerIdentity self{"ref", 0, 1, "cpu:0", "local"};
  engine::ModelRoleConfig config = fixture_config("ref");
  if (GetParam() >= 0) config.logits_chunk_tokens = GetParam();
  call(registry, message(ops::Init{config, ""}), self);

  torch::manual_seed(0);
  const int64_t b = 2, t = 7, a = 4;
  torch::Tensor seq = torch::randint(0, 64, {b, t}, torch::kLong);
  torch::Tensor mask = torch::ones({b, t}, torch::kLong);
  auto log_probs = [&](double temperature) {
    const ops::LogProbs request{a, {}, temperature, true, false};
    return call(registry, message(request, {{"sequences", seq}, {"attention_mask", mask}}), self);
  };

  // Independently: the whole model's FP32 logits [B, T, V] divided by T, a plain log_softmax,
  // the next token's entry and -sum p log p at the A positions before each action token.
  models::LoadOptions fp32;
  fp32.dtype = torch::kFloat32;
  auto model = models::load_pretrained(kModel, fp32);
  torch::NoGradGuard no_grad;
  torch::Tensor logits = model->logits(model->forward(seq, mask)).to(torch::kFloat32);
  for (double temperature : {0.6, 1.0, 1.7}) {
    torch::Tensor logp = torch::log_softmax(logits / temperature, -1).slice(1, t - 1 - a, t - 1);
    torch::Tensor want = logp.gather(-1, seq.slice(1, t - a, t).unsqueeze(-1)).squeeze(-1);
    torch::Tensor want_entropy = -(logp.exp() * logp).sum(-1);
    Message reply = log_probs(temperature);
    // FP32 through two reduction orders (chunked head vs one matmul): 1e-5 absolute.
    EXPECT_TRUE(torch::allclose(reply.tensor("log_probs"), want, 0, 1e-5))
        << "T = " << temperature << "\n"
        << reply.tensor("log_probs") << "\n"
        << want;
    EXPECT_TRUE(torch::allclose(reply.tensor("entropy"), want_entropy, 0, 1e-5))
        << "T = " << temperature;
  }
  // Temperature 0 is greedy sampling: log-probs at T = 1.
  EXPECT_TRUE(torch::equal(log_probs(0.0).tensor("log_probs"), log_probs(1.0).tensor("log_probs")));
  // The temperatures differ enough for the check above to mean something.
  EXPECT_GT((log_probs(0.6).tensor("log_probs") - log_probs(1.0).tensor("log_probs"))
                .abs()
                .max()
                .item<double>(),
            0.01);
}

INSTANTIATE_TEST_SUITE_P(ChunkTokens, ModelOperationsChunks, ::testing::Values(-1, 3, 0),
                         [](const ::testing::TestParamInfo<int64_t>& info) {
                           return info.param < 0 ? std::string("Default")
                                                 : "Chunk" + std::to_string(info.param);
                         });

// train_actor's GKD loss on a fresh FP32 actor (the Llama fixture, one rank, ZeRO 1) for the
// teacher's top-k reply `top`, its rows padded or packed (3 rows' tokens per packed row).
double actor_gkd_loss(const Message& top, const torch::Tensor& seq, const torch::Tensor& mask,
                      const torch::Tensor& action_mask, bool packed, double beta,
                      double temperature) {
  static int calls = 0;
  OperationRegistry actor_ops;
  add_model_operations(actor_ops);
  engine::ModelRoleConfig ac = fixture_config("actor");
  ac.gradient_checkpointing = false;
  ac.trainer = engine::TrainerConfig{};
  ac.trainer->zero_stage = engine::ZeroStage::kOptimizer;
  const std::string store =
      (std::filesystem::temp_directory_path() /
       ("gkd-store-" + std::to_string(::getpid()) + "-" + std::to_string(++calls)))
          .string();
  const WorkerIdentity self{"actor", 0, 1, "cpu:0", "local"};
  call(actor_ops, message(ops::Init{ac, store}), self);
  const int64_t b = seq.size(0), t = seq.size(1), a = action_mask.size(1);
  ops::TrainActor train;
  train.batching = {a, b, packed ? 3 * t : 0, packed};
  train.temperature = temperature;
  train.gkd_coef = 1.0;
  train.gkd_beta = beta;
  const Message reply = call(actor_ops,
                             message(train, {{"sequences", seq},
                                             {"attention_mask", mask},
                                             {"action_mask", action_mask},
                                             {"log_probs_old", torch::zeros({b, a})},
                                             {"advantages", torch::zeros({b, a})},
                                             {"teacher_top_ids", top.tensor("top_ids")},
                                             {"teacher_top_log_probs", top.tensor("top_log_probs")},
                                             {"teacher_top_rest", top.tensor("top_rest")}}),
                             self);
  std::filesystem::remove(store);
  return reply_of<ops::TrainActor>(reply).gkd_loss;
}

// GKD across two workers' operations: a teacher of another architecture (the Qwen2 fixture,
// the Llama one's 64-token vocabulary) sends its top k at each action position; the actor's
// train_actor reports the token mean of the divergence to them. With k >= V that is the
// whole-vocabulary JSD of the two models' logits computed directly, padded or packed rows
// alike; with k < V it is below it.
TEST(ModelOperations, GkdLossWithTheWholeVocabularyIsTheDirectJsd) {
  torch::set_num_threads(1);
  const std::string teacher_dir =
      std::string(RLHF_SOURCE_DIR) + "/tests/fixtures/llama_tiny/qwen2_tied_bias";
  OperationRegistry teacher_ops;
  add_model_operations(teacher_ops);
  engine::ModelRoleConfig tc = fixture_config("teacher");
  tc.model_dir = teacher_dir;
  tc.logits_chunk_tokens = 5;  // chunks that span rows
  call(teacher_ops, message(ops::Init{tc, ""}), {"teacher", 0, 1, "cpu:0", "local"});

  torch::manual_seed(1);
  const int64_t b = 4, t = 9, a = 5;
  const double temperature = 0.8;
  torch::Tensor seq = torch::randint(0, 64, {b, t}, torch::kLong);
  torch::Tensor mask = torch::ones({b, t}, torch::kLong);
  mask[1][0] = 0;  // a left-padded prompt
  torch::Tensor action_mask = torch::ones({b, a}, torch::kLong);
  action_mask[2][a - 1] = 0;  // a response that ended early
  auto teacher_top = [&](int64_t k) {
    ops::LogProbs request{a, {}, temperature, false, false};
    request.top_k = k;
    return call(teacher_ops, message(request, {{"sequences", seq}, {"attention_mask", mask}}),
                {"teacher", 0, 1, "cpu:0", "local"});
  };

  // Directly: both models' whole logits / T at the states before each action.
  models::LoadOptions fp32;
  fp32.dtype = torch::kFloat32;
  torch::Tensor zs, zt;
  {
    torch::NoGradGuard no_grad;
    auto student = models::load_pretrained(kModel, fp32);
    auto teacher = models::load_pretrained(teacher_dir, fp32);
    zs = student->logits(student->forward(seq, mask)).slice(1, t - 1 - a, t - 1) / temperature;
    zt = teacher->logits(teacher->forward(seq, mask)).slice(1, t - 1 - a, t - 1) / temperature;
  }
  const torch::Tensor mf = action_mask.to(torch::kFloat64);
  auto token_mean = [&](const torch::Tensor& d) {
    return ((d * mf).sum() / mf.sum()).item<double>();
  };

  for (const bool packed : {false, true}) {
    for (const double beta : {0.0, 0.5, 1.0}) {
      for (const int64_t k : {int64_t{100}, int64_t{8}}) {  // 100: capped at V = 64
        const Message top = teacher_top(k);
        ASSERT_EQ(top.tensor("top_ids").size(2), std::min<int64_t>(k, 64));
        const double got = actor_gkd_loss(top, seq, mask, action_mask, packed, beta, temperature);
        const double whole = token_mean(test::whole_jsd(zs, zt, beta));
        ASSERT_GT(whole, 1e-3);  // the two models differ
        const std::string at = std::string(packed ? "packed" : "padded") + " beta " +
                               std::to_string(beta) + " k " + std::to_string(k);
        if (k >= 64)  // FP32 logits through two reduction orders: 1e-5 of the value
          EXPECT_NEAR(got, whole, 1e-5 * whole) << at;
        else
          EXPECT_LT(got, whole) << at;
      }
    }
  }
}

// Issue 40.1: a worker given a request without a field, or with one it does not know, fails
// naming the operation and the field, before it runs anything; a whole request runs.
TEST(ModelOperations, ARequestWithoutAFieldFailsNamingIt) {
  torch::set_num_threads(1);
  OperationRegistry registry;
  add_model_operations(registry);
  const WorkerIdentity self{"ref", 0, 1, "cpu:0", "local"};
  auto refusal = [&](const std::string& op, const nlohmann::json& args) -> std::string {
    Message m;
    m.op = op;
    m.args = args;
    try {
      call(registry, m, self);
    } catch (const std::exception& e) {
      return e.what();
    }
    return "(served)";
  };
  nlohmann::json init = request_args(ops::Init{fixture_config("ref"), ""});
  init.erase("store_path");
  EXPECT_EQ(refusal("init", init), "init: missing field \"store_path\"");
  init = request_args(ops::Init{fixture_config("ref"), ""});
  init["config"].erase("dtype");
  EXPECT_EQ(refusal("init", init), "init: role config: missing field \"dtype\"");

  // The PPO train step: its loss settings travel whole (before, a missing
  // rollout_correction_cap became 2.0 on the worker, whatever the spec said).
  ops::TrainActor train;
  train.batching = {4, 2, 0, false};
  nlohmann::json args = request_args(train);
  args["policy"].erase("correction_cap");
  EXPECT_EQ(refusal("train_actor", args),
            "train_actor: policy loss: missing field \"correction_cap\"");
  args = request_args(train);
  args.erase("kl_estimator");
  EXPECT_EQ(refusal("train_actor", args), "train_actor: missing field \"kl_estimator\"");
  args = request_args(train);
  args["batching"]["max_token"] = 64;
  EXPECT_EQ(refusal("train_actor", args), "train_actor: batching: unknown field \"max_token\"");
  args = request_args(train);
  args["kl_estimator"] = "k4";
  EXPECT_NE(refusal("train_actor", args).find("expected k1, k2 or k3, found \"k4\""),
            std::string::npos);

  // The worker is unharmed: a whole init runs, and the request's value is what it uses.
  EXPECT_EQ(reply_of<ops::Init>(call(registry, message(ops::Init{fixture_config("ref"), ""}), self))
                .parameters,
            models::load_pretrained(kModel, {})->config().num_parameters());
}

// JSON has no NaN: a skipped step's non-finite figures travel as null and read back as NaN,
// in a reply's fields and in its map of means, instead of failing the reply.
TEST(WireStructs, NonFiniteFiguresTravelAsNullAndReadBackAsNan) {
  ops::TrainActorReply r;
  r.metrics.loss = std::nan("");
  r.metrics.grad_norm = std::numeric_limits<double>::infinity();
  r.metrics.skipped = true;
  Message m;
  m.args = nlohmann::json::parse(request_args(r).dump());  // as the wire carries it
  EXPECT_TRUE(m.args["metrics"]["loss"].is_null());
  const ops::TrainActorReply back = nlohmann::json(m.args).get<ops::TrainActorReply>();
  EXPECT_TRUE(std::isnan(back.metrics.loss));
  EXPECT_TRUE(std::isnan(back.metrics.grad_norm));
  EXPECT_TRUE(back.metrics.skipped);
  ops::OfflineStepReply offline;
  offline.means = {{"margin", std::nan("")}, {"accuracy", 0.5}};
  const auto means =
      nlohmann::json::parse(nlohmann::json(offline).dump()).get<ops::OfflineStepReply>().means;
  EXPECT_TRUE(std::isnan(means.at("margin")));
  EXPECT_EQ(means.at("accuracy"), 0.5);
}

// The wire version is the hand-kept kWireVersion and a fingerprint of every operation's
// fields: a field added to any request changes it.
TEST(WireVersion, NamesEveryOperationAndItsFields) {
  const std::string layout = "\n" + wire_layout();
  for (const char* op :
       {"init ", "log_probs ", "train_actor ", "train_critic ", "push_weights ", "load_model ",
        "generate ", "sync_weights ", "train_dpo ", "train_rm ", "memory ", "info ", "ping "})
    EXPECT_NE(layout.find(std::string("\n") + op), std::string::npos) << op << "\n" << layout;
  EXPECT_NE(layout.find("correction_cap:number"), std::string::npos) << layout;
  EXPECT_EQ(wire_version().rfind(std::to_string(kWireVersion) + "-", 0), 0u) << wire_version();
  EXPECT_EQ(wire_version().size(), std::to_string(kWireVersion).size() + 17);
}

}  // namespace
}  // namespace rlhf

// Issue 41.2: a BF16 role on a GPU without BF16 units (compute capability below 8.0) is refused
// at init with what to set, instead of cuBLAS refusing its first BF16 GEMM mid-step; FP16,
// FP32 and newer GPUs pass.
TEST(WorkerDevice, Bf16OnAGpuWithoutBf16UnitsIsRefusedNamingTheFix) {
  const rlhf::WorkerIdentity self{"actor", 2, 4, "cuda:2", "v100"};
  const std::string refusal = rlhf::dtype_refusal(self, "bf16", "Tesla V100-SXM2-32GB", 7, 0);
  for (const char* part :
       {"[actor 2] actor.dtype bf16 on cuda:2", "Tesla V100-SXM2-32GB", "compute capability 7.0",
        "set actor.dtype fp16", "\"compute_capability\": 7.0"})
    EXPECT_NE(refusal.find(part), std::string::npos) << part << " in: " << refusal;
  EXPECT_EQ(rlhf::dtype_refusal(self, "fp16", "Tesla V100-SXM2-32GB", 7, 0), "");
  EXPECT_EQ(rlhf::dtype_refusal(self, "fp32", "Tesla T4", 7, 5), "");
  EXPECT_EQ(rlhf::dtype_refusal(self, "bf16", "NVIDIA A100-SXM4-80GB", 8, 0), "");
  // A CPU worker is never checked.
  EXPECT_NO_THROW(rlhf::check_dtype_on_device({"actor", 0, 1, "cpu:0", "local"}, "bf16"));
}
