// Log-probs and entropy through the LM head in token chunks (models/log_probs.h, issue 28):
// values and gradients equal the whole-logits reference (FP32 and BF16, chunk sizes that do
// not divide the token count, tied embeddings, checkpointed layers, a temperature), and no
// vocabulary-wide tensor larger than one chunk is allocated.
#include "models/log_probs.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include <algorithm>
#include <limits>
#include <mutex>
#include <unordered_map>

#include "models/causal_lm.h"
#include "test_util.h"

namespace rlhf::models {
namespace {

using testing::relative_error;

struct Case {
  torch::Tensor hidden;  // [B, T, H], requires grad
  torch::Tensor weight;  // [V, H], requires grad
  torch::Tensor labels;  // [B, T]
  torch::Tensor g_lp;    // [B, T] upstream gradient of the log-probs
  torch::Tensor g_ent;   // [B, T] upstream gradient of the entropy
};

// B = 3 rows of T = 7 (21 tokens), H = 16, V = 1000; logits of a few units so the
// distributions are neither flat nor one-hot.
Case make_case(torch::Dtype dtype, uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  Case c;
  c.hidden = torch::randn({3, 7, 16}, gen).to(dtype).requires_grad_();
  c.weight = (torch::randn({1000, 16}, gen) * 0.5).to(dtype).requires_grad_();
  c.labels = torch::randint(0, 1000, {3, 7}, gen, torch::kInt64);
  c.g_lp = torch::randn({3, 7}, gen);
  c.g_ent = torch::randn({3, 7}, gen);
  return c;
}

struct Outputs {
  torch::Tensor log_probs, entropy, grad_hidden, grad_weight;
};

// Values, and the gradients of sum(g_lp * log_probs + g_ent * entropy).
template <typename F>
Outputs run(const Case& c, F head) {
  HeadLogProbs r = head(c.hidden, c.weight, c.labels);
  auto loss = (r.log_probs * c.g_lp).sum() + (r.entropy * c.g_ent).sum();
  auto grads = torch::autograd::grad({loss}, {c.hidden, c.weight});
  return {r.log_probs.detach(), r.entropy.detach(), grads[0], grads[1]};
}

Outputs reference(const Case& c) {
  return run(c, [](const auto& h, const auto& w, const auto& y) {
    return full_logits_log_probs(h, w, y, Entropy::kCompute);
  });
}

Outputs chunked(const Case& c, int64_t chunk) {
  return run(c, [chunk](const auto& h, const auto& w, const auto& y) {
    return head_log_probs(h, w, y, chunk, Entropy::kCompute);
  });
}

TEST(HeadLogProbs, EqualsWholeLogitsInFp32ForEveryChunkSize) {
  torch::set_num_threads(1);
  const Case c = make_case(torch::kFloat32, 1);
  const Outputs ref = reference(c);
  // 5 and 8 do not divide 21 tokens (chunks of 5, 4, 4, 4, 4 and 7, 7, 7 span rows of 7); 21
  // and 64 are one chunk. (Chunks of 1-3 tokens meet BLAS's few-row kernels, which sum over
  // V less accurately: 2e-6 of scale against the FP64 truth here, the whole path 3e-7.)
  for (int64_t chunk : {5, 8, 21, 64}) {
    const Outputs out = chunked(c, chunk);

    // The same FP32 formula in another order (max-shifted sums per chunk, the head's
    // gradient summed over chunks): rounding only, 1e-6 of each tensor's scale.
    EXPECT_LT(relative_error(out.log_probs, ref.log_probs), 1e-6) << chunk;
    EXPECT_LT(relative_error(out.entropy, ref.entropy), 1e-6) << chunk;
    EXPECT_LT(relative_error(out.grad_hidden, ref.grad_hidden), 1e-6) << chunk;
    EXPECT_LT(relative_error(out.grad_weight, ref.grad_weight), 1e-6) << chunk;
  }
}

TEST(HeadLogProbs, EqualsWholeLogitsInBf16) {
  torch::set_num_threads(1);
  const Case c = make_case(torch::kBFloat16, 2);
  const Outputs ref = reference(c);
  for (int64_t chunk : {5, 8}) {
    const Outputs out = chunked(c, chunk);
    // Both take the same BF16 logits to FP32 and reduce them in FP32: 1e-5 of scale.
    EXPECT_LT(relative_error(out.log_probs, ref.log_probs), 1e-5) << chunk;
    EXPECT_LT(relative_error(out.entropy, ref.entropy), 1e-5) << chunk;
    // The BF16 gradient matmuls see the same BF16 d logits; the head's gradient is a sum of
    // per-chunk BF16 products (each rounded, 2^-9 relative) instead of one: 1e-2 of scale.
    EXPECT_LT(relative_error(out.grad_hidden, ref.grad_hidden), 1e-2) << chunk;
    EXPECT_LT(relative_error(out.grad_weight, ref.grad_weight), 1e-2) << chunk;
    EXPECT_EQ(out.grad_hidden.scalar_type(), torch::kBFloat16);
    EXPECT_EQ(out.grad_weight.scalar_type(), torch::kBFloat16);
  }
}

TEST(HeadLogProbs, OnlyTheUsedOutputsCarryGradient) {
  torch::set_num_threads(1);
  const Case c = make_case(torch::kFloat32, 3);
  // Log-probs alone (no entropy asked): the reference's entropy term is dropped.
  auto ref = full_logits_log_probs(c.hidden, c.weight, c.labels);
  auto ref_grads = torch::autograd::grad({(ref.log_probs * c.g_lp).sum()}, {c.hidden, c.weight});
  auto out = head_log_probs(c.hidden, c.weight, c.labels, 4);
  EXPECT_FALSE(out.entropy.defined());
  auto grads = torch::autograd::grad({(out.log_probs * c.g_lp).sum()}, {c.hidden, c.weight});
  EXPECT_LT(relative_error(grads[0], ref_grads[0]), 1e-6);
  EXPECT_LT(relative_error(grads[1], ref_grads[1]), 1e-6);
  // Entropy alone (an entropy bonus): the log-probs' gradient is absent, not zero-filled.
  auto ref_e = full_logits_log_probs(c.hidden, c.weight, c.labels, Entropy::kCompute);
  auto ref_e_grads = torch::autograd::grad({(ref_e.entropy * c.g_ent).sum()}, {c.hidden, c.weight});
  auto out_e = head_log_probs(c.hidden, c.weight, c.labels, 4, Entropy::kCompute);
  auto e_grads = torch::autograd::grad({(out_e.entropy * c.g_ent).sum()}, {c.hidden, c.weight});
  EXPECT_LT(relative_error(e_grads[0], ref_e_grads[0]), 1e-6);
  EXPECT_LT(relative_error(e_grads[1], ref_e_grads[1]), 1e-6);
}

TEST(HeadLogProbs, SeveralLabelsPerPositionEqualWholeLogits) {
  // GKD's student side: K = 5 tokens' log-probs at each position ([B, T, K] labels) with the
  // entropy, values and gradients against the whole-logits gather, for chunks that do and do
  // not divide the 21 tokens, and for chunk 0 (which takes the token-chunked path).
  torch::set_num_threads(1);
  const Case c = make_case(torch::kFloat32, 4);
  auto gen = at::detail::createCPUGenerator(40);
  const auto labels = torch::randint(0, 1000, {3, 7, 5}, gen, torch::kInt64);
  const auto g = torch::randn({3, 7, 5}, gen);
  const auto loss_grads = [&](const HeadLogProbs& r) {
    auto loss = (r.log_probs * g).sum() + (r.entropy * c.g_ent).sum();
    return torch::autograd::grad({loss}, {c.hidden, c.weight});
  };
  const auto ref = full_logits_log_probs(c.hidden, c.weight, labels, Entropy::kCompute);
  const auto ref_grads = loss_grads(ref);
  for (int64_t chunk : {0, 5, 8, 64}) {
    const auto out = head_log_probs(c.hidden, c.weight, labels, chunk, Entropy::kCompute);
    ASSERT_EQ(out.log_probs.sizes(), labels.sizes());
    const auto grads = loss_grads(out);
    // Rounding only (the same FP32 formula in another order): 1e-6 of each tensor's scale.
    EXPECT_LT(relative_error(out.log_probs.detach(), ref.log_probs.detach()), 1e-6) << chunk;
    EXPECT_LT(relative_error(grads[0], ref_grads[0]), 1e-6) << chunk;
    EXPECT_LT(relative_error(grads[1], ref_grads[1]), 1e-6) << chunk;
  }
}

TEST(HeadLogProbs, TopKIsTheWholeSoftmaxsLargestEntries) {
  // The teacher's side of GKD: the k most likely tokens per position and their log-probs of
  // the whole vocabulary's softmax, chunk by chunk; k = V is the whole distribution sorted.
  torch::set_num_threads(1);
  const Case c = make_case(torch::kFloat32, 5);
  torch::NoGradGuard no_grad;
  const auto logp = torch::log_softmax(torch::matmul(c.hidden, c.weight.t()), -1);
  for (int64_t k : {1, 64, 1000, 5000}) {
    const auto top = head_top_k(c.hidden, c.weight, k, 8);
    const int64_t kk = std::min<int64_t>(k, 1000);
    ASSERT_EQ(top.ids.sizes(), (std::vector<int64_t>{3, 7, kk}));
    auto [values, ids] = logp.topk(kk, -1);
    EXPECT_LT((top.log_probs - values).abs().max().item<double>(), 1e-5) << k;
    // The ids hold the values they claim (ties aside, the same ids).
    EXPECT_LT((logp.gather(-1, top.ids) - top.log_probs).abs().max().item<double>(), 1e-5) << k;
    EXPECT_TRUE(torch::equal(top.ids.select(2, 0), ids.select(2, 0))) << k;
    // The rest: the others' mass, summed from their own terms (-inf when there are none).
    const auto others = logp.scatter(-1, top.ids, -std::numeric_limits<float>::infinity());
    if (kk < 1000)
      EXPECT_LT((top.rest - others.logsumexp(-1)).abs().max().item<double>(), 1e-5) << k;
    else
      EXPECT_TRUE(torch::isinf(top.rest).all().item<bool>()) << k;
  }
  const auto all = head_top_k(c.hidden, c.weight, 1000, 8);
  EXPECT_NEAR(all.log_probs.exp().sum(-1).min().item<double>(), 1.0, 1e-5);
}

TEST(HeadLogProbs, ChunkZeroIsThePathBeforeChunkingByTokens) {
  torch::set_num_threads(1);
  const Case c = make_case(torch::kFloat32, 4);
  auto ref = full_logits_log_probs(c.hidden, c.weight, c.labels, Entropy::kCompute);
  auto out = head_log_probs(c.hidden, c.weight, c.labels, 0, Entropy::kCompute);
  EXPECT_LT(relative_error(out.log_probs, ref.log_probs), 1e-6);
  EXPECT_LT(relative_error(out.entropy, ref.entropy), 1e-6);
  EXPECT_TRUE(torch::equal(out.log_probs, chunked_log_probs(c.hidden, c.weight, c.labels)));
}

TEST(HeadLogProbs, RefusesBadInputs) {
  const Case c = make_case(torch::kFloat32, 5);
  auto bad = c.labels.clone();
  bad[1][3] = 1000;  // == V
  EXPECT_THROW(head_log_probs(c.hidden, c.weight, bad, 4), c10::Error);
  EXPECT_THROW(head_log_probs(c.hidden, c.weight, c.labels, -1), c10::Error);
  EXPECT_THROW(head_log_probs(c.hidden, c.weight.to(torch::kBFloat16), c.labels, 4), c10::Error);
  EXPECT_THROW(head_log_probs(c.hidden, c.weight, c.labels.narrow(1, 0, 6), 4), c10::Error);
}

// A model with tied embeddings, checkpointed layers and a sampling temperature: every
// parameter's gradient (the embedding's gathers both the lookup's and the head's) equals
// the whole-logits path's through the same model.
TEST(HeadLogProbs, TiedCheckpointedModelGradientsEqualWholeLogits) {
  torch::set_num_threads(1);
  ModelConfig config = preset_config("tiny");
  config.torch_dtype = "float32";
  config.tie_word_embeddings = true;
  CausalLM model(config);
  model.init_weights(7);
  model.set_checkpointing(Checkpointing::kPerLayer);
  auto gen = at::detail::createCPUGenerator(8);
  auto ids = torch::randint(0, config.vocab_size, {2, 11}, gen, torch::kInt64);
  const double temperature = 0.7;  // as the actor's log-probs: hidden / T (no head bias)
  auto grads_of = [&](bool whole) {
    model.zero_grad();
    auto hidden = model.forward(ids, torch::ones_like(ids)) / temperature;
    auto h = hidden.narrow(1, 0, 10), y = ids.narrow(1, 1, 10);
    torch::Tensor lp = whole ? full_logits_log_probs(h, model.head_weight(), y).log_probs
                             : model.log_probs(h, y, /*chunk=*/3);  // 20 tokens: 7 chunks
    (-lp.mean()).backward();
    std::vector<torch::Tensor> out = {lp.detach()};
    for (auto& p : model.parameters()) out.push_back(p.grad().clone());
    return out;
  };
  auto whole = grads_of(true), chunks = grads_of(false);
  ASSERT_EQ(whole.size(), chunks.size());
  for (size_t i = 0; i < whole.size(); ++i) {
    ASSERT_TRUE(chunks[i].defined());
    EXPECT_GT(whole[i].abs().max().item<double>(), 0.0) << i;
    EXPECT_LT(relative_error(chunks[i], whole[i]), 1e-6) << i;  // FP32 rounding only
  }
}

// Counts the bytes of live CPU tensors and their peak while installed (one at a time). Its
// blocks come from c10::alloc_cpu with the data pointer as context (raw_allocate works), and
// may be freed after it is removed.
class CountingAllocator final : public c10::Allocator {
 public:
  CountingAllocator() : previous_(c10::GetCPUAllocator()) {
    {
      std::lock_guard<std::mutex> lock(state().mutex);
      state().peak = start_ = state().live;
    }
    c10::SetCPUAllocator(this, kPriority);
  }
  ~CountingAllocator() override { c10::SetCPUAllocator(previous_, kPriority); }
  CountingAllocator(const CountingAllocator&) = delete;
  CountingAllocator& operator=(const CountingAllocator&) = delete;
  // Bytes above those live when it was installed: now, and at the peak since.
  int64_t live() const { return state().live - start_; }
  int64_t peak() const { return state().peak - start_; }

