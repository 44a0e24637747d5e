// Llama decoder layer; see decoder_layer.h. Numerics follow transformers' modeling_llama:
// RMSNorm statistics and softmax in FP32, matmuls in the parameters' dtype.
#include "models/decoder_layer.h"

#include <ATen/ops/_flash_attention_forward.h>
#include <ATen/ops/linear.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/kernels.h"
#include "models/kv_cache.h"
#include "models/moe.h"

namespace rlhf::models {

// HF's inv_freq: 1 / theta^(2i/D), then the rope_scaling adjustment, all in FP32.
torch::Tensor inverse_frequencies(const ModelConfig& c, bool local) {
  const int64_t D = c.head_dim;
  auto exponents =
      torch::arange(0, D, 2, torch::kInt64).to(torch::kFloat32) / static_cast<double>(D);
  torch::Tensor inv_freq = 1.0 / torch::pow(local ? c.rope_local_theta : c.rope_theta, exponents);
  if (local) return inv_freq;
  const RopeScaling& r = c.rope_scaling;
  if (r.type == RopeScalingType::kLinear) return inv_freq / r.factor;
  if (r.type != RopeScalingType::kLlama3) return inv_freq;
  // Llama 3.1 frequency-dependent scaling (transformers _compute_llama3_parameters).
  const double old_len = static_cast<double>(r.original_max_position_embeddings);
  const double low_wavelen = old_len / r.low_freq_factor;
  const double high_wavelen = old_len / r.high_freq_factor;
  auto wavelen = 2 * M_PI / inv_freq;
  auto scaled = torch::where(wavelen > low_wavelen, inv_freq / r.factor, inv_freq);
  auto smooth = (old_len / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
  auto smoothed = (1 - smooth) * scaled / r.factor + smooth * scaled;
  auto medium = (wavelen >= high_wavelen).logical_and(wavelen <= low_wavelen);
  return torch::where(medium, smoothed, scaled);
}

namespace {

// [..., D] -> [..., D]: (-x2, x1) for halves x1, x2.
torch::Tensor rotate_half(const torch::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

// q: [B, nh, T, D], k/v: [B, kv, S, D] -> [B, nh, T, D]. Fused SDPA: grouped-query heads
// without copying k/v (enable_gqa); with no mask and `causal`, the flash kernels can run.
// Causal attention within each segment of in.varlen: the real tokens gathered into [N, heads,
// D], flash attention's varlen kernel (grouped-query heads as they are; autograd has its
// backward), scattered back to [B, heads, T, D] (zeros at padding).
torch::Tensor attend_varlen(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                            const VarlenSegments& seg, double scale) {
  const int64_t B = q.size(0), T = q.size(2), D = q.size(3);
  auto tokens = [&](const torch::Tensor& x) {  // [B, n, T, D] -> [N, n, D]
    return x.transpose(1, 2).reshape({B * T, x.size(1), D}).index_select(0, seg.token_index);
  };
  auto out = std::get<0>(at::_flash_attention_forward(
      tokens(q), tokens(k), tokens(v), seg.cu_seqlens, seg.cu_seqlens, seg.max_len, seg.max_len,
      /*dropout_p=*/0.0, /*is_causal=*/true, /*return_debug_mask=*/false, scale));
  return torch::zeros({B * T, q.size(1), D}, out.options())
      .index_copy(0, seg.token_index, out)
      .view({B, T, q.size(1), D})
      .transpose(1, 2);
}

torch::Tensor attend(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                     const AttentionInputs& in, double scale) {
  if (in.varlen) return attend_varlen(q, k, v, *in.varlen, scale);
  const bool gqa = q.size(1) != k.size(1);
  return at::scaled_dot_product_attention(q, k, v, in.mask, 0.0, in.causal, scale, gqa);
}

// projected [B, T, n D] (a projection's output, or its slice of a fused one) -> [B, n, T, D]:
// n heads of D, each normalised over D by `norm` when there is one (qwen3's q_norm / k_norm,
// before RoPE as in Qwen3Attention). The one place q and k are made, for every path: dense,
// KV-cached, paged, tensor-parallel, fused or not.
torch::Tensor heads_of(const torch::Tensor& projected, RMSNormImpl* norm, int64_t n, int64_t D) {
  auto h = projected.view({projected.size(0), projected.size(1), n, D});  // [B, T, n, D]
  if (norm) h = norm->forward(h);
  return h.transpose(1, 2);
}

// `parts` (maps of one input, [rows_i, in] each, with biases or without) stacked into one
// FusedParts. Throws when a weight is still a deferred placeholder.
FusedParts fuse_parts(const std::vector<Linear>& parts) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> weights, biases;
  for (const auto& part : parts) {
    TORCH_CHECK(part->weight.dim() == 2 && part->weight.numel() > 0,
                "fuse: a weight is not set yet (deferred placeholder of shape ",
                part->weight.sizes(), "); fuse after loading");
    weights.push_back(part->weight);
    if (part->bias.defined()) biases.push_back(part->bias);
  }
  TORCH_CHECK(biases.empty() || biases.size() == parts.size(),
              "fuse: either every part has a bias or none has");
  auto weight = torch::cat(weights, 0);  // [sum rows, in]
  FusedParts out;
  out.fused = Linear(weight.size(1), weight.size(0), !biases.empty(), Materialize::kDeferred);
  out.fused->weight.set_data(weight);
  out.fused->weight.set_requires_grad(parts[0]->weight.requires_grad());
  if (!biases.empty()) {
    out.fused->bias.set_data(torch::cat(biases, 0));
    out.fused->bias.set_requires_grad(parts[0]->bias.requires_grad());
  }
  out.parts = parts;
  out.bind();
  return out;
}

// A row-parallel linear map: this rank's partial product, summed over the TP group, then
// the bias once (HF's o_proj / down_proj bias is replicated, not split).
torch::Tensor row_parallel(Linear& linear, const torch::Tensor& x, const TensorParallel* tp) {
  if (tp == nullptr || !tp->enabled()) return linear->forward(x);
  TORCH_CHECK(!linear->lora, "LoRA adapters on a tensor-parallel shard are not supported");
  auto out = at::linear(x, linear->weight).contiguous();
  tensor_parallel_all_reduce(*tp, out);
  if (linear->bias.defined()) out = out + linear->bias;
  return out;
}

}  // namespace

void rotary_tables(const torch::Tensor& inv_freq, const torch::Tensor& position_ids,
                   torch::Dtype dtype, torch::Tensor& cos, torch::Tensor& sin) {
  TORCH_CHECK(position_ids.dim() == 2, "position_ids must be [B, T], got ", position_ids.sizes());
  auto freqs = position_ids.to(torch::kFloat32).unsqueeze(-1) * inv_freq;  // [B, T, D/2]
  auto emb = torch::cat({freqs, freqs}, -1);                               // [B, T, D]
  cos = emb.cos().to(dtype);
  sin = emb.sin().to(dtype);
}

torch::Tensor attention_mask_tensor(const torch::Tensor& attention_mask, int64_t past, int64_t T,
                                    int64_t sliding_window) {
  const int64_t S = past + T;
  TORCH_CHECK(attention_mask.dim() == 2 && attention_mask.size(1) == S,
              "attention_mask must be [B, ", S, "] (cached + new positions), got ",
              attention_mask.sizes());
  auto opts = torch::TensorOptions().dtype(torch::kInt64).device(attention_mask.device());
  auto q_pos = torch::arange(past, S, opts).unsqueeze(1);  // [T, 1]
  auto k_pos = torch::arange(0, S, opts).unsqueeze(0);     // [1, S]
  auto allowed = k_pos <= q_pos;                           // [T, S]
  if (sliding_window > 0) allowed = allowed.logical_and(q_pos - k_pos < sliding_window);
  auto segment = attention_mask.to(torch::kInt64);  // [B, S]
  auto keys_present = (segment != 0).unsqueeze(1);  // [B, 1, S]
  // Packed rows: a token attends within its segment only (padding queries keep all keys).
  auto q_segment = segment.narrow(1, past, T).unsqueeze(2);                            // [B, T, 1]
  auto same_segment = (q_segment == segment.unsqueeze(1)).logical_or(q_segment == 0);  // [B, T, S]
  auto mask = allowed.unsqueeze(0)
                  .logical_and(keys_present)
                  .logical_and(same_segment)
                  .logical_or(k_pos == q_pos);  // [B, T, S]
  return mask.unsqueeze(1);                     // [B, 1, T, S]
}

VarlenSegments varlen_segments(const torch::Tensor& attention_mask, const torch::Device& device) {
  TORCH_CHECK(attention_mask.dim() == 2, "varlen_segments: attention_mask must be [B, T], got ",
              attention_mask.sizes());
  const auto mask = attention_mask.to(torch::kCPU, torch::kInt64).contiguous();
  const int64_t B = mask.size(0), T = mask.size(1);
  const int64_t* m = mask.data_ptr<int64_t>();
  std::vector<int64_t> index;
  std::vector<int32_t> cu = {0};
  VarlenSegments seg;
  for (int64_t b = 0; b < B; ++b) {
    // A segment is every position of the row with one nonzero id, in order (contiguous or
    // not, as attention_mask_tensor reads it); segments in the order they start.
    std::vector<std::pair<int64_t, std::vector<int64_t>>> groups;
    for (int64_t t = 0; t < T; ++t) {
      const int64_t id = m[b * T + t];
      if (id == 0) continue;
      auto it =
          std::find_if(groups.begin(), groups.end(), [id](const auto& g) { return g.first == id; });
      if (it == groups.end()) it = groups.insert(groups.end(), {id, {}});
      it->second.push_back(b * T + t);
    }
    for (const auto& [id, positions] : groups) {
      index.insert(index.end(), positions.begin(), positions.end());
      cu.push_back(static_cast<int32_t>(index.size()));
      seg.max_len = std::max<int64_t>(seg.max_len, static_cast<int64_t>(positions.size()));
    }
  }
  seg.token_index = torch::tensor(index, torch::kInt64).to(device);
  seg.cu_seqlens = torch::tensor(cu, torch::kInt32).to(device);
  return seg;
}

void set_attention_mask(AttentionInputs& in, const torch::Tensor& attention_mask, int64_t past,
                        int64_t T, int64_t sliding_window, bool known_plain) {
  const int64_t S = past + T;
  const bool window_applies = sliding_window > 0 && sliding_window < S;
  // One host sync per forward (not per layer) unless the caller knows: is every key a
  // plain token?
  const bool plain =
      known_plain || !attention_mask.defined() || (attention_mask == 1).all().item<bool>();
  if (plain && !window_applies && (past == 0 || T == 1)) {
    // No padding and no packed segments: causal attention needs no mask. SDPA's is_causal
    // aligns the triangle top-left, which is the causal mask only when T == S; a one-token
    // step over a cache sees every key.
    in.mask = std::nullopt;
    in.causal = past == 0 && T > 1;
    return;
  }
  TORCH_CHECK(attention_mask.defined(), "attention mask: needed with a cache and T > 1");
  in.mask = attention_mask_tensor(attention_mask, past, T, sliding_window);
  in.causal = false;
}

RMSNormImpl::RMSNormImpl(int64_t hidden, double eps, Materialize how, bool unit_offset)
    : eps_(eps), unit_offset_(unit_offset) {
  weight = register_parameter("weight", new_parameter({hidden}, how));
  if (how == Materialize::kAllocate) weight.data().fill_(unit_offset ? 0.0 : 1.0);
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
  // The rollout on a GPU in 16 bits: FlashInfer's one-kernel RMSNorm (kernels/; FP32 inside,
  // one rounding at the end where the torch path below rounds twice: within one ulp of it).
  if (!unit_offset_ && x.is_cuda() && x.scalar_type() != torch::kFloat32 &&
      !torch::GradMode::is_enabled() && kernels::enabled_here()) {
    return kernels::rms_norm(x, weight, eps_);
  }
  auto xf = x.to(torch::kFloat32);
  auto variance = xf.pow(2).mean(-1, /*keepdim=*/true);
  if (unit_offset_)  // Gemma3RMSNorm: (x_hat * (1 + w)) in FP32, then rounded
    return (xf * torch::rsqrt(variance + eps_) * (1.0 + weight.to(torch::kFloat32)))
        .to(x.scalar_type());
  return weight * (xf * torch::rsqrt(variance + eps_)).to(x.scalar_type());
}

AttentionImpl::AttentionImpl(const ModelConfig& c, const LayerSpec& spec, Materialize how,
                             const TensorParallel* tp)
    : heads_(c.num_attention_heads),
      kv_heads_(c.num_key_value_heads),
      head_dim_(c.head_dim),
      scale_(spec.attention_scale > 0 ? spec.attention_scale
                                      : 1.0 / std::sqrt(static_cast<double>(c.head_dim))),
      tp_(tp) {
  const int64_t H = c.hidden_size;
  q_proj = register_module("q_proj", Linear(H, heads_ * head_dim_, spec.qkv_bias, how));
  k_proj = register_module("k_proj", Linear(H, kv_heads_ * head_dim_, spec.qkv_bias, how));
  v_proj = register_module("v_proj", Linear(H, kv_heads_ * head_dim_, spec.qkv_bias, how));
  o_proj = register_module("o_proj", Linear(heads_ * head_dim_, H, spec.o_proj_bias, how));
  if (spec.qk_norm) {
    q_norm = register_module("q_norm", std::make_shared<RMSNormImpl>(head_dim_, c.rms_norm_eps, how,
                                                                     spec.norm_unit_offset));
    k_norm = register_module("k_norm", std::make_shared<RMSNormImpl>(head_dim_, c.rms_norm_eps, how,
                                                                     spec.norm_unit_offset));
  }
}

std::vector<torch::Tensor> FusedParts::forward(const torch::Tensor& x) {
  std::vector<int64_t> rows;
  for (const auto& part : parts) rows.push_back(part->weight.size(0));
  auto pieces = at::linear(x, fused->weight, fused->bias).split_with_sizes(rows, -1);
  for (size_t i = 0; i < parts.size(); ++i) pieces[i] = parts[i]->add_lora(pieces[i], x);
  return pieces;
}

bool FusedParts::plain() const {
  for (const auto& part : parts)
    if (part->lora) return false;
  return true;
}

void FusedParts::bind() {
  torch::NoGradGuard no_grad;
  int64_t at = 0;
  for (auto& part : parts) {
    const int64_t rows = part->weight.size(0);
    part->weight.set_data(fused->weight.narrow(0, at, rows));
    if (part->bias.defined()) part->bias.set_data(fused->bias.narrow(0, at, rows));
    at += rows;
  }
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& x, const AttentionInputs& in,
                                     KvStore* cache, int64_t layer_index) {
  const int64_t B = x.size(0), T = x.size(1);
  std::vector<torch::Tensor> qkv;  // [B, T, nh D], [B, T, kv D], [B, T, kv D]
  if (fused())
    qkv = qkv_.forward(x);
  else
    qkv = {q_proj->forward(x), k_proj->forward(x), v_proj->forward(x)};
  auto q = heads_of(qkv[0], q_norm.get(), heads_, head_dim_);     // [B, nh, T, D]
  auto k = heads_of(qkv[1], k_norm.get(), kv_heads_, head_dim_);  // [B, kv, T, D]
  auto v = heads_of(qkv[2], nullptr, kv_heads_, head_dim_);       // [B, kv, T, D]
  auto cos = in.cos.unsqueeze(1), sin = in.sin.unsqueeze(1);      // [B, 1, T, D]
  q = q * cos + rotate_half(q) * sin;
  k = k * cos + rotate_half(k) * sin;
  torch::Tensor out;
  if (cache) {  // a paged decode step on a GPU attends in place, without gathering the blocks
    out = cache->append_and_attend(layer_index, q, k, v, scale_);
    if (!out.defined()) std::tie(k, v) = cache->append(layer_index, k, v);  // [B, kv, S, D]
  }
  if (!out.defined()) out = attend(q, k, v, in, scale_);  // [B, nh, T, D]
  return row_parallel(o_proj, out.transpose(1, 2).reshape({B, T, heads_ * head_dim_}), tp_);
}

void AttentionImpl::fuse() {
  if (fused()) return;
  qkv_ = fuse_parts({q_proj, k_proj, v_proj});
  // Re-registered in HF order, so named_parameters() expands to the unfused order.
  for (const char* name : {"q_proj", "k_proj", "v_proj", "o_proj"}) unregister_module(name);
  if (q_norm) {
    unregister_module("q_norm");
    unregister_module("k_norm");
  }
  register_module("qkv_proj", qkv_.fused);
  register_module("o_proj", o_proj);
  if (q_norm) {
    register_module("q_norm", q_norm);
    register_module("k_norm", k_norm);
  }
}

// torch's Module::to moves the registered qkv_proj (set_data); the parts' aliases follow.
void AttentionImpl::to(torch::Device device, torch::Dtype dtype, bool non_blocking) {
  torch::nn::Module::to(device, dtype, non_blocking);
  if (fused()) qkv_.bind();
}
void AttentionImpl::to(torch::Dtype dtype, bool non_blocking) {
  torch::nn::Module::to(dtype, non_blocking);
  if (fused()) qkv_.bind();
}
void AttentionImpl::to(torch::Device device, bool non_blocking) {
  torch::nn::Module::to(device, non_blocking);
  if (fused()) qkv_.bind();
}

MlpImpl::MlpImpl(const ModelConfig& c, const LayerSpec& spec, Materialize how,
                 const TensorParallel* tp)
    : tp_(tp), activation_(spec.activation) {
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  gate_proj = register_module("gate_proj", Linear(H, I, spec.mlp_bias, how));
  up_proj = register_module("up_proj", Linear(H, I, spec.mlp_bias, how));
  down_proj = register_module("down_proj", Linear(I, H, spec.mlp_bias, how));
}

torch::Tensor MlpImpl::act(const torch::Tensor& gate) const {
  if (activation_ == Activation::kGeluTanh) return torch::gelu(gate, "tanh");
  return torch::silu(gate);
}

torch::Tensor MlpImpl::forward(const torch::Tensor& x) {
  auto mlp = [this](const torch::Tensor& in) {
    // The rollout on a GPU in 16 bits: the fused [gate | up] output straight into FlashInfer's
    // SiLU-and-mul (one kernel for silu, the product and the split).
    if (activation_ == Activation::kSilu && fused() && gate_up_.plain() && in.is_cuda() &&
        in.scalar_type() != torch::kFloat32 && !torch::GradMode::is_enabled() &&
        kernels::enabled_here()) {
      const auto& f = gate_up_.fused;
      return row_parallel(down_proj, kernels::silu_and_mul(at::linear(in, f->weight, f->bias)),
                          tp_);
    }
    if (fused()) {
      auto gate_up = gate_up_.forward(in);  // [..., I] each
      return row_parallel(down_proj, act(gate_up[0]) * gate_up[1], tp_);
    }
    return row_parallel(down_proj, act(gate_proj->forward(in)) * up_proj->forward(in), tp_);
  };
  const int64_t H = x.size(-1), tokens = x.numel() / std::max<int64_t>(1, H);
  if (torch::GradMode::is_enabled() || tokens <= kInferenceMlpChunkTokens) return mlp(x);
  // Every tensor-parallel rank has the same token count, so the same chunks (and collectives).
  const torch::Tensor flat = x.reshape({tokens, H});
  torch::Tensor out = torch::empty_like(flat);
  for (int64_t start = 0; start < tokens; start += kInferenceMlpChunkTokens) {
    const int64_t n = std::min(kInferenceMlpChunkTokens, tokens - start);
    out.narrow(0, start, n).copy_(mlp(flat.narrow(0, start, n)));
  }
  return out.view(x.sizes());
}

void MlpImpl::fuse() {
  if (fused()) return;
  gate_up_ = fuse_parts({gate_proj, up_proj});
  for (const char* name : {"gate_proj", "up_proj", "down_proj"}) unregister_module(name);
  register_module("gate_up_proj", gate_up_.fused);
  register_module("down_proj", down_proj);
}

void MlpImpl::to(torch::Device device, torch::Dtype dtype, bool non_blocking) {
  torch::nn::Module::to(device, dtype, non_blocking);
  if (fused()) gate_up_.bind();
}
void MlpImpl::to(torch::Dtype dtype, bool non_blocking) {
  torch::nn::Module::to(dtype, non_blocking);
  if (fused()) gate_up_.bind();
}
void MlpImpl::to(torch::Device device, bool non_blocking) {
  torch::nn::Module::to(device, non_blocking);
  if (fused()) gate_up_.bind();
}

DecoderLayerImpl::DecoderLayerImpl(const ModelConfig& c, const LayerSpec& spec, Materialize how,
                                   const TensorParallel* tp, const ExpertParallel* ep)
    : spec_(spec) {
  self_attn = register_module("self_attn", std::make_shared<AttentionImpl>(c, spec, how, tp));
  if (spec.moe.sparse()) {
    moe = register_module(spec.moe.mixtral_names ? "block_sparse_moe" : "mlp",
                          std::make_shared<SparseMoeImpl>(c, spec, how, tp, ep));
  } else {
    mlp = register_module("mlp", std::make_shared<MlpImpl>(c, spec, how, tp));
  }
  // In HF's order (Gemma3DecoderLayer registers its extra two norms last).
  auto norm = [&](const char* name) {
    return register_module(name, std::make_shared<RMSNormImpl>(c.hidden_size, c.rms_norm_eps, how,
                                                               spec.norm_unit_offset));
  };
  input_layernorm = norm("input_layernorm");
  post_attention_layernorm = norm("post_attention_layernorm");
  if (spec.sandwich_norms) {
    pre_feedforward_layernorm = norm("pre_feedforward_layernorm");
    post_feedforward_layernorm = norm("post_feedforward_layernorm");
  }
}

torch::Tensor DecoderLayerImpl::forward(const torch::Tensor& x, const AttentionInputs& in,
                                        KvStore* cache, int64_t layer_index) {
  if (spec_.sandwich_norms) {  // Gemma3DecoderLayer
    auto h = x + post_attention_layernorm->forward(
                     self_attn->forward(input_layernorm->forward(x), in, cache, layer_index));
    return h +
           post_feedforward_layernorm->forward(feed_forward(pre_feedforward_layernorm->forward(h)));
  }
  auto h = x + self_attn->forward(input_layernorm->forward(x), in, cache, layer_index);
  return h + feed_forward(post_attention_layernorm->forward(h));
}

torch::Tensor DecoderLayerImpl::feed_forward(const torch::Tensor& x) {
  return moe ? moe->forward(x) : mlp->forward(x);
}

}  // namespace rlhf::models
