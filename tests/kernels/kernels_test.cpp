// The FlashInfer kernels against torch's operators (the reference): on a GPU (_CUDA tests,
// skipped without one), and what the build says it compiled in, everywhere.
#include "kernels/kernels.h"

#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <cmath>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "core/errors.h"
#include "test_paths.h"

namespace rlhf::kernels {
namespace {

#define SKIP_WITHOUT_GPU()                                                 \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device here"; \
  ASSERT_TRUE(available()) << "the kernels were not compiled into this build"

// The version scripts/get-flashinfer pins.
std::string pinned_version() {
  std::ifstream in(std::string(RLHF_SOURCE_DIR) + "/scripts/get-flashinfer");
  std::string line;
  std::smatch m;
  static const std::regex pin("^version=(\\S+)$");
  while (std::getline(in, line)) {
    if (std::regex_match(line, m, pin)) return m[1];
  }
  return "";
}

TEST(Kernels, BuildReportsWhatItCompiledIn) {
  EXPECT_EQ(available(), RLHF_TEST_HAVE_FLASHINFER == 1);
  if (available()) {
    EXPECT_EQ(flashinfer_version(), pinned_version());
    EXPECT_FALSE(cuda_architectures().empty());
  } else {
    EXPECT_EQ(flashinfer_version(), "");
  }
}

TEST(Kernels, RefuseCpuTensorsByName) {
  auto x = torch::ones({2, 8});
  try {
    rms_norm(x, torch::ones({8}), 1e-6);
    FAIL() << "a CPU tensor was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("rms_norm's input must be a CUDA tensor"),
              std::string::npos)
        << e.what();
  }
}

torch::Tensor reference_rms_norm(const torch::Tensor& x, const torch::Tensor& w, double eps) {
  auto xf = x.to(torch::kFloat);
  return (xf * torch::rsqrt(xf.pow(2).mean(-1, true) + eps) * w.to(torch::kFloat))
      .to(x.scalar_type());
}

// BF16 results are rounded once from FP32 by both: they may differ by one BF16 ulp (2^-7
// relative); FP32 within 1e-5.
void expect_close(const torch::Tensor& got, const torch::Tensor& want) {
  const double tol = got.scalar_type() == torch::kFloat ? 1e-5 : 1.6e-2;
  EXPECT_TRUE(torch::allclose(got.to(torch::kFloat), want.to(torch::kFloat), tol, tol))
      << "max diff " << (got.to(torch::kFloat) - want.to(torch::kFloat)).abs().max().item<float>();
}

TEST(Kernels, RmsNormMatchesTorch_CUDA) {
  SKIP_WITHOUT_GPU();
  for (auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(dtype);
    auto x = torch::randn({3, 5, 576}, opts);  // SmolLM2-135M's hidden size
    auto w = torch::randn({576}, opts);
    expect_close(rms_norm(x, w, 1e-5), reference_rms_norm(x, w, 1e-5));
  }
}

TEST(Kernels, FusedAddRmsNormMatchesTorch_CUDA) {
  SKIP_WITHOUT_GPU();
  auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kFloat);
  auto x = torch::randn({7, 896}, opts);  // Qwen2-0.5B's hidden size
  auto residual = torch::randn({7, 896}, opts);
  auto w = torch::randn({896}, opts);
  auto want_residual = residual + x;
  auto want = reference_rms_norm(want_residual, w, 1e-6);
  fused_add_rms_norm(x, residual, w, 1e-6);
  expect_close(residual, want_residual);
  expect_close(x, want);
}

TEST(Kernels, SiluAndMulMatchesTorch_CUDA) {
  SKIP_WITHOUT_GPU();
  for (int64_t d : {1536, 4864, 13}) {  // SmolLM2, Qwen2-0.5B, and an odd width
    auto gate_up = torch::randn({4, 2 * d}, torch::TensorOptions().device(torch::kCUDA));
    auto gate = gate_up.slice(-1, 0, d), up = gate_up.slice(-1, d);
    expect_close(silu_and_mul(gate_up), torch::silu(gate) * up);
  }
}

torch::Tensor seed_offset(uint64_t seed) {
  return torch::tensor({static_cast<int64_t>(seed), int64_t{0}}, torch::kLong).to(torch::kCUDA);
}

TEST(Kernels, TopKOneIsArgmax_CUDA) {
  SKIP_WITHOUT_GPU();
  auto probs = torch::softmax(torch::randn({64, 49152}, torch::kCUDA), -1);
  auto tokens = top_k_top_p_sample(probs, 1, 1.0, seed_offset(7));
  EXPECT_TRUE(torch::equal(tokens, probs.argmax(-1)));
}

