#include "kernels/kernels.h"

#include <c10/cuda/CUDAStream.h>

#include <string>

#include "core/errors.h"
#include "kernels/launchers.h"

namespace rlhf::kernels {
namespace {

// The launcher's result as an exception naming the kernel: not compiled in (how to build it),
// or CUDA's error.
void check(int code, const char* kernel) {
  if (code == 0) return;
  if (code == detail::kNotCompiled) {
    throw RuntimeError(std::string("kernels: ") + kernel +
                       " is not compiled into this binary (configure with the CUDA toolkit and "
                       "-DRLHF_FLASHINFER_INCLUDE=$(scripts/get-flashinfer))");
  }
  throw RuntimeError(std::string("kernels: ") + kernel + " failed with CUDA error " +
                     std::to_string(code));
}

detail::DType dtype_of(const torch::Tensor& t, const char* kernel) {
  switch (t.scalar_type()) {
    case torch::kHalf:
      return detail::DType::kF16;
    case torch::kBFloat16:
      return detail::DType::kBF16;
    case torch::kFloat:
      return detail::DType::kF32;
    default:
      throw InputError(std::string("kernels: ") + kernel + " takes FP16, BF16 or FP32, got " +
                       std::string(c10::toString(t.scalar_type())));
  }
}

void require_cuda(const torch::Tensor& t, const char* kernel, const char* what) {
  if (!t.is_cuda()) {
    throw InputError(std::string("kernels: ") + kernel + "'s " + what +
                     " must be a CUDA tensor (the CPU path uses torch's operators)");
  }
}

void* stream_of(const torch::Tensor& t) {
  return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
}

uint32_t u32(int64_t v) {
  return static_cast<uint32_t>(v);
}

thread_local bool kernels_enabled = false;

}  // namespace

bool available() {
  return detail::compiled_in();
}
bool enabled_here() {
  return kernels_enabled && available();
}
EnableInScope::EnableInScope(bool on) : previous_(kernels_enabled) {
  kernels_enabled = on;
}
EnableInScope::~EnableInScope() {
  kernels_enabled = previous_;
}
std::string flashinfer_version() {
  return detail::flashinfer_version();
}
std::string cuda_architectures() {
  return detail::cuda_architectures();
}

torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  require_cuda(x, "rms_norm", "input");
  const int64_t d = x.size(-1);
  auto in = x.reshape({-1, d}).contiguous();
  auto w = weight.to(x.scalar_type()).contiguous();
  auto out = torch::empty_like(in);
  check(detail::rms_norm(dtype_of(x, "rms_norm"), in.data_ptr(), w.data_ptr(), out.data_ptr(),
                         u32(in.size(0)), u32(d), u32(d), u32(d), static_cast<float>(eps),
                         stream_of(x)),
        "rms_norm");
  return out.view(x.sizes());
}

void fused_add_rms_norm(torch::Tensor& x, torch::Tensor& residual, const torch::Tensor& weight,
                        double eps) {
  require_cuda(x, "fused_add_rms_norm", "input");
  TORCH_CHECK(x.is_contiguous() && residual.is_contiguous() && x.sizes() == residual.sizes() &&
                  x.scalar_type() == residual.scalar_type(),
              "fused_add_rms_norm: x and residual must be contiguous, of one shape and dtype");
  const int64_t d = x.size(-1);
  auto w = weight.to(x.scalar_type()).contiguous();
  check(detail::fused_add_rms_norm(dtype_of(x, "fused_add_rms_norm"), x.data_ptr(),
                                   residual.data_ptr(), w.data_ptr(), u32(x.numel() / d), u32(d),
                                   u32(d), u32(d), static_cast<float>(eps), stream_of(x)),
        "fused_add_rms_norm");
}

torch::Tensor silu_and_mul(const torch::Tensor& gate_up) {
  require_cuda(gate_up, "silu_and_mul", "input");
  const int64_t two_d = gate_up.size(-1);
  TORCH_CHECK(two_d % 2 == 0, "silu_and_mul: the last dimension must be even, got ", two_d);
  auto in = gate_up.reshape({-1, two_d}).contiguous();
  auto sizes = gate_up.sizes().vec();
  sizes.back() = two_d / 2;
  auto out = torch::empty(sizes, gate_up.options());
  check(detail::silu_and_mul(dtype_of(gate_up, "silu_and_mul"), in.data_ptr(), out.data_ptr(),
                             u32(in.size(0)), u32(two_d / 2), stream_of(gate_up)),
        "silu_and_mul");
  return out;
}

torch::Tensor top_k_top_p_sample(const torch::Tensor& probs, int64_t top_k, double top_p,
                                 const torch::Tensor& seed_offset) {
  require_cuda(probs, "top_k_top_p_sample", "probs");
  TORCH_CHECK(probs.dim() == 2 && probs.scalar_type() == torch::kFloat,
              "top_k_top_p_sample: probs must be [B, V] FP32");
  TORCH_CHECK(seed_offset.is_cuda() && seed_offset.numel() == 2 &&
                  seed_offset.scalar_type() == torch::kLong && seed_offset.is_contiguous(),
              "top_k_top_p_sample: seed_offset must be [2] int64 on the device");
  auto p = probs.contiguous();
  const auto options = probs.options();
  auto out = torch::empty({p.size(0)}, options.dtype(torch::kInt));
  auto valid = torch::empty({p.size(0)}, options.dtype(torch::kBool));
  check(detail::top_k_top_p_sample(
            p.data_ptr<float>(), out.data_ptr<int32_t>(), valid.data_ptr<bool>(), u32(p.size(0)),
            u32(p.size(1)), static_cast<int32_t>(top_k), static_cast<float>(top_p),
            static_cast<uint64_t*>(seed_offset.data_ptr()), stream_of(probs)),
        "top_k_top_p_sample");
  return out.to(torch::kLong);
}

