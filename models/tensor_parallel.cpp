// Which slice of each parameter a TP rank holds; see tensor_parallel.h.
#include "models/tensor_parallel.h"

#include <ATen/ops/embedding.h>

#include "core/errors.h"
#include "core/text.h"
#include "transport/collective_group.h"

namespace rlhf::models {

namespace {

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

}  // namespace

void check_tensor_parallel(const ModelConfig& c, int tp_size, const std::string& what) {
  if (tp_size < 1)
    throw InputError(what + ": tensor_parallel_size must be >= 1, got " + std::to_string(tp_size));
  if (tp_size == 1) return;
  if (c.head != HeadKind::kLanguageModel)
    throw InputError(what +
                     ": tensor parallelism is for an LM head (the rollout), not a value head");
  // A mixture of experts splits each expert (and the shared expert) as a dense MLP.
  const std::pair<const char*, int64_t> sizes[] = {
      {"num_attention_heads", c.num_attention_heads},
      {"num_key_value_heads", c.num_key_value_heads},
      {"intermediate_size", c.intermediate_size},
      {"vocab_size", c.vocab_size},
      {"moe_intermediate_size", c.moe.num_experts > 0 ? c.moe.moe_intermediate_size : 0},
      {"shared_expert_intermediate_size", c.moe.shared_expert_intermediate_size}};
  for (const auto& [name, value] : sizes)
    if (value % tp_size != 0)
      throw InputError(what + ": tensor_parallel_size " + std::to_string(tp_size) +
                       " does not divide the model's " + name + " (" + std::to_string(value) +
                       "); choose a divisor of it");
}

ModelConfig tensor_parallel_shard_config(const ModelConfig& config, int tp_size) {
  ModelConfig c = config;
  c.num_attention_heads /= tp_size;
  c.num_key_value_heads /= tp_size;
  c.intermediate_size /= tp_size;
  c.moe.moe_intermediate_size /= tp_size;
  c.moe.shared_expert_intermediate_size /= tp_size;
  return c;
}

int tensor_parallel_dim(const std::string& name) {
  // LoRA adapters (the rollout's adapters-only sync, issue 30.3): W + s B A keeps W's split
  // when a column-parallel layer splits B's rows (B [out, r]) and a row-parallel layer A's
  // columns (A [r, in]); the other factor is whole on every rank.
  // A Mixtral expert's w1 / w3 are its gate / up maps (column-parallel), w2 its down map.
  const bool mixtral_row = contains(name, ".experts.") && contains(name, ".w2.");
  const bool mixtral_column =
      contains(name, ".experts.") && (contains(name, ".w1.") || contains(name, ".w3."));
  if (contains(name, ".lora_B.") || contains(name, ".lora_A.")) {
    const bool row = contains(name, "o_proj.") || contains(name, "down_proj.") || mixtral_row;
    if (contains(name, ".lora_A.")) return row ? 1 : -1;
    return row ? -1 : 0;
  }
  if (contains(name, "o_proj.weight") || contains(name, "down_proj.weight") ||
      (mixtral_row && contains(name, ".weight")))
    return 1;
  if (contains(name, "q_proj.") || contains(name, "k_proj.") || contains(name, "v_proj.") ||
      contains(name, "gate_proj.") || contains(name, "up_proj.") || mixtral_column)
    return 0;
  if (ends_with(name, "embed_tokens.weight") || name == "lm_head.weight") return 0;
  return -1;  // norms, row-parallel biases (added once after the all-reduce)
}

std::vector<int64_t> tensor_parallel_shape(const std::string& name,
                                           const std::vector<int64_t>& full_shape, int tp_size) {
  std::vector<int64_t> shape = full_shape;
  const int dim = tensor_parallel_dim(name);
  if (dim >= 0 && tp_size > 1) {
    TORCH_CHECK(dim < static_cast<int>(shape.size()) && shape[dim] % tp_size == 0,
                "tensor_parallel_shape: ", name, " cannot be split ", tp_size, " ways");
    shape[dim] /= tp_size;
  }
  return shape;
}

torch::Tensor tensor_parallel_slice(const std::string& name, const torch::Tensor& full, int rank,
                                    int tp_size) {
  const int dim = tensor_parallel_dim(name);
  if (dim < 0 || tp_size == 1) return full;
  TORCH_CHECK(full.size(dim) % tp_size == 0, "tensor_parallel_slice: ", name, " dim ", dim, " of ",
              full.sizes(), " cannot be split ", tp_size, " ways");
  const int64_t n = full.size(dim) / tp_size;
  return full.narrow(dim, rank * n, n);
}

void tensor_parallel_all_reduce(const TensorParallel& tp, torch::Tensor& partial) {
  if (!tp.enabled()) return;
  tp.group->all_reduce(partial, transport::ReduceOp::kSum);
}

torch::Tensor tensor_parallel_gather_vocab(const TensorParallel& tp, const torch::Tensor& local) {
  if (!tp.enabled()) return local;
  auto piece = local.contiguous();
  auto gathered = torch::empty({tp.size * piece.numel()}, piece.options());
  tp.group->all_gather(gathered, piece.view({-1}));
  // [tp, ..., V / tp] -> [..., tp, V / tp] -> [..., V]: rank r's columns are vocabulary
  // rows [r * V / tp, (r + 1) * V / tp).
  std::vector<int64_t> shape{tp.size};
  for (int64_t d : piece.sizes()) shape.push_back(d);
  auto out = gathered.view(shape).movedim(0, -2);
  std::vector<int64_t> full(piece.sizes().begin(), piece.sizes().end());
  full.back() *= tp.size;
  return out.reshape(full);
}

torch::Tensor tensor_parallel_embedding(const TensorParallel& tp, const torch::Tensor& weight,
                                        const torch::Tensor& ids) {
  const int64_t rows = weight.size(0), first = tp.rank * rows;
  auto local = ids - first;
  auto here = local.ge(0).logical_and(local.lt(rows));
  auto h = at::embedding(weight, local.clamp(0, rows - 1));  // [..., H]
  h.masked_fill_(here.logical_not().unsqueeze(-1), 0);
  tensor_parallel_all_reduce(tp, h);
  return h;
}

}  // namespace rlhf::models
