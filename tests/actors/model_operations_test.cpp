// The model operations of a worker, called in process on a fixture model (no worker process,
// no scheduler): what they compute is checked against an independent computation from the
// model's full logits.
#include "actors/model_operations.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "actors/operation_registry.h"
#include "engine/role_config.h"
#include "models/pretrained.h"
#include "test_paths.h"

namespace rlhf {
namespace {

const std::string kModel = std::string(RLHF_SOURCE_DIR) + "/tests/fixtures/llama_tiny/llama_gqa";

Message call(const OperationRegistry& registry, Message request, const WorkerIdentity& self) {
  const Operation* op = registry.find(request.op);
  EXPECT_NE(op, nullptr) << request.op;
  return (*op)(request, self);
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
  engine::ModelRoleConfig config;
  config.role = "ref";
  config.model_dir = kModel;
  config.dtype = "fp32";
  if (GetParam() >= 0) config.logits_chunk_tokens = GetParam();
  Message init;
  init.op = "init";
  init.args = {{"config", config.to_json()}, {"store_path", ""}};
  call(registry, init, self);

  torch::manual_seed(0);
  const int64_t b = 2, t = 7, a = 4;
  torch::Tensor seq = torch::randint(0, 64, {b, t}, torch::kLong);
  torch::Tensor mask = torch::ones({b, t}, torch::kLong);
  auto log_probs = [&](double temperature) {
    Message req;
    req.op = "log_probs";
    req.args = {{"action_len", a}, {"entropy", true}, {"temperature", temperature}};
    req.add("sequences", seq).add("attention_mask", mask);
    return call(registry, req, self);
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

}  // namespace
}  // namespace rlhf