  c10::DataPtr allocate(size_t n) override {
    void* data = c10::alloc_cpu(n);
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    s.sizes[data] = static_cast<int64_t>(n);
    s.live += static_cast<int64_t>(n);
    s.peak = std::max(s.peak, s.live);
    return {data, data, &release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

 private:
  static constexpr uint8_t kPriority = 100;
  struct State {
    std::mutex mutex;
    std::unordered_map<void*, int64_t> sizes;
    int64_t live = 0, peak = 0;
  };
  static State& state() {
    static State* s = new State();  // never destroyed: blocks may outlive everything
    return *s;
  }
  static void release(void* data) {
    State& s = state();
    {
      std::lock_guard<std::mutex> lock(s.mutex);
      auto it = s.sizes.find(data);
      s.live -= it->second;
      s.sizes.erase(it);
    }
    c10::free_cpu(data);
  }
  c10::Allocator* previous_;
  int64_t start_ = 0;
};

// The peak bytes of the tensors made in a forward and backward through the head, for 600
// tokens of a 20,000-token vocabulary; chunk < 0: the whole logits.
int64_t head_peak_bytes(int64_t chunk, Entropy entropy) {
  auto gen = at::detail::createCPUGenerator(9);
  auto hidden = torch::randn({2, 300, 16}, gen).requires_grad_();
  auto weight = (torch::randn({20000, 16}, gen) * 0.3).requires_grad_();
  auto labels = torch::randint(0, 20000, {2, 300}, gen, torch::kInt64);
  CountingAllocator counting;
  {
    HeadLogProbs r = chunk < 0 ? full_logits_log_probs(hidden, weight, labels, entropy)
                               : head_log_probs(hidden, weight, labels, chunk, entropy);
    torch::Tensor loss = r.log_probs.sum();
    if (entropy == Entropy::kCompute) loss = loss + r.entropy.sum();
    loss.backward();
  }
  // Everything made under the counter is gone again except the two .grad tensors.
  EXPECT_EQ(counting.live(), (hidden.numel() + weight.numel()) * 4);
  return counting.peak();
}

TEST(HeadLogProbs, NoVocabularyWideTensorBeyondOneChunk) {
  torch::set_num_threads(1);
  const int64_t V = 20000, H = 16, tokens = 600, chunk = 64;
  const int64_t logits = tokens * V * 4, chunk_logits = chunk * V * 4;
  const int64_t small = 2 * V * H * 4 + 64 * tokens * 4;  // [V, H] gradients, per-token vectors
  for (Entropy entropy : {Entropy::kSkip, Entropy::kCompute}) {
    const int64_t whole = head_peak_bytes(-1, entropy);
    // The count sees the whole logits: log_softmax's FP32 output alone is tokens x V x 4 B.
    EXPECT_GT(whole, logits);
    // Chunked: one FP32 [chunk, V] buffer (two while the entropy's gradient is formed),
    // the head's gradient and its FP32 sum, per-token vectors.
    const int64_t buffers = entropy == Entropy::kCompute ? 2 : 1;
    const int64_t chunked = head_peak_bytes(chunk, entropy);
    EXPECT_GT(chunked, chunk_logits);  // it does hold one chunk's logits
    EXPECT_LT(chunked, buffers * chunk_logits + small) << "whole logits: " << whole;
  }
}

}  // namespace
}  // namespace rlhf::models
