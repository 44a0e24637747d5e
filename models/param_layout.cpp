#include "models/param_layout.h"

#include "models/layer_spec.h"

namespace rlhf::models {

namespace {

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
  linear("mlp.gate_proj", H, I, spec.mlp_bias);
  linear("mlp.up_proj", H, I, spec.mlp_bias);
  linear("mlp.down_proj", I, H, spec.mlp_bias);
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
