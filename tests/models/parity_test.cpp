// Parity with an independent implementation: tests/fixtures/make_llama_fixture.py (plain
// PyTorch written from the HF definitions, float64) computed logits / values, next-token
// log-probs and one loss's gradients for three tiny models (GQA; Qwen2 biases + tied
// embeddings; llama3 RoPE + head_dim + biases + value head). Only positions that are not
// padding are compared (padding rows are garbage by definition).
#include "models/causal_lm.h"
#include "models/pretrained.h"
#include "models/safetensors.h"
#include "test_paths.h"
#include "test_util.h"

namespace rlhf::models {
namespace {

using testing::relative_error;

const std::string kFixtures = std::string(RLHF_SOURCE_DIR) + "/tests/fixtures/llama_tiny/";

struct Outputs {
  torch::Tensor main;       // logits [B, T, V] or values [B, T]
  torch::Tensor log_probs;  // [B, T-1] (LM head only)
  torch::Tensor loss;
};

// The fixture's loss: -(log_probs * w).sum() for an LM head, (values[:, :-1] * w).sum() for
// a value head, with w = loss_weights [B, T-1] (zero where either token is padding).
Outputs run(CausalLM& model, const SafetensorsFile& expected) {
  auto ids = expected.view("input_ids"), mask = expected.view("attention_mask");
  auto pos = expected.view("position_ids"), w = expected.view("loss_weights");
  auto hidden = model.forward(ids, mask, pos);
  Outputs out;
  if (model.config().head == HeadKind::kValue) {
    out.main = model.values(hidden);
    out.loss = (out.main.narrow(1, 0, out.main.size(1) - 1) * w).sum();
  } else {
    out.main = model.logits(hidden).to(torch::kFloat32);
    out.log_probs = model.next_token_log_probs(hidden, ids, /*chunk=*/5);  // 11 positions: 3 chunks
    out.loss = -(out.log_probs * w).sum();
  }
  out.loss.backward();
  return out;
}

// Keeps entries at valid (non-padding) positions: mask [B, T] selects along the first dims.
torch::Tensor valid(const torch::Tensor& t, const torch::Tensor& mask) {
  return t.index({mask.to(torch::kBool)});
}

class Parity : public ::testing::TestWithParam<std::string> {};

TEST_P(Parity, Fp32MatchesTheReferenceTo1e5) {
  torch::set_num_threads(1);
  const std::string dir = kFixtures + GetParam();
  SafetensorsFile expected(dir + "/expected.safetensors");
  LoadOptions opts;
  opts.dtype = torch::kFloat32;
  auto model = load_pretrained(dir, opts);
  Outputs out = run(*model, expected);
  auto mask = expected.view("attention_mask");
  // FP32 against a float64 reference: rounding of ~1e-7 per op over a few hundred ops
  // stays well inside 1e-5 of each tensor's scale (the bound).
  constexpr double kTol = 1e-5;
  if (model->config().head == HeadKind::kValue) {
    EXPECT_LT(relative_error(valid(out.main, mask), valid(expected.view("values"), mask)), kTol);
  } else {
    EXPECT_LT(relative_error(valid(out.main, mask), valid(expected.view("logits"), mask)), kTol);
    auto pairs = expected.view("loss_weights") > 0;
    EXPECT_LT(
        relative_error(out.log_probs.index({pairs}), expected.view("log_probs").index({pairs})),
        kTol);
  }
  EXPECT_LT(relative_error(out.loss, expected.view("loss")), kTol);
  int checked = 0;
  for (auto& [name, param] : model->state_tensors()) {
    ASSERT_TRUE(param.grad().defined()) << name;
    EXPECT_LT(relative_error(param.grad(), expected.view("grad." + name)), kTol) << name;
    ++checked;
  }
  int reference_grads = 0;
  for (const auto& t : expected.tensors()) reference_grads += t.name.rfind("grad.", 0) == 0;
  EXPECT_EQ(checked, reference_grads) << "the model and the reference have the same parameters";
}

TEST_P(Parity, Bf16StaysWithinRoundingOfTheReference) {
  torch::set_num_threads(1);
  const std::string dir = kFixtures + GetParam();
  SafetensorsFile expected(dir + "/expected.safetensors");
  LoadOptions opts;
  opts.dtype = torch::kBFloat16;
  auto model = load_pretrained(dir, opts);
  Outputs out = run(*model, expected);
  auto mask = expected.view("attention_mask");
  // BF16 keeps 8 significand bits (unit roundoff 2^-9 ~ 2e-3) and every weight, activation
  // and matmul output is rounded. The fixtures' attention scores reach ~10, where bf16's
  // absolute error (~0.04) moves softmax weights by a few percent, so errors grow past the
  // per-op roundoff: measured 2.5e-2 / 1.1e-2 / 5.7e-3 of scale for the outputs and at most
  // 5.1e-2 for gradients (through twice the ops). Bounds: 5e-2 outputs, 1e-1 gradients; a
  // wrong mask, RoPE, bias or head gives errors of order 1 (and the FP32 test pins 1e-5).
  constexpr double kTol = 5e-2;
  const double main_error = relative_error(
      valid(out.main, mask),
      valid(expected.view(model->config().head == HeadKind::kValue ? "values" : "logits"), mask));
  EXPECT_LT(main_error, kTol);
  RecordProperty("bf16_output_error", std::to_string(main_error));
  if (model->config().head == HeadKind::kLanguageModel) {
    auto pairs = expected.view("loss_weights") > 0;
    EXPECT_LT(
        relative_error(out.log_probs.index({pairs}), expected.view("log_probs").index({pairs})),
        kTol);
  }
  double worst = 0;
  for (auto& [name, param] : model->state_tensors()) {
    const double err = relative_error(param.grad(), expected.view("grad." + name));
    EXPECT_LT(err, 2 * kTol) << name;
    worst = std::max(worst, err);
  }
  RecordProperty("bf16_worst_grad_error", std::to_string(worst));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Parity,
                         ::testing::Values("llama_gqa", "qwen2_tied_bias", "llama3_value"));

}  // namespace
}  // namespace rlhf::models