// Draws follow the top-p nucleus renormalised: probs (0.5, 0.3, 0.2) with p = 0.75 keep the
// first two, drawn 5/8 and 3/8 of the time. 8192 draws: the standard error of a frequency is
// about 0.0054; 0.025 is over 4.5 of them.
TEST(Kernels, TopPDrawsFollowTheNucleus_CUDA) {
  SKIP_WITHOUT_GPU();
  auto probs = torch::tensor({0.5f, 0.3f, 0.2f}).to(torch::kCUDA).repeat({8192, 1});
  auto tokens = top_k_top_p_sample(probs, -1, 0.75, seed_offset(11)).cpu();
  const double n = 8192;
  EXPECT_EQ((tokens == 2).sum().item<int64_t>(), 0);
  EXPECT_NEAR((tokens == 0).sum().item<int64_t>() / n, 0.625, 0.025);
  EXPECT_NEAR((tokens == 1).sum().item<int64_t>() / n, 0.375, 0.025);
}

// The plan is torch operators, so it is checked on the CPU: rows with 1, 3 and 2 pages of 4
// positions (positions 2, 9 and 4) in tables of M = 3.
TEST(Kernels, PagedDecodePlanPacksEachRowsPages) {
  auto tables = torch::tensor({7L, 99L, 99L, 3L, 5L, 1L, 2L, 8L, 99L}).view({3, 3});
  auto positions = torch::tensor({2L, 9L, 4L});
  auto plan = plan_paged_decode(tables, positions, 4);
  auto as_vector = [](const torch::Tensor& t) {
    auto c = t.to(torch::kLong).contiguous();
    return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
  };
  EXPECT_EQ(as_vector(plan.indptr), (std::vector<int64_t>{0, 1, 4, 6}));
  EXPECT_EQ(as_vector(plan.indices.slice(0, 0, 6)), (std::vector<int64_t>{7, 3, 5, 1, 2, 8}));
  EXPECT_EQ(as_vector(plan.last_page_len), (std::vector<int64_t>{3, 2, 1}));
  EXPECT_EQ(as_vector(plan.kv_chunk_size), (std::vector<int64_t>{12}));
}

// Decode attention read in place against the gathered keys and values with torch (FP32
// softmax): rows of different lengths over shared pages, GQA groups 3 (SmolLM2) and 6
// (Qwen2-1.5B), BF16 within 2e-2 (inputs of unit scale).
TEST(Kernels, PagedDecodeMatchesGatheredAttention_CUDA) {
  SKIP_WITHOUT_GPU();
  struct Shape {
    int64_t heads, kv_heads, head_dim;
  };
  for (const Shape& shape : {Shape{9, 3, 64}, Shape{12, 2, 128}}) {
    const int64_t pages = 20, page_size = 16, B = 3, M = 4;
    auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
    auto k_pool = torch::randn({pages, page_size, shape.kv_heads, shape.head_dim}, opts);
    auto v_pool = torch::randn({pages, page_size, shape.kv_heads, shape.head_dim}, opts);
    auto tables = torch::tensor({4L, 9L, 0L, 0L, 4L, 2L, 11L, 6L, 13L, 0L, 0L, 0L})
                      .view({B, M})
                      .to(torch::kCUDA);
    auto positions = torch::tensor({20L, 60L, 0L}).to(torch::kCUDA);
    auto q = torch::randn({B, shape.heads, shape.head_dim}, opts);
    const double scale = 1.0 / std::sqrt(static_cast<double>(shape.head_dim));
    auto out =
        paged_decode_attention(q, k_pool, v_pool, plan_paged_decode(tables, positions, 16), scale);
    const int64_t group = shape.heads / shape.kv_heads;
    for (int64_t b = 0; b < B; ++b) {
      const int64_t n = positions[b].item<int64_t>() + 1;
      auto rows = tables[b];
      auto gather = [&](const torch::Tensor& pool) {
        return pool.index_select(0, rows)
            .reshape({M * page_size, shape.kv_heads, shape.head_dim})
            .slice(0, 0, n)
            .to(torch::kFloat)
            .repeat_interleave(group, 1)
            .transpose(0, 1);  // [heads, n, D]
      };
      auto k = gather(k_pool), v = gather(v_pool);
      auto scores = torch::matmul(q[b].to(torch::kFloat).unsqueeze(1), k.transpose(1, 2)) * scale;
      auto want = torch::matmul(torch::softmax(scores, -1), v).squeeze(1);  // [heads, D]
      EXPECT_TRUE(torch::allclose(out[b].to(torch::kFloat), want, 2e-2, 2e-2))
          << "row " << b << " max diff "
          << (out[b].to(torch::kFloat) - want).abs().max().item<float>();
    }
  }
}

}  // namespace
}  // namespace rlhf::kernels
