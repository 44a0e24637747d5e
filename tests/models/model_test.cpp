// CausalLM behaviour the trainer and rollout rely on: checkpointed gradients equal plain
// ones, hooks fire in the documented order, KV-cache decoding equals a full forward,
// padding does not change valid positions, chunked log-probs are exact.
#include <torch/cuda.h>

#include "models/causal_lm.h"
#include "models/decoder_layer.h"
#include "models/kv_cache.h"
#include "models/log_probs.h"
#include "models/paged_kv_cache.h"
#include "test_util.h"

namespace rlhf::models {
namespace {

using testing::relative_error;

ModelConfig tiny_config() {
  ModelConfig c = preset_config("tiny");
  c.torch_dtype = "float32";
  return c;
}

std::shared_ptr<CausalLM> tiny_model(HeadKind head = HeadKind::kLanguageModel) {
  ModelConfig c = tiny_config();
  c.head = head;
  auto m = std::make_shared<CausalLM>(c);
  m->init_weights(3);
  return m;
}

torch::Tensor random_ids(int64_t B, int64_t T, int64_t V, uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  return torch::randint(0, V, {B, T}, gen, torch::kInt64);
}

// Next-token loss over the batch and every parameter's gradient afterwards.
std::vector<torch::Tensor> grads_of_loss(CausalLM& model, const torch::Tensor& ids,
                                         const torch::Tensor& mask) {
  model.zero_grad();
  auto hidden = model.forward(ids, mask);
  auto lp = model.next_token_log_probs(hidden, ids, 4);
  (-lp.sum()).backward();
  std::vector<torch::Tensor> grads;
  for (auto& p : model.parameters()) grads.push_back(p.grad().clone());
  return grads;
}

TEST(CausalLM, CheckpointedGradientsEqualPlainOnes) {
  torch::set_num_threads(1);
  for (auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    auto model = tiny_model();
    model->to(dtype);
    auto ids = random_ids(2, 9, 288, 1);
    auto mask = torch::ones_like(ids);
    mask[0][0] = 0;  // left padding in one row
    auto plain = grads_of_loss(*model, ids, mask);
    model->set_checkpointing(Checkpointing::kPerLayer);
    auto ckpt = grads_of_loss(*model, ids, mask);
    ASSERT_EQ(plain.size(), ckpt.size());
    for (size_t i = 0; i < plain.size(); ++i) {
      // The recompute runs the same kernels on the same inputs, so the gradients are equal;
      // 1e-6 of scale (FP32) allows only a different summation order in accumulation.
      EXPECT_LT(relative_error(ckpt[i], plain[i]), dtype == torch::kFloat32 ? 1e-6 : 1e-2) << i;
    }
  }
}

// Records hook calls as "f+3" (before_forward), "f-3" (after_forward), "b3" (after_backward),
// and at each after_backward whether that unit's and the previous layer's grads exist.
class RecordingHooks : public LayerHooks {
 public:
  explicit RecordingHooks(CausalLM& m) : model(m) {}
  void before_forward(int unit) override { events.push_back("f+" + std::to_string(unit)); }
  void after_forward(int unit) override { events.push_back("f-" + std::to_string(unit)); }
  void after_backward(int unit) override {
    events.push_back("b" + std::to_string(unit));
    auto units = model.param_units();
    for (const auto& [name, p] : units[unit].params) grads_ready &= p.grad().defined();
    if (unit > 1)
      for (const auto& [name, p] : units[unit - 1].params)
        earlier_layer_untouched &= !p.grad().defined();
  }
  CausalLM& model;
  std::vector<std::string> events;
  bool grads_ready = true, earlier_layer_untouched = true;
};

TEST(CausalLM, HooksWrapEveryUnitAndTheRecompute) {
  torch::set_num_threads(1);
  auto model = tiny_model();
  RecordingHooks hooks(*model);
  model->set_layer_hooks(&hooks);
  model->set_checkpointing(Checkpointing::kPerLayer);
  auto ids = random_ids(1, 6, 288, 2);
  auto hidden = model->forward(ids, torch::ones_like(ids));
  auto lp = model->next_token_log_probs(hidden, ids);
  const std::vector<std::string> forward = {"f+0", "f-0", "f+1", "f-1", "f+2",
                                            "f-2", "f+3", "f-3", "f+3", "f-3"};
  EXPECT_EQ(hooks.events, forward);
  hooks.events.clear();
  lp.sum().backward();
  // Layers back-propagate last to first; each recompute is wrapped, then its grads reported.
  const std::vector<std::string> backward = {"f+2", "f-2", "b2", "f+1", "f-1", "b1"};
  EXPECT_EQ(hooks.events, backward);
  EXPECT_TRUE(hooks.grads_ready) << "after_backward(unit) came before the unit's .grad was filled";
  EXPECT_TRUE(hooks.earlier_layer_untouched)
      << "layer 1's grads existed before layer 2's after_backward";
  model->set_layer_hooks(nullptr);
}

TEST(CausalLM, ParamUnitsCoverEveryParameterOnceWithHfNames) {
  auto model = tiny_model();
  auto units = model->param_units();
  ASSERT_EQ(units.size(), 4u);  // embed, 2 layers, head
  EXPECT_EQ(units[0].params[0].first, "model.embed_tokens.weight");
  EXPECT_EQ(units[1].params[0].first.rfind("model.layers.0.", 0), 0u);
  EXPECT_EQ(units[3].params.back().first, "lm_head.weight");
  std::map<std::string, torch::Tensor> by_name;
  for (auto& u : units)
    for (auto& [n, p] : u.params) EXPECT_TRUE(by_name.emplace(n, p).second) << n << " listed twice";
  auto named = model->named_parameters();
  EXPECT_EQ(by_name.size(), named.size());
  for (const auto& p : named) {
    ASSERT_TRUE(by_name.count(p.key())) << p.key();
    EXPECT_TRUE(by_name[p.key()].is_same(p.value()))
        << p.key() << ": the unit must hold the parameter itself";
  }
  auto critic = tiny_model(HeadKind::kValue)->param_units();
  EXPECT_EQ(critic.back().params.back().first, "score.weight");
}

TEST(CausalLM, KvCacheDecodeEqualsFullForward) {
  torch::set_num_threads(1);
  torch::NoGradGuard no_grad;
  auto model = tiny_model();
  const int64_t B = 2, T = 10, prompt = 4;
  auto ids = random_ids(B, T, 288, 3);
  auto mask = torch::ones_like(ids);
  mask[1].narrow(0, 0, 2).zero_();  // row 1: left-padded prompt, as rollout batches are
  auto full = model->forward(ids, mask);
  KvCache cache(model->config(), B, T, torch::kFloat32);
  std::vector<torch::Tensor> steps = {
      model->forward(ids.narrow(1, 0, prompt), mask.narrow(1, 0, prompt), {}, &cache)};
  for (int64_t t = prompt; t < T; ++t)
    steps.push_back(model->forward(ids.narrow(1, t, 1), mask.narrow(1, 0, t + 1), {}, &cache));
  EXPECT_EQ(cache.length(), T);
  auto decoded = torch::cat(steps, 1);
  auto valid = mask.to(torch::kBool);
  // Same math on the same numbers, split differently over matmuls: FP32 rounding only.
  EXPECT_LT(relative_error(decoded.index({valid}), full.index({valid})), 1e-5);
  EXPECT_EQ(cache.keys(0, 0, T).sizes(), (std::vector<int64_t>{B, 2, T, 16}));
  EXPECT_THROW(
      model->forward(ids.narrow(1, 0, 1), torch::ones({B, T + 1}, torch::kInt64), {}, &cache),
      c10::Error);
}

// The paged cache against whole forwards: two prompts of different lengths (left-padded
// in one prefill), blocks of 3 positions so every sequence spans several blocks, then a
// fork of prompt 0 (sharing its blocks, the last one partly filled) and a decode of 5 steps
// in which the three sequences feed different tokens. Every step's hidden state equals the
// whole forward of that sequence's tokens (FP32 rounding: 1e-5), so copy-on-write kept the
// fork and its parent apart. Block accounting by hand: 10 blocks; prompts of 4 and 7 tokens
// hold 2 + 3; the fork adds none until it writes into the shared partial block (a copy),
// and a reserve the pool cannot meet fails and changes nothing. With a sliding window of 4
// the decode matches the windowed whole forward too.
TEST(PagedKvCache, PrefillForkAndDecodeEqualWholeForwards) {
  torch::set_num_threads(1);
  torch::NoGradGuard no_grad;
  for (int64_t window : {0, 4}) {
    auto config = tiny_config();
    config.sliding_window = window;
    auto model = std::make_shared<CausalLM>(config);
    model->eval();
    const auto a = random_ids(1, 4, 288, 11), b = random_ids(1, 7, 288, 12);
    std::vector<std::vector<int64_t>> seqs_tokens = {
        {a.data_ptr<int64_t>(), a.data_ptr<int64_t>() + 4},
        {b.data_ptr<int64_t>(), b.data_ptr<int64_t>() + 7}};
    PagedKvCache cache(model->config(), 10, 3, torch::kFloat32);
    const int64_t s0 = cache.create(), s1 = cache.create();
    ASSERT_TRUE(cache.reserve(s0, 4));
    ASSERT_TRUE(cache.reserve(s1, 7));
    EXPECT_EQ(cache.free_blocks(), 10 - 2 - 3);
    auto ids = torch::zeros({2, 7}, torch::kInt64), mask = torch::zeros({2, 7}, torch::kInt64);
    ids[0].narrow(0, 3, 4).copy_(a[0]);
    mask[0].narrow(0, 3, 4).fill_(1);
    ids[1].copy_(b[0]);
    mask[1].fill_(1);
    cache.plan_prefill({s0, s1}, mask);
    auto prefill = model->forward(ids, cache);
    EXPECT_EQ(cache.length(s0), 4);
    EXPECT_EQ(cache.length(s1), 7);
    auto whole_b = model->forward(b, torch::ones_like(b));
    EXPECT_LT(relative_error(prefill[1], whole_b[0]), 1e-5) << "window " << window;

    const int64_t s2 = cache.fork(s0);
    EXPECT_EQ(cache.free_blocks(), 5);
    EXPECT_EQ(cache.blocks_needed(s2, 1), 1);  // a copy of the shared partial block
    EXPECT_EQ(cache.blocks_needed(s2, 3), 2);  // the copy and a fresh block
    seqs_tokens.push_back(seqs_tokens[0]);
    const std::vector<int64_t> seqs = {s0, s1, s2};
    for (int64_t step = 0; step < 5; ++step) {
      std::vector<int64_t> next;
      for (int64_t i = 0; i < 3; ++i) {
        ASSERT_TRUE(cache.reserve(seqs[i], 1));
        next.push_back(1 + (7 * step + 31 * i) % 280);
        seqs_tokens[i].push_back(next.back());
      }
      cache.plan_decode(seqs);
      auto hidden = model->forward(torch::tensor(next, torch::kInt64).view({3, 1}), cache);
      for (int64_t i = 0; i < 3; ++i) {
        const auto L = static_cast<int64_t>(seqs_tokens[i].size());
        EXPECT_EQ(cache.length(seqs[i]), L);
        auto whole_ids = torch::tensor(seqs_tokens[i], torch::kInt64).view({1, L});
        auto whole = model->forward(whole_ids, torch::ones_like(whole_ids));
        EXPECT_LT(relative_error(hidden[i][0], whole[0][L - 1]), 1e-5)
            << "window " << window << " step " << step << " sequence " << i;
      }
    }
    // Lengths 9, 12, 9 in blocks of 3: 3 + 4 + 3 held, the prompt's full first block still
    // shared by the parent and the fork: 9 of 10 taken.
    EXPECT_EQ(cache.free_blocks(), 1);
    EXPECT_TRUE(cache.reserve(s0, 3));
    EXPECT_EQ(cache.free_blocks(), 0);
    EXPECT_FALSE(cache.reserve(s2, 1));
    EXPECT_EQ(cache.length(s2), 9);
    EXPECT_EQ(cache.free_blocks(), 0);
    cache.release(s1);
    EXPECT_EQ(cache.free_blocks(), 4);
    EXPECT_TRUE(cache.reserve(s2, 1));
    EXPECT_THROW(cache.length(s1), c10::Error);
  }
}

// Multi-turn rollouts (issue 31) append an environment's turn to a sequence that holds a
// prefix: plan_extend prefills only the new tokens over the held blocks. Every new token's
// hidden state equals a whole forward of the full sequence (FP32, 1e-5 relative: only the
// summation order differs), for two sequences extended by 5 and 2 tokens in one forward
// (right padding), one of them a fork sharing a partial block (copy-on-write), without a
// sliding window, with one for every layer (window 4) and with Gemma 3's two kinds of layer
// (window 4 in layer 0 only: each layer its own mask, applied on top of the planned one);
// truncate drops positions and returns their blocks.
TEST(PagedKvCache, ExtendOverHeldPositionsEqualsWholeForwards) {
  torch::set_num_threads(1);
  torch::NoGradGuard no_grad;
  for (int64_t window : {0, 4, -4}) {  // -4: a Gemma 3 model whose local layer has window 4
    auto config = tiny_config();
    config.sliding_window = std::max<int64_t>(window, 0);
    if (window < 0) {
      config.model_type = "gemma3_text";
      config.qk_norm = true;
      config.layer_types = {"sliding_attention", "full_attention"};
      config.local_window = -window;
    }
    auto model = std::make_shared<CausalLM>(config);
    model->eval();
    const auto a = random_ids(1, 7, 288, 21);
    std::vector<int64_t> prefix(a.data_ptr<int64_t>(), a.data_ptr<int64_t>() + 7);
    PagedKvCache cache(model->config(), 12, 3, torch::kFloat32);
    const int64_t s0 = cache.create();
    ASSERT_TRUE(cache.reserve(s0, 7));
    cache.plan_prefill({s0}, torch::ones({1, 7}, torch::kInt64));
    model->forward(a, cache);
    const int64_t s1 = cache.fork(s0);
    // Truncate s0 to 5 positions: its third block (positions 6, 7) goes back... only when no
    // fork holds it; the fork does, so the pool keeps it.
    const int64_t before = cache.free_blocks();
    cache.truncate(s0, 5);
    EXPECT_EQ(cache.length(s0), 5);
    EXPECT_EQ(cache.free_blocks(), before);
    EXPECT_THROW(cache.truncate(s0, 6), c10::Error);
    const std::vector<std::vector<int64_t>> added = {{11, 12, 13, 14, 15}, {21, 22}};
    std::vector<std::vector<int64_t>> whole = {{prefix.begin(), prefix.begin() + 5}, prefix};
    auto ids = torch::zeros({2, 5}, torch::kInt64), mask = torch::zeros({2, 5}, torch::kInt64);
    const std::vector<int64_t> seqs = {s0, s1};
    for (int64_t i = 0; i < 2; ++i) {
      const auto k = static_cast<int64_t>(added[i].size());
      ASSERT_TRUE(cache.reserve(seqs[i], k));
      ids[i].narrow(0, 0, k).copy_(torch::tensor(added[i], torch::kInt64));
      mask[i].narrow(0, 0, k).fill_(1);
      whole[i].insert(whole[i].end(), added[i].begin(), added[i].end());
    }
    cache.plan_extend(seqs, mask);
    const auto hidden = model->forward(ids, cache);  // [2, 5, H]
    for (int64_t i = 0; i < 2; ++i) {
      const auto L = static_cast<int64_t>(whole[i].size());
      const auto k = static_cast<int64_t>(added[i].size());
      EXPECT_EQ(cache.length(seqs[i]), L);
      const auto whole_ids = torch::tensor(whole[i], torch::kInt64).view({1, L});
      const auto expected = model->forward(whole_ids, torch::ones_like(whole_ids));
      EXPECT_LT(relative_error(hidden[i].narrow(0, 0, k), expected[0].narrow(0, L - k, k)), 1e-5)
          << "window " << window << " sequence " << i;
    }
    // A decode step after the extension still sees the whole sequence.
    ASSERT_TRUE(cache.reserve(s0, 1));
    cache.plan_decode({s0});
    const auto step = model->forward(torch::tensor({{31}}, torch::kInt64), cache);
    whole[0].push_back(31);
    const auto L = static_cast<int64_t>(whole[0].size());
    const auto whole_ids = torch::tensor(whole[0], torch::kInt64).view({1, L});
    EXPECT_LT(relative_error(step[0][0],
                             model->forward(whole_ids, torch::ones_like(whole_ids))[0][L - 1]),
              1e-5);
    // Released, then truncated to nothing: every block comes back.
    cache.release(s1);
    cache.truncate(s0, 0);
    EXPECT_EQ(cache.free_blocks(), 12);
  }
}

// Qwen3's per-head q/k RMSNorms on every path that computes attention: the KV-cached and
// the paged decode equal whole forwards, checkpointed gradients equal plain ones, and the
// norms' weights (random here, not HF's initial ones) get gradients. head_dim 8 is not
// hidden_size / heads (16). Same tolerances as the Llama tests above (FP32 rounding).
TEST(CausalLM, Qwen3QkNormsActOnEveryAttentionPath) {
  torch::set_num_threads(1);
  ModelConfig config = tiny_config();
  config.model_type = "qwen3";
  config.architectures = {"Qwen3ForCausalLM"};
  config.qk_norm = config.qkv_bias = config.o_proj_bias = true;
  config.head_dim = 8;
  auto model = std::make_shared<CausalLM>(config);
  model->init_weights(5);
  {
    torch::NoGradGuard no_grad;
    auto gen = at::detail::createCPUGenerator(6);
    for (auto& [name, param] : model->state_tensors())
      if (name.find("_norm.") != std::string::npos || name.find(".bias") != std::string::npos)
        param.copy_(torch::empty(param.sizes()).uniform_(0.5, 1.5, gen));
  }
  int64_t qk_norms = 0;
  for (const auto& [name, shape] : model->parameter_shapes()) {
    if (name.find("self_attn.q_norm.weight") != std::string::npos ||
        name.find("self_attn.k_norm.weight") != std::string::npos) {
      EXPECT_EQ(shape, (std::vector<int64_t>{8})) << name;
      ++qk_norms;
    }
  }
  EXPECT_EQ(qk_norms, 4);

  const int64_t B = 2, T = 10, prompt = 4;
  auto ids = random_ids(B, T, 288, 7);
  auto mask = torch::ones_like(ids);
  mask[1].narrow(0, 0, 2).zero_();
  {
    torch::NoGradGuard no_grad;
    auto full = model->forward(ids, mask);
    KvCache cache(model->config(), B, T, torch::kFloat32);
    std::vector<torch::Tensor> steps = {
        model->forward(ids.narrow(1, 0, prompt), mask.narrow(1, 0, prompt), {}, &cache)};
    for (int64_t t = prompt; t < T; ++t)
      steps.push_back(model->forward(ids.narrow(1, t, 1), mask.narrow(1, 0, t + 1), {}, &cache));
    auto valid = mask.to(torch::kBool);
    EXPECT_LT(relative_error(torch::cat(steps, 1).index({valid}), full.index({valid})), 1e-5);

    PagedKvCache paged(model->config(), 8, 3, torch::kFloat32);
    const int64_t seq = paged.create();
    ASSERT_TRUE(paged.reserve(seq, prompt));
    paged.plan_prefill({seq}, torch::ones({1, prompt}, torch::kInt64));
    std::vector<torch::Tensor> paged_steps = {
        model->forward(ids[0].narrow(0, 0, prompt).view({1, prompt}), paged)};
    for (int64_t t = prompt; t < T; ++t) {
      ASSERT_TRUE(paged.reserve(seq, 1));
      paged.plan_decode({seq});
      paged_steps.push_back(model->forward(ids[0].narrow(0, t, 1).view({1, 1}), paged));
    }
    auto whole = model->forward(ids.narrow(0, 0, 1), torch::ones({1, T}, torch::kInt64));
    EXPECT_LT(relative_error(torch::cat(paged_steps, 1), whole), 1e-5);
  }

  auto plain = grads_of_loss(*model, ids, mask);
  model->set_checkpointing(Checkpointing::kPerLayer);
  auto ckpt = grads_of_loss(*model, ids, mask);
  model->set_checkpointing(Checkpointing::kNone);
  ASSERT_EQ(plain.size(), ckpt.size());
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_LT(relative_error(ckpt[i], plain[i]), 1e-6) << i;
  for (auto& [name, param] : model->state_tensors()) {
    if (name.find("q_norm") != std::string::npos || name.find("k_norm") != std::string::npos) {
      EXPECT_GT(param.grad().abs().max().item<double>(), 0.0) << name;
    }
  }
}

TEST(CausalLM, PaddingLeavesValidPositionsUnchanged) {
  torch::set_num_threads(1);
  torch::NoGradGuard no_grad;
  auto model = tiny_model();
  auto ids = random_ids(1, 6, 288, 4);
  auto alone = model->forward(ids, torch::ones_like(ids));
  auto pad = torch::full({1, 3}, 256, torch::kInt64);
  auto zeros = torch::zeros({1, 3}, torch::kInt64), ones = torch::ones({1, 6}, torch::kInt64);
  auto left =
      model->forward(torch::cat({pad, ids}, 1), torch::cat({zeros, ones}, 1)).narrow(1, 3, 6);
  auto right =
      model->forward(torch::cat({ids, pad}, 1), torch::cat({ones, zeros}, 1)).narrow(1, 0, 6);
  // Padding only adds masked keys (exp(-huge) = 0 exactly): FP32 rounding of reordered sums.
  EXPECT_LT(relative_error(left, alone), 1e-5);
  EXPECT_LT(relative_error(right, alone), 1e-5);
}

TEST(ChunkedLogProbs, EqualsFullLogSoftmaxInValueAndGradient) {
  torch::set_num_threads(1);
  torch::manual_seed(5);
  auto hidden = torch::randn({2, 7, 16}, torch::requires_grad());
  auto weight = torch::randn({50, 16}, torch::requires_grad());
  auto labels = torch::randint(0, 50, {2, 7}, torch::kInt64);
  auto g = torch::randn({2, 7});
  auto ref = torch::log_softmax(torch::matmul(hidden, weight.t()), -1)
                 .gather(-1, labels.unsqueeze(-1))
                 .squeeze(-1);
  auto ref_grads = torch::autograd::grad({ref}, {hidden, weight}, {g});
  for (int64_t chunk : {1, 3, 7, 100}) {
    auto lp = chunked_log_probs(hidden, weight, labels, chunk);
    auto grads = torch::autograd::grad({lp}, {hidden, weight}, {g});
    // Exact formula, FP32: rounding only.
    EXPECT_LT(relative_error(lp, ref), 1e-6) << chunk;
    EXPECT_LT(relative_error(grads[0], ref_grads[0]), 1e-5) << chunk;
    EXPECT_LT(relative_error(grads[1], ref_grads[1]), 1e-5) << chunk;
  }
  auto bad = labels.clone();
  bad[1][3] = 50;  // == V
  EXPECT_THROW(chunked_log_probs(hidden, weight, bad, 4), c10::Error);
}

TEST(CausalLM, RewardIsTheValueAtTheLastRealToken) {
  auto values =
      torch::tensor({{1.f, 2.f, 3.f, 4.f}, {5.f, 6.f, 7.f, 8.f}, {9.f, 10.f, 11.f, 12.f}});
  auto mask = torch::tensor({{1, 1, 0, 0}, {0, 1, 1, 1}, {0, 0, 1, 0}},
                            torch::kInt64);  // right, left, both
  EXPECT_TRUE(torch::equal(last_token_values(values, mask), torch::tensor({2.f, 8.f, 11.f})));
  EXPECT_TRUE(
      torch::equal(position_ids_from_mask(mask),
                   torch::tensor({{0, 1, 1, 1}, {1, 0, 1, 2}, {1, 1, 0, 1}}, torch::kInt64)));
}

TEST(CausalLM, FrozenEmbeddingsStillGiveCheckpointedLayersTheirGradients) {
  auto model = tiny_model();
  model->embed_tokens->weight.set_requires_grad(false);
  model->set_checkpointing(Checkpointing::kPerLayer);
  auto ids = random_ids(1, 5, 288, 8);
  auto hidden = model->forward(ids, torch::ones_like(ids));
  model->next_token_log_probs(hidden, ids).sum().backward();
  for (auto& p : model->param_units()[1].params) EXPECT_TRUE(p.second.grad().defined()) << p.first;
  EXPECT_FALSE(model->embed_tokens->weight.grad().defined());
}

// Packed rows (attention_mask numbering segments 1, 2, ...): every segment gets the hidden
// states it gets alone, so SFT packing trains exactly as separate rows do.
TEST(CausalLM, PackedSegmentsEqualSeparateRows) {
  torch::set_num_threads(1);
  torch::NoGradGuard no_grad;
  auto model = tiny_model();
  auto a = random_ids(1, 5, 288, 5), b = random_ids(1, 4, 288, 6);
  auto alone_a = model->forward(a, torch::ones_like(a));
  auto alone_b = model->forward(b, torch::ones_like(b));
  auto mask =
      torch::cat({torch::full({1, 5}, 1, torch::kInt64), torch::full({1, 4}, 2, torch::kInt64),
                  torch::zeros({1, 2}, torch::kInt64)},
                 1);
  auto ids = torch::cat({a, b, torch::full({1, 2}, 256, torch::kInt64)}, 1);
  EXPECT_TRUE(torch::equal(position_ids_from_mask(mask),
                           torch::tensor({{0, 1, 2, 3, 4, 0, 1, 2, 3, 1, 1}}, torch::kInt64)));
  auto packed = model->forward(ids, mask);
  // Masked keys add exp(-huge) = 0 exactly: FP32 rounding of reordered sums only.
  EXPECT_LT(relative_error(packed.narrow(1, 0, 5), alone_a), 1e-5);
  EXPECT_LT(relative_error(packed.narrow(1, 5, 4), alone_b), 1e-5);
  // A plain 0/1 mask with a hole keeps OpenRLHF's cumsum - 1 (no restart).
  EXPECT_TRUE(torch::equal(position_ids_from_mask(torch::tensor({{0, 1, 1, 0, 1}}, torch::kInt64)),
                           torch::tensor({{1, 0, 1, 1, 2}}, torch::kInt64)));
}

// The real tokens as flash attention's variable-length sequences: padding dropped, packed
// segments apart, a row's positions with one id together even across a hole (as the dense
// mask reads them), segments in the order they start.
TEST(AttentionMask, VarlenSegmentsFollowTheDenseMasksSegments) {
  auto mask = torch::tensor({{0, 0, 1, 1, 1}, {1, 1, 2, 2, 0}, {1, 0, 1, 2, 2}}, torch::kInt64);
  auto seg = varlen_segments(mask, torch::kCPU);
  auto as_vector = [](const torch::Tensor& t) {
    auto c = t.to(torch::kLong).contiguous();
    return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
  };
  EXPECT_EQ(as_vector(seg.token_index),
            (std::vector<int64_t>{2, 3, 4, 5, 6, 7, 8, 10, 12, 13, 14}));
  EXPECT_EQ(as_vector(seg.cu_seqlens), (std::vector<int64_t>{0, 3, 5, 7, 9, 11}));
  EXPECT_EQ(seg.max_len, 3);
}

// On a GPU in BF16: a padded and packed batch through flash attention's varlen kernel equals
// the dense-mask SDPA path, forward (hidden states at real tokens) and backward (every
// parameter's gradient), within BF16's rounding (relative error 2e-2), with per-layer
// checkpointing so the recompute takes the same path.
TEST(CausalLM, VarlenAttentionEqualsTheMaskedPath_CUDA) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  ModelConfig c = preset_config("tiny");
  c.hidden_size = 256;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 64;
  auto model = std::make_shared<CausalLM>(c);
  model->init_weights(5);
  model->to(torch::Device(torch::kCUDA, 0));
  model->to(torch::kBFloat16);
  model->set_checkpointing(Checkpointing::kPerLayer);
  auto ids = random_ids(2, 12, c.vocab_size, 9).to(torch::kCUDA);
  auto mask =
      torch::tensor({{1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 0, 0}, {0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1}},
                    torch::kInt64)
          .to(torch::kCUDA);
  // The loss over real tokens only: padding positions' outputs differ by design (zeros there,
  // garbage in the masked path).
  const auto real = (mask.narrow(1, 0, 11) != 0).logical_and(mask.narrow(1, 1, 11) != 0);
  auto run = [&](bool varlen) {
    model->set_varlen_attention(varlen);
    model->zero_grad();
    auto lp = model->next_token_log_probs(model->forward(ids, mask), ids, 4);
    (-(lp.to(torch::kFloat) * real).sum()).backward();
    std::vector<torch::Tensor> grads;
    for (auto& p : model->parameters()) grads.push_back(p.grad().clone());
    torch::NoGradGuard no_grad;
    grads.push_back(model->forward(ids, mask).masked_select((mask != 0).unsqueeze(-1)));
    return grads;
  };
  auto dense = run(false), varlen = run(true);
  ASSERT_EQ(dense.size(), varlen.size());
  for (size_t i = 0; i < dense.size(); ++i)
    EXPECT_LT(relative_error(varlen[i].to(torch::kFloat), dense[i].to(torch::kFloat)), 2e-2) << i;
}

TEST(AttentionMask, CausalPaddingWindowAndCacheOffsetsAsATable) {
  // attention_mask [1, 4] with the first key padded; queries are positions 2 and 3 (2 cached).
  auto mask =
      attention_mask_tensor(torch::tensor({{0, 1, 1, 1}}, torch::kInt64), /*past=*/2, /*T=*/2,
                            /*sliding_window=*/2);
  auto allowed = mask.to(torch::kInt64).squeeze();  // [T, S]
  // query 2 sees keys 1..2 (0 is padding), query 3 sees keys 2..3 (window of 2).
  EXPECT_TRUE(torch::equal(allowed, torch::tensor({{0, 1, 1, 0}, {0, 0, 1, 1}}, torch::kInt64)));
  auto padded_query = attention_mask_tensor(torch::tensor({{0, 1}}, torch::kInt64), 0, 2, 0);
  // A padding query sees only itself: never an empty softmax row.
  EXPECT_TRUE(torch::equal(padded_query.to(torch::kInt64).squeeze(),
                           torch::tensor({{1, 0}, {0, 1}}, torch::kInt64)));
}

// When SDPA gets no dense mask (so its fused kernels can run) and when it must get one.
TEST(AttentionMask, DenseMaskOnlyWhereAKeyMustBeHidden) {
  struct Case {
    const char* name;
    torch::Tensor attention_mask;  // [1, past + T]
    int64_t past, T, window;
    bool dense, causal;
  };
  const auto ones = [](int64_t n) { return torch::ones({1, n}, torch::kInt64); };
  const std::vector<Case> cases = {
      {"no padding, no cache", ones(5), 0, 5, 0, false, true},
      {"undefined mask", torch::Tensor(), 0, 5, 0, false, true},
      {"one token over a cache", ones(6), 5, 1, 0, false, false},
      {"left padding", torch::tensor({{0, 1, 1}}, torch::kInt64), 0, 3, 0, true, false},
      {"packed segments", torch::tensor({{1, 1, 2, 2}}, torch::kInt64), 0, 4, 0, true, false},
      {"chunk over a cache", ones(6), 3, 3, 0, true, false},
      {"window shorter than the keys", ones(5), 0, 5, 3, true, false},
      {"window longer than the keys", ones(5), 0, 5, 8, false, true},
  };
  for (const auto& c : cases) {
    AttentionInputs in;
    set_attention_mask(in, c.attention_mask, c.past, c.T, c.window);
    EXPECT_EQ(in.mask.has_value(), c.dense) << c.name;
    EXPECT_EQ(in.causal, c.causal) << c.name;
    if (c.dense) {
      EXPECT_EQ(in.mask->sizes(), (std::vector<int64_t>{1, 1, c.T, c.past + c.T}));
    }
  }
}

TEST(CausalLM, PaddingEmbeddingRowGetsNoGradientAsInHf) {
  auto model = tiny_model();  // the tiny preset's pad_token_id is 256
  auto ids = torch::tensor({{257, 256, 72, 256, 105}}, torch::kInt64);  // <pad> at real positions
  grads_of_loss(*model, ids, torch::ones_like(ids));
  auto g = model->embed_tokens->weight.grad();
  EXPECT_EQ(g[256].abs().sum().item<double>(), 0.0);
  EXPECT_GT(g[72].abs().sum().item<double>(), 0.0);
}

TEST(CausalLM, HeadsRefuseTheWrongCall) {
  auto critic = tiny_model(HeadKind::kValue);
  auto ids = random_ids(1, 4, 288, 6);
  auto hidden = critic->forward(ids, torch::ones_like(ids));
  EXPECT_EQ(critic->values(hidden).sizes(), (std::vector<int64_t>{1, 4}));
  EXPECT_THROW(critic->log_probs(hidden, ids), c10::Error);
  auto actor = tiny_model();
  EXPECT_THROW(actor->values(actor->forward(ids, torch::ones_like(ids))), c10::Error);
}

// Without autograd the MLP runs over chunks of kInferenceMlpChunkTokens tokens (scoring
// forwards of many long sequences); each token's output depends on that token alone, so the
// result equals the whole-batch MLP (FP32: within 1e-6 relative, BLAS blocking may differ)
// for a token count that is not a multiple of the chunk.
TEST(Mlp, ChunkedInferenceEqualsTheWholeBatch) {
  torch::manual_seed(3);
  ModelConfig c = tiny_config();
  auto mlp = std::make_shared<MlpImpl>(c, layer_spec(c, 0), Materialize::kAllocate);
  {
    torch::NoGradGuard init;
    for (auto& p : mlp->parameters()) p.normal_(0.0, 0.2);
  }
  const int64_t T = kInferenceMlpChunkTokens + 1237;
  const torch::Tensor x = torch::randn({2, T, c.hidden_size});
  const torch::Tensor whole = mlp->forward(x).detach();  // autograd on: one pass
  torch::NoGradGuard no_grad;
  const torch::Tensor chunked = mlp->forward(x);
  ASSERT_EQ(chunked.sizes(), whole.sizes());
  EXPECT_LT((chunked - whole).abs().max().item<double>(), 1e-6 * whole.abs().max().item<double>());
}

}  // namespace
}  // namespace rlhf::models