PagedDecodePlan plan_paged_decode(const torch::Tensor& block_tables, const torch::Tensor& positions,
                                  int64_t page_size) {
  TORCH_CHECK(block_tables.dim() == 2 && positions.dim() == 1 &&
                  positions.size(0) == block_tables.size(0) && page_size > 0,
              "plan_paged_decode: block tables [B, M] and positions [B], got ",
              block_tables.sizes(), " and ", positions.sizes());
  const int64_t B = block_tables.size(0), M = block_tables.size(1);
  const auto i32 = block_tables.options().dtype(torch::kInt);
  PagedDecodePlan plan;
  auto pages = torch::div(positions, page_size, "floor").add(1).to(torch::kInt);  // [B]
  plan.indptr = torch::cat({torch::zeros({1}, i32), pages.cumsum(0).to(torch::kInt)});
  // Row b's j-th page goes to indptr[b] + j; entries past its pages go to the dump at B * M.
  auto j = torch::arange(M, i32).view({1, M});
  auto dest = torch::where(j < pages.view({B, 1}), plan.indptr.slice(0, 0, B).view({B, 1}) + j,
                           torch::full({1, 1}, B * M, i32));
  plan.indices = torch::zeros({B * M + 1}, i32)
                     .scatter_(0, dest.reshape({-1}).to(torch::kLong),
                               block_tables.reshape({-1}).to(torch::kInt));
  plan.last_page_len = positions.remainder(page_size).add(1).to(torch::kInt);
  plan.request_indices = torch::arange(B, i32);
  plan.kv_tile_indices = torch::zeros({B}, i32);
  plan.o_indptr = torch::arange(B + 1, i32);
  plan.kv_chunk_size = torch::full({1}, M * page_size, i32);
  return plan;
}

bool paged_decode_supported(torch::Dtype dtype, int64_t head_dim, int64_t heads, int64_t kv_heads) {
  return available() && (dtype == torch::kBFloat16 || dtype == torch::kHalf) &&
         detail::paged_decode_supported(u32(head_dim), u32(heads), u32(kv_heads));
}

torch::Tensor paged_decode_attention(const torch::Tensor& q, const torch::Tensor& k_pool,
                                     const torch::Tensor& v_pool, const PagedDecodePlan& plan,
                                     double sm_scale) {
  require_cuda(q, "paged_decode_attention", "query");
  TORCH_CHECK(q.dim() == 3 && k_pool.dim() == 4 && v_pool.sizes() == k_pool.sizes() &&
                  k_pool.strides() == v_pool.strides() && q.size(2) == k_pool.size(3) &&
                  q.stride(2) == 1 && k_pool.stride(3) == 1 &&
                  q.scalar_type() == k_pool.scalar_type(),
              "paged_decode_attention: q [B, H, D] and pools [pages, page_size, kv_heads, D] of "
              "one dtype, got ",
              q.sizes(), " and ", k_pool.sizes());
  TORCH_CHECK(plan.last_page_len.size(0) == q.size(0), "paged_decode_attention: the plan is for ",
              plan.last_page_len.size(0), " rows, q has ", q.size(0));
  auto out = torch::empty({q.size(0), q.size(1), q.size(2)}, q.options());
  detail::PagedDecodeArgs a;
  a.dtype = dtype_of(q, "paged_decode_attention");
  a.head_dim = u32(q.size(2));
  a.batch = u32(q.size(0));
  a.heads = u32(q.size(1));
  a.kv_heads = u32(k_pool.size(2));
  a.page_size = u32(k_pool.size(1));
  a.q = q.data_ptr();
  a.q_stride_n = q.stride(0);
  a.q_stride_h = q.stride(1);
  a.k = k_pool.data_ptr();
  a.v = v_pool.data_ptr();
  for (int i = 0; i < 3; ++i) a.kv_strides[i] = k_pool.stride(i);
  a.indices = plan.indices.data_ptr<int32_t>();
  a.indptr = plan.indptr.data_ptr<int32_t>();
  a.last_page_len = plan.last_page_len.data_ptr<int32_t>();
  a.request_indices = plan.request_indices.data_ptr<int32_t>();
  a.kv_tile_indices = plan.kv_tile_indices.data_ptr<int32_t>();
  a.o_indptr = plan.o_indptr.data_ptr<int32_t>();
  a.kv_chunk_size = plan.kv_chunk_size.data_ptr<int32_t>();
  a.o = out.data_ptr();
  a.sm_scale = static_cast<float>(sm_scale);
  a.stream = stream_of(q);
  check(detail::paged_decode(a), "paged_decode_attention");
  return out;
}

}  // namespace rlhf::kernels
