#include "models/param_layout.h"

#include <functional>

#include "models/layer_spec.h"

namespace rlhf::models {

namespace {

using LinearFn = std::function<void(const std::string&, int64_t, int64_t, bool)>;

// A gated MLP of I rows under `prefix` (gate_proj / up_proj / down_proj; Mixtral's experts
// w1, w2, w3), in the order its module registers them (models/moe.cpp, decoder_layer.cpp).
void gated_mlp(const std::string& prefix, int64_t H, int64_t I, bool bias, bool mixtral_names,
               const LinearFn& linear) {
  if (mixtral_names) {
    linear(prefix + "w1", H, I, false);
    linear(prefix + "w2", I, H, false);
    linear(prefix + "w3", H, I, false);
    return;
  }
  linear(prefix + "gate_proj", H, I, bias);
  linear(prefix + "up_proj", H, I, bias);
  linear(prefix + "down_proj", I, H, bias);
}

// A mixture-of-experts block (models/moe.h): the router, each expert, the shared expert and
// its gate.
void moe_shapes(const ModelConfig& c, const MoeSpec& moe, const LinearFn& linear) {
  const int64_t H = c.hidden_size;
  const std::string block = moe.mixtral_names ? "block_sparse_moe." : "mlp.";
  linear(block + "gate", H, moe.experts, false);
  for (int64_t e = 0; e < moe.experts; ++e)
    gated_mlp(block + "experts." + std::to_string(e) + ".", H, moe.intermediate, false,
              moe.mixtral_names, linear);
  if (moe.shared_intermediate > 0) {
    gated_mlp(block + "shared_expert.", H, moe.shared_intermediate, false, false, linear);
    linear(block + "shared_expert_gate", H, 1, false);
  }
}

// One decoder layer's parameters, names relative to "model.layers.N.", for the layer its
// family builds (`spec`).
ShapeList layer_shapes(const ModelConfig& c, const LayerSpec& spec) {
  const int64_t H = c.hidden_size, I = c.intermediate_size, D = c.head_dim;
  const int64_t q = c.num_attention_heads * D, kv = c.num_key_value_heads * D;
  ShapeList out;
  auto linear = [&](const std::string& name, int64_t in, int64_t o, bool bias) {
    out.push_back({name + ".weight", {o, in}});
    if (bias) out.push_back({name + ".bias", {o}});
  };
  linear("self_attn.q_proj", H, q, spec.qkv_bias);
  linear("self_attn.k_proj", H, kv, spec.qkv_bias);
  linear("self_attn.v_proj", H, kv, spec.qkv_bias);
  linear("self_attn.o_proj", q, H, spec.o_proj_bias);
  if (spec.qk_norm) {
    out.push_back({"self_attn.q_norm.weight", {D}});
    out.push_back({"self_attn.k_norm.weight", {D}});
  }
  if (spec.moe.sparse())
    moe_shapes(c, spec.moe, linear);
  else
    gated_mlp("mlp.", H, I, spec.mlp_bias, false, linear);
  out.push_back({"input_layernorm.weight", {H}});
  out.push_back({"post_attention_layernorm.weight", {H}});
  if (spec.sandwich_norms) {
    out.push_back({"pre_feedforward_layernorm.weight", {H}});
    out.push_back({"post_feedforward_layernorm.weight", {H}});
  }
  return out;
}

}  // namespace

std::vector<ShapeList> parameter_units(const ModelConfig& c) {
  const int64_t H = c.hidden_size;
  std::vector<ShapeList> units;
  units.push_back({{"model.embed_tokens.weight", {c.vocab_size, H}}});
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string prefix = "model.layers." + std::to_string(i) + ".";
    ShapeList unit;
    for (const auto& [name, shape] : layer_shapes(c, layer_spec(c, i)))
      unit.push_back({prefix + name, shape});
    units.push_back(std::move(unit));
  }
  ShapeList head = {{"model.norm.weight", {H}}};
  if (c.head == HeadKind::kValue)
    head.push_back({c.value_head_prefix + ".weight", {1, H}});
  else if (!c.tie_word_embeddings)
    head.push_back({"lm_head.weight", {c.vocab_size, H}});
  units.push_back(std::move(head));
  return units;
}

ShapeList parameter_shapes(const ModelConfig& c) {
  ShapeList out;
  for (auto& unit : parameter_units(c))
    for (auto& entry : unit) out.push_back(std::move(entry));
  return out;
}

int64_t active_parameters(const ModelConfig& c) {
  int64_t idle = 0;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const MoeSpec moe = layer_spec(c, i).moe;
    if (moe.sparse()) idle += (moe.experts - moe.top_k) * 3 * c.hidden_size * moe.intermediate;
  }
  return numel_of(parameter_shapes(c)) - idle;
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t numel_of(const ShapeList& shapes) {
  int64_t n = 0;
  for (const auto& [name, shape] : shapes) n += numel_of(shape);
  return n;
}

}  // namespace rlhf::models
