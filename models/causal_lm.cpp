// CausalLM: embeddings -> decoder layers (optionally checkpointed) -> final norm -> head.
// See causal_lm.h. The checkpointed layer is a custom autograd function: forward keeps the
// layer input only; backward re-gathers (hooks), recomputes and back-propagates the layer.
#include "models/causal_lm.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <torch/autograd.h>

#include <cmath>
#include <cstring>
#include <map>
#include <mutex>

#include "core/errors.h"
#include "core/text.h"
#include "models/expert_parallel.h"
#include "models/family.h"
#include "models/kv_cache.h"
#include "models/log_probs.h"
#include "models/moe.h"
#include "models/paged_kv_cache.h"
#include "transport/collective_group.h"

namespace rlhf::models {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The layer's linear maps by their names inside the layer ("self_attn.q_proj"), in HF order.
// A mixture-of-experts layer's are its experts' ("mlp.experts.3.gate_proj"), not the router.
std::vector<std::pair<std::string, Linear>> layer_linears(DecoderLayerImpl& layer) {
  auto& a = *layer.self_attn;
  std::vector<std::pair<std::string, Linear>> out = {{"self_attn.q_proj", a.q_proj},
                                                     {"self_attn.k_proj", a.k_proj},
                                                     {"self_attn.v_proj", a.v_proj},
                                                     {"self_attn.o_proj", a.o_proj}};
  if (layer.moe) {
    const std::string block = layer.spec().moe.mixtral_names ? "block_sparse_moe." : "mlp.";
    for (auto& [name, linear] : layer.moe->linears()) out.emplace_back(block + name, linear);
    return out;
  }
  auto& m = *layer.mlp;
  out.insert(
      out.end(),
      {{"mlp.gate_proj", m.gate_proj}, {"mlp.up_proj", m.up_proj}, {"mlp.down_proj", m.down_proj}});
  return out;
}

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// Module-tree parameters `params` (named_parameters() order, names with `prefix`) as HF
// tensors in HF order: a fused map ("...self_attn.qkv_proj.weight" and its ".bias", which
// LinearImpl registers right after the weight) becomes its parts' rows, views, each part's
// weight then bias ("q_proj.weight", "q_proj.bias", "k_proj.weight", ...); any other
// parameter stays itself. `shard` gives the parts' row counts (the TP shard's config: a
// rank's fused tensor stacks its own slices).
void append_hf_tensors(const std::string& prefix,
                       const torch::OrderedDict<std::string, torch::Tensor>& params,
                       const ModelConfig& shard, NamedTensors& out) {
  struct Fusion {
    const char* fused;
    std::vector<std::pair<const char*, int64_t>> parts;  // HF module, rows
  };
  const int64_t D = shard.head_dim, I = shard.intermediate_size;
  const Fusion fusions[] = {{"self_attn.qkv_proj.",
                             {{"self_attn.q_proj.", shard.num_attention_heads * D},
                              {"self_attn.k_proj.", shard.num_key_value_heads * D},
                              {"self_attn.v_proj.", shard.num_key_value_heads * D}}},
                            {"mlp.gate_up_proj.", {{"mlp.gate_proj.", I}, {"mlp.up_proj.", I}}}};
  const auto& items = params.items();
  for (size_t i = 0; i < items.size(); ++i) {
    const std::string name = prefix + items[i].key();
    const Fusion* fusion = nullptr;
    size_t at = std::string::npos;
    for (const auto& f : fusions)
      if (ends_with(name, std::string(f.fused) + "weight")) {
        fusion = &f;
        at = name.size() - std::strlen(f.fused) - 6;
      }
    if (!fusion) {
      out.emplace_back(name, items[i].value());
      continue;
    }
    const std::string head = name.substr(0, at);
    const torch::Tensor& weight = items[i].value();
    torch::Tensor bias;
    if (i + 1 < items.size() && prefix + items[i + 1].key() == head + fusion->fused + "bias")
      bias = items[++i].value();
    int64_t row = 0;
    for (const auto& [part, rows] : fusion->parts) {
      out.emplace_back(head + part + "weight", weight.narrow(0, row, rows));
      if (bias.defined()) out.emplace_back(head + part + "bias", bias.narrow(0, row, rows));
      row += rows;
    }
    TORCH_CHECK(row == weight.size(0), "CausalLM: fused ", name, " has ", weight.size(0),
                " rows, its parts ", row);
  }
}

bool has_lora_dropout(DecoderLayerImpl& layer) {
  for (auto& [name, linear] : layer_linears(layer))
    if (linear->lora && linear->lora->dropout > 0) return true;
  return false;
}

// The default generator of `device`, whose state a checkpointed layer with LoRA dropout
// saves in forward and replays in its recompute (torch.utils.checkpoint's preserve_rng_state).
at::Generator generator_of(const torch::Device& device) {
  return at::globalContext().defaultGenerator(device);
}

// One decoder layer, recomputed in backward (torch.utils.checkpoint's pattern). The base
// model has no dropout (config rejects attention_dropout > 0); LoRA dropout is replayed
// from the generator state saved in forward, so the recompute draws the same masks. Hooks:
// before_forward/after_forward around the recompute (ZeRO-3 re-gathers the layer there),
// after_backward once its parameter grads are in .grad.
class CheckpointedLayer : public torch::autograd::Function<CheckpointedLayer> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, DecoderLayerImpl* layer, LayerHooks* hooks,
                               int64_t index, const torch::Tensor& hidden, const torch::Tensor& cos,
                               const torch::Tensor& sin, const std::optional<torch::Tensor>& mask,
                               bool causal, const std::optional<VarlenSegments>& varlen) {
    // Raw pointers travel as integers: the layer and hooks outlive the autograd graph.
    ctx->saved_data["layer"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(layer));
    ctx->saved_data["hooks"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(hooks));
    ctx->saved_data["index"] = index;
    ctx->saved_data["causal"] = causal;
    ctx->save_for_backward({hidden, cos, sin, mask.value_or(torch::Tensor())});
    if (varlen) {  // index tensors, not differentiated
      ctx->saved_data["varlen_index"] = varlen->token_index;
      ctx->saved_data["varlen_cu"] = varlen->cu_seqlens;
      ctx->saved_data["varlen_max"] = varlen->max_len;
    }
    const AttentionInputs in{cos, sin, mask, causal, varlen};
    if (!has_lora_dropout(*layer))
      return layer->forward(hidden, in, nullptr, index);  // grad mode is off here
    auto gen = generator_of(hidden.device());
    {
      std::lock_guard<std::mutex> lock(gen.mutex());
      ctx->saved_data["rng"] = gen.get_state();
    }
    LoraDropoutScope dropout;  // grad mode is off, but this forward is a training one
    return layer->forward(hidden, in, nullptr, index);
  }

  // Runs `recompute` with the generator state saved in forward (if any), then puts the
  // generator back where it was.
  template <typename Fn>
  static void with_saved_rng(AutogradContext* ctx, const torch::Device& device, Fn recompute) {
    if (!ctx->saved_data.count("rng")) return recompute();
    auto gen = generator_of(device);
    torch::Tensor now;
    {
      std::lock_guard<std::mutex> lock(gen.mutex());
      now = gen.get_state();
      gen.set_state(ctx->saved_data["rng"].toTensor());
    }
    recompute();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(now);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto* layer = reinterpret_cast<DecoderLayerImpl*>(
        static_cast<intptr_t>(ctx->saved_data["layer"].toInt()));
    auto* hooks =
        reinterpret_cast<LayerHooks*>(static_cast<intptr_t>(ctx->saved_data["hooks"].toInt()));
    const int64_t index = ctx->saved_data["index"].toInt();
    const int unit = static_cast<int>(index) + 1;
    auto saved = ctx->get_saved_variables();
    auto x = saved[0].detach().requires_grad_(true);
    if (hooks) hooks->before_forward(unit);
    with_saved_rng(ctx, x.device(), [&] {
      torch::AutoGradMode enable(true);
      const auto mask = saved[3].defined() ? std::optional<torch::Tensor>(saved[3]) : std::nullopt;
      AttentionInputs in{saved[1], saved[2], mask, ctx->saved_data["causal"].toBool(), {}};
      if (ctx->saved_data.count("varlen_index")) {
        in.varlen = VarlenSegments{ctx->saved_data["varlen_index"].toTensor(),
                                   ctx->saved_data["varlen_cu"].toTensor(),
                                   ctx->saved_data["varlen_max"].toInt()};
      }
      auto out = layer->forward(x, in, nullptr, index);
      torch::autograd::backward({out}, {grads[0]});  // accumulates the layer's .grad
    });
    if (hooks) {
      hooks->after_forward(unit);
      hooks->after_backward(unit);
    }
    return {torch::Tensor(), torch::Tensor(), torch::Tensor(), x.grad(),       torch::Tensor(),
            torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

CausalLM::CausalLM(ModelConfig config, Materialize how, TensorParallel tp, ExpertParallel ep)
    : config_(std::move(config)), tp_(std::move(tp)), ep_(std::move(ep)) {
  config_.validate("CausalLM");
  if (ep_.enabled()) {
    check_expert_parallel(config_, ep_.size, "CausalLM");
    if (!ep_.group || ep_.group->size() != ep_.size || ep_.group->rank() != ep_.rank)
      throw InputError("CausalLM: expert parallel rank " + std::to_string(ep_.rank) + " of " +
                       std::to_string(ep_.size) + " needs a group of that size and rank");
    if (how != Materialize::kDeferred || tp_.enabled())
      throw InputError("CausalLM: an expert-parallel model is built deferred, without TP");
  }
  if (tp_.enabled()) {
    check_tensor_parallel(config_, tp_.size, "CausalLM");
    if (!tp_.group || tp_.group->size() != tp_.size || tp_.group->rank() != tp_.rank)
      throw InputError("CausalLM: tensor parallel rank " + std::to_string(tp_.rank) + " of " +
                       std::to_string(tp_.size) + " needs a group of that size and rank");
    if (how != Materialize::kDeferred)
      throw InputError("CausalLM: a tensor-parallel shard is built deferred and loaded");
  }
  shard_config_ = tensor_parallel_shard_config(config_, tp_.size);
  const ModelConfig& c = config_;
  const ModelFamily& family = model_family(c.model_type, "CausalLM");
  has_local_ = has_local_layers(c);
  shortest_window_ = shortest_window(c);
  if (family.scale_embeddings) embed_scale_ = std::sqrt(static_cast<double>(c.hidden_size));
  const int64_t vocab = c.vocab_size / tp_.size;  // this rank's rows (vocab-parallel)
  auto stack = register_module("model", std::make_shared<torch::nn::Module>());
  // As HF: the padding row of the embedding gets no gradient.
  const int64_t padding_idx =
      !tp_.enabled() && c.pad_token_id >= 0 && c.pad_token_id < c.vocab_size ? c.pad_token_id : -1;
  embed_tokens =
      stack->register_module("embed_tokens", Embedding(vocab, c.hidden_size, padding_idx, how));
  layers = stack->register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    layers->push_back(
        std::make_shared<DecoderLayerImpl>(shard_config_, layer_spec(c, i), how, &tp_, &ep_));
  norm = stack->register_module(
      "norm",
      std::make_shared<RMSNormImpl>(c.hidden_size, c.rms_norm_eps, how, family.norm_unit_offset));
  if (c.head == HeadKind::kValue) {
    value_head = register_module(c.value_head_prefix, Linear(c.hidden_size, 1, false, how));
  } else if (!c.tie_word_embeddings) {
    lm_head = register_module("lm_head", Linear(c.hidden_size, vocab, false, how));
  }
  shapes_ = models::parameter_shapes(c);
  if (how == Materialize::kAllocate) init_weights(0);
}

torch::Dtype CausalLM::dtype() const {
  return embed_tokens->weight.scalar_type();
}
torch::Device CausalLM::device() const {
  return embed_tokens->weight.device();
}

void CausalLM::init_weights(uint64_t seed) {
  // A private generator: constructing a model never disturbs the global RNG stream. Values
  // are drawn in FP32 on the CPU, so a seed gives the same model on any device and dtype.
  TORCH_CHECK(!tp_.enabled(),
              "CausalLM::init_weights: a tensor-parallel shard is loaded (load_whole), not drawn");
  torch::NoGradGuard no_grad;
  auto gen = at::detail::createCPUGenerator(seed);
  const std::string value_name = config_.value_head_prefix + ".weight";
  // Gemma's norms scale by (1 + weight): HF starts their weights at 0, Llama's at 1.
  const double norm_init =
      model_family(config_.model_type, "CausalLM").norm_unit_offset ? 0.0 : 1.0;
  // In HF order by HF name, so a fused model draws the same values as an unfused one.
  for (auto& [name, t] : state_tensors()) {
    if (ends_with(name, "norm.weight")) {
      t.fill_(norm_init);
    } else if (ends_with(name, ".bias")) {
      t.zero_();
    } else if (config_.head == HeadKind::kValue && name == value_name) {
      t.copy_(value_head_init(config_));
    } else {
      t.copy_(
          torch::empty(t.sizes(), torch::kFloat32).normal_(0.0, config_.initializer_range, gen));
    }
  }
  if (config_.pad_token_id >= 0 && config_.pad_token_id < config_.vocab_size)
    embed_tokens->weight[config_.pad_token_id].zero_();  // HF: padding_idx row starts at zero
}

bool CausalLM::uses_varlen_attention(int64_t T) const {
  const auto dtype = embed_tokens->weight.scalar_type();
  return varlen_attention_ && embed_tokens->weight.is_cuda() &&
         (dtype == torch::kBFloat16 || dtype == torch::kHalf) && config_.head_dim % 8 == 0 &&
         config_.head_dim <= 256 && (shortest_window_ <= 0 || shortest_window_ >= T);
}

torch::Tensor CausalLM::run_layer(int64_t i, const torch::Tensor& hidden, const AttentionInputs& in,
                                  KvStore* cache) {
  auto* layer = layers->ptr(i)->as<DecoderLayerImpl>();
  if (checkpointing_ == Checkpointing::kPerLayer && torch::GradMode::is_enabled() &&
      cache == nullptr) {
    // A frozen embedding gives an input without grad; the layer's parameters still need theirs.
    torch::Tensor x = hidden.requires_grad() ? hidden : hidden.detach().requires_grad_(true);
    return CheckpointedLayer::apply(layer, hooks_, i, x, in.cos, in.sin, in.mask, in.causal,
                                    in.varlen);
  }
  return layer->forward(hidden, in, cache, i);
}

torch::Tensor CausalLM::forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                                const torch::Tensor& position_ids, KvCache* cache) {
  TORCH_CHECK(input_ids.dim() == 2 && input_ids.scalar_type() == torch::kInt64,
              "CausalLM::forward: input_ids must be int64 [B, T], got ", input_ids.scalar_type(),
              input_ids.sizes());
  const int64_t B = input_ids.size(0), T = input_ids.size(1);
  const int64_t past = cache ? cache->length() : 0;
  TORCH_CHECK(!cache || cache->batch() == B, "CausalLM::forward: cache batch ",
              cache ? cache->batch() : 0, " != input batch ", B);
  torch::Tensor mask =
      attention_mask.defined() ? attention_mask : torch::ones({B, past + T}, input_ids.options());
  TORCH_CHECK(mask.dim() == 2 && mask.size(0) == B && mask.size(1) == past + T,
              "CausalLM::forward: attention_mask must be [", B, ", ", past + T, "], got ",
              mask.sizes());
  torch::Tensor pos =
      position_ids.defined() ? position_ids : position_ids_from_mask(mask).narrow(1, past, T);
  TORCH_CHECK(pos.sizes() == input_ids.sizes(),
              "CausalLM::forward: position_ids must be [B, T] like input_ids, got ", pos.sizes());

  LayerInputs in;
  set_attention_mask(in.global, mask, past, T, config_.sliding_window,
                     /*known_plain=*/!attention_mask.defined());
  if (has_local_) {
    in.local.emplace();
    set_attention_mask(*in.local, mask, past, T, config_.local_window,
                       /*known_plain=*/!attention_mask.defined());
  }
  if (in.global.mask && !cache && uses_varlen_attention(T)) {
    auto segments = varlen_segments(mask, input_ids.device());
    if (segments.max_len > 0) {  // every window covers T: the local layers attend alike
      for (AttentionInputs* each : {&in.global, in.local ? &*in.local : nullptr}) {
        if (!each) continue;
        each->varlen = segments;
        each->mask = std::nullopt;
      }
    }
  }
  auto h = run_stack(input_ids, pos, in, cache);
  if (cache) cache->advance(T);
  return h;
}

torch::Tensor CausalLM::forward(const torch::Tensor& input_ids, PagedKvCache& cache) {
  TORCH_CHECK(input_ids.dim() == 2 && input_ids.scalar_type() == torch::kInt64,
              "CausalLM::forward: input_ids must be int64 [B, T], got ", input_ids.scalar_type(),
              input_ids.sizes());
  TORCH_CHECK(cache.positions().sizes() == input_ids.sizes(),
              "CausalLM::forward: the paged cache planned ", cache.positions().sizes(),
              " positions, got input_ids ", input_ids.sizes());
  LayerInputs in;
  cache.attention(in.global, config_.sliding_window);
  if (has_local_) {
    in.local.emplace();
    cache.attention(*in.local, config_.local_window);
  }
  auto h = run_stack(input_ids, cache.positions(), in, &cache);
  cache.finish_step();
  return h;
}

torch::Tensor CausalLM::run_stack(const torch::Tensor& input_ids, const torch::Tensor& pos,
                                  LayerInputs& in, KvStore* cache) {
  before(0);
  torch::Tensor h = tp_.enabled() ? tensor_parallel_embedding(tp_, embed_tokens->weight, input_ids)
                                  : embed_tokens->forward(input_ids);  // [B, T, H]
  // Gemma3TextScaledWordEmbedding: times sqrt(H) rounded to the weights' dtype.
  if (embed_scale_ > 0) h = h * torch::scalar_tensor(embed_scale_, h.options());
  after(0);
  if (!inv_freq_.defined() || inv_freq_.device() != pos.device()) {
    inv_freq_ = inverse_frequencies(config_).to(pos.device());
    if (has_local_) inv_freq_local_ = inverse_frequencies(config_, /*local=*/true).to(pos.device());
  }
  rotary_tables(inv_freq_, pos, h.scalar_type(), in.global.cos, in.global.sin);
  if (in.local) rotary_tables(inv_freq_local_, pos, h.scalar_type(), in.local->cos, in.local->sin);
  for (int64_t i = 0; i < num_layers(); ++i) {
    before(static_cast<int>(i) + 1);
    h = run_layer(i, h, in.of(layers->ptr(i)->as<DecoderLayerImpl>()->spec()), cache);
    after(static_cast<int>(i) + 1);
  }
  const int head_unit = static_cast<int>(num_layers()) + 1;
  before(head_unit);
  h = norm->forward(h);
  after(head_unit);
  return h;
}

torch::Tensor CausalLM::head_weight() {
  if (config_.head == HeadKind::kValue) return value_head->weight;
  return config_.tie_word_embeddings ? embed_tokens->weight : lm_head->weight;
}

void CausalLM::set_logits_chunk_tokens(int64_t tokens) {
  TORCH_CHECK(tokens >= 0, "CausalLM: logits_chunk_tokens must be >= 0, got ", tokens);
  logits_chunk_tokens_ = tokens;
}

HeadLogProbs CausalLM::head_log_probs(const torch::Tensor& hidden, const torch::Tensor& labels,
                                      Entropy entropy, int64_t chunk) {
  TORCH_CHECK(config_.head == HeadKind::kLanguageModel,
              "CausalLM::log_probs needs an LM head; this model has a value head");
  TORCH_CHECK(!tp_.enabled(), "CausalLM::log_probs: not available on a tensor-parallel shard");
  const int head_unit = static_cast<int>(num_layers()) + 1;
  before(head_unit);
  auto out = models::head_log_probs(hidden, head_weight(), labels,
                                    chunk == kModelChunk ? logits_chunk_tokens_ : chunk, entropy);
  after(head_unit);
  return out;
}

torch::Tensor CausalLM::log_probs(const torch::Tensor& hidden, const torch::Tensor& labels,
                                  int64_t chunk) {
  return head_log_probs(hidden, labels, Entropy::kSkip, chunk).log_probs;
}

torch::Tensor CausalLM::next_token_log_probs(const torch::Tensor& hidden,
                                             const torch::Tensor& input_ids, int64_t chunk) {
  TORCH_CHECK(hidden.dim() == 3 && input_ids.dim() == 2 && hidden.size(1) == input_ids.size(1) &&
                  hidden.size(1) >= 1,
              "next_token_log_probs: hidden [B, T, H] and input_ids [B, T] must agree, got ",
              hidden.sizes(), " and ", input_ids.sizes());
  const int64_t T = hidden.size(1);
  return log_probs(hidden.narrow(1, 0, T - 1), input_ids.narrow(1, 1, T - 1), chunk);
}

HeadTopK CausalLM::head_top_k(const torch::Tensor& hidden, int64_t k) {
  TORCH_CHECK(config_.head == HeadKind::kLanguageModel,
              "CausalLM::head_top_k needs an LM head; this model has a value head");
  TORCH_CHECK(!tp_.enabled(), "CausalLM::head_top_k: not available on a tensor-parallel shard");
  const int head_unit = static_cast<int>(num_layers()) + 1;
  before(head_unit);
  auto out = models::head_top_k(hidden, head_weight(), k, logits_chunk_tokens_);
  after(head_unit);
  return out;
}

torch::Tensor CausalLM::logits(const torch::Tensor& hidden) {
  TORCH_CHECK(config_.head == HeadKind::kLanguageModel,
              "CausalLM::logits needs an LM head; this model has a value head");
  const int head_unit = static_cast<int>(num_layers()) + 1;
  before(head_unit);
  auto out = tensor_parallel_gather_vocab(tp_, torch::matmul(hidden, head_weight().t()));
  after(head_unit);
  return out;
}

torch::Tensor CausalLM::values(const torch::Tensor& hidden) {
  TORCH_CHECK(config_.head == HeadKind::kValue,
              "CausalLM::values needs a value head; this model has an LM head");
  TORCH_CHECK(!tp_.enabled(), "CausalLM::values: not available on a tensor-parallel shard");
  const int head_unit = static_cast<int>(num_layers()) + 1;
  before(head_unit);
  auto out = value_head->forward(hidden).squeeze(-1).to(torch::kFloat32);  // [B, T]
  after(head_unit);
  return out;
}

std::vector<std::pair<std::string, Linear>> CausalLM::decoder_linears() {
  std::vector<std::pair<std::string, Linear>> out;
  for (int64_t i = 0; i < num_layers(); ++i) {
    const std::string prefix = "model.layers." + std::to_string(i) + ".";
    for (auto& [name, linear] : layer_linears(*layers->ptr(i)->as<DecoderLayerImpl>()))
      out.emplace_back(prefix + name, linear);
  }
  return out;
}

bool CausalLM::has_adapters() {
  for (auto& [name, linear] : decoder_linears())
    if (linear->lora) return true;
  return false;
}

void CausalLM::set_adapters_enabled(bool enabled) {
  for (auto& [name, linear] : decoder_linears()) {
    if (!linear->lora) continue;
    TORCH_CHECK(enabled || !linear->lora->merged, "CausalLM: adapter of ", name,
                " is merged into the base weight and cannot be disabled");
    linear->lora->enabled = enabled;
  }
}

std::vector<std::pair<std::string, torch::Tensor>> CausalLM::state_tensors() {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  append_hf_tensors("", named_parameters(), shard_config_, out);
  return out;
}

torch::Tensor CausalLM::hf_tensor(const std::string& name) {
  for (auto& [hf_name, t] : state_tensors())
    if (hf_name == name) return t;
  throw InputError("CausalLM: no parameter named " + name);
}

void CausalLM::fuse_projections() {
  for (int64_t i = 0; i < num_layers(); ++i) {
    auto* layer = layers->ptr(i)->as<DecoderLayerImpl>();
    layer->self_attn->fuse();
    if (layer->mlp) layer->mlp->fuse();
    // An MoE layer's experts stay apart (an expert's gate and up are views of the stacks a
    // GPU runs as grouped GEMMs).
    if (layer->moe) layer->moe->use_grouped_gemm();
  }
  fused_ = true;
}

std::vector<ParamUnit> CausalLM::param_units() {
  std::map<std::string, std::vector<int64_t>> shape_of(shapes_.begin(), shapes_.end());
  std::vector<ParamUnit> units;
  units.push_back({"embed", {{"model.embed_tokens.weight", embed_tokens->weight}}, {}});
  for (int64_t i = 0; i < num_layers(); ++i) {
    ParamUnit unit{"layers." + std::to_string(i), {}, {}};
    const std::string prefix = "model.layers." + std::to_string(i) + ".";
    append_hf_tensors(prefix, layers->ptr(i)->named_parameters(), shard_config_, unit.params);
    const auto& moe = layers->ptr(i)->as<DecoderLayerImpl>()->moe;
    if (ep_.enabled() && moe) {  // this rank's experts (the block names them globally)
      unit.expert_first = moe->first_expert();
      unit.expert_count = moe->local_experts();
    }
    for (auto& [name, linear] : layer_linears(*layers->ptr(i)->as<DecoderLayerImpl>())) {
      if (!linear->lora) continue;
      unit.params.emplace_back(prefix + name + ".lora_A.weight", linear->lora->A);
      unit.params.emplace_back(prefix + name + ".lora_B.weight", linear->lora->B);
      shape_of[prefix + name + ".lora_A.weight"] = linear->lora->a_shape;
      shape_of[prefix + name + ".lora_B.weight"] = linear->lora->b_shape;
    }
    units.push_back(std::move(unit));
  }
  ParamUnit head{"head", {{"model.norm.weight", norm->weight}}, {}};
  if (config_.head == HeadKind::kValue)
    head.params.emplace_back(config_.value_head_prefix + ".weight", value_head->weight);
  else if (!config_.tie_word_embeddings)
    head.params.emplace_back("lm_head.weight", lm_head->weight);
  units.push_back(std::move(head));
  for (auto& unit : units)
    for (const auto& [name, param] : unit.params) unit.shapes.push_back(shape_of.at(name));
  return units;
}

torch::Tensor value_head_init(const ModelConfig& config) {
  auto gen = at::detail::createCPUGenerator(0);
  return torch::empty({1, config.hidden_size}, torch::kFloat32)
      .normal_(0.0, 1.0 / (config.hidden_size + 1), gen);
}

torch::Tensor position_ids_from_mask(const torch::Tensor& attention_mask) {
  auto segment = attention_mask.to(torch::kInt64);
  auto present = segment != 0;
  auto pos = present.to(torch::kInt64).cumsum(-1) - 1;  // [B, T] over all tokens of the row
  // Where a packed segment follows another one directly, remember the running count there;
  // subtracting the latest such start restarts positions at 0. Plain 0/1 masks (padding
  // anywhere) have no such start and keep OpenRLHF's cumsum - 1.
  auto previous = torch::cat(
      {torch::zeros_like(segment.narrow(-1, 0, 1)), segment.narrow(-1, 0, segment.size(-1) - 1)},
      -1);
  auto starts = present.logical_and(previous != 0).logical_and(segment != previous);
  auto start_pos = std::get<0>(torch::where(starts, pos, torch::zeros_like(pos)).cummax(-1));
  return (pos - start_pos).masked_fill_(present.logical_not(), 1);
}

torch::Tensor last_token_values(const torch::Tensor& values, const torch::Tensor& attention_mask) {
  TORCH_CHECK(values.dim() == 2 && values.sizes() == attention_mask.sizes(),
              "last_token_values: values and attention_mask must both be [B, T], got ",
              values.sizes(), " and ", attention_mask.sizes());
  const int64_t T = attention_mask.size(1);
  auto last =
      T - 1 -
      (attention_mask != 0).to(torch::kInt64).fliplr().argmax(1, /*keepdim=*/true);  // [B, 1]
  return values.gather(1, last).squeeze(1);
}

}  // namespace rlhf::models
