// Routing mismatch between a rollout and a trainer on a mixture of experts (issue 43.4: the
// case routing replay is for). The rollout generates as the rollout engine's model runs (fused
// q/k/v and gate/up, a KV cache, a prefill then one token per decode step) and records each
// token's selected experts; the trainer recomputes the same sequences in one full forward
// (unfused, as the actor's old log-probs and training forward run) and routes again. Prints,
// per sparse layer and over all of them, the share of tokens whose expert set differs (the
// prompt's prefill and the decoded tokens apart), and the log-prob mismatch of the sampled
// tokens (mean |rollout - trainer|), in FP32 and in BF16; then the trainer's forward again
// with routing replay (SparseMoeImpl::replay: the rollout's experts, the current router's
// weights). The limit: 0 differing tokens, what replay gives by construction.
// The model: --model DIR, or (the default) --random 64x8: a random Qwen3-MoE of 8 layers
// (hidden 256) with 64 experts of 64 rows, top-8 renormalised, Qwen3-30B-A3B's routing at a
// small size, written to a temporary directory first.
// Usage: bench_moe_routes [--model DIR | --random 64x8] [--batch 16] [--prompt 12] [--new 32]
//                         [--seed 0]
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "models/causal_lm.h"
#include "models/decoder_layer.h"
#include "models/kv_cache.h"
#include "models/moe.h"
#include "models/pretrained.h"

using namespace rlhf;

namespace {

// Collects the Routes of every sparse layer of one model, call after call.
struct Recorder {
  std::map<int64_t, std::vector<models::Routes>> layers;
  void attach(models::CausalLM& model) {
    for (int64_t i = 0; i < model.num_layers(); ++i) {
      auto* layer = model.layers->ptr(i)->as<models::DecoderLayerImpl>();
      if (layer->moe) layer->moe->record = &layers[i];
    }
  }
  // Layer `i`'s selected experts, sorted per token, [B, positions, k]: each call's [B t, k]
  // viewed as [B, t, k], the calls end to end.
  torch::Tensor experts(int64_t i, int64_t B) const {
    std::vector<torch::Tensor> parts;
    for (const auto& r : layers.at(i)) {
      const auto e = std::get<0>(r.experts.sort(-1));
      parts.push_back(e.view({B, -1, e.size(-1)}));
    }
    return torch::cat(parts, 1);
  }
};

struct Run {
  torch::Tensor tokens;     // [B, P + N]
  torch::Tensor log_probs;  // [B, N] the rollout's, of the sampled tokens
};

// Sampling at temperature 1 from `model` with a KV cache, recording its routes.
Run generate(models::CausalLM& model, const torch::Tensor& prompt, int64_t steps, uint64_t seed,
             torch::Dtype dtype) {
  const int64_t B = prompt.size(0), P = prompt.size(1);
  models::KvCache cache(model.config(), B, P + steps, dtype);
  auto gen = at::detail::createCPUGenerator(seed);
  torch::Tensor ids = prompt, all = prompt;
  std::vector<torch::Tensor> lps;
  for (int64_t t = 0; t < steps; ++t) {
    const int64_t past = cache.length();
    auto positions = torch::arange(past, past + ids.size(1), torch::kInt64).expand({B, -1});
    auto hidden =
        model.forward(ids, torch::ones({B, past + ids.size(1)}, torch::kInt64), positions, &cache);
    auto lp = torch::log_softmax(
        model.logits(hidden.narrow(1, hidden.size(1) - 1, 1)).squeeze(1).to(torch::kFloat32), -1);
    auto next = torch::multinomial(lp.exp(), 1, false, gen);  // [B, 1]
    lps.push_back(lp.gather(1, next));
    all = torch::cat({all, next}, 1);
    ids = next;
  }
  return {all, torch::cat(lps, 1)};
}

// The trainer's forward over `ids` (its routes recorded afresh into t_rec), compared with the
// rollout's routes and log-probs.
void trainer_side(models::CausalLM& trainer, const torch::Tensor& ids, const Run& run,
                  const Recorder& r_rec, Recorder& t_rec, int64_t B, int64_t P, int64_t N,
                  const char* how) {
  for (auto& [layer, calls] : t_rec.layers) calls.clear();
  auto hidden = trainer.forward(ids, torch::ones_like(ids));
  const auto trainer_lp = trainer.next_token_log_probs(hidden, ids).narrow(1, P - 1, N);
  const double lp_gap = (trainer_lp - run.log_probs).abs().mean().item<double>();
  std::printf(" trainer %s: log-prob |rollout - trainer| mean %.3g\n", how, lp_gap);
  torch::Tensor any_prompt, any_decode;
  for (const auto& [layer, calls] : r_rec.layers) {
    const auto a = r_rec.experts(layer, B);                          // [B, P + N - 1, k]
    const auto b = t_rec.experts(layer, B).narrow(1, 0, a.size(1));  // same positions
    const auto differs = (a != b).any(-1);                           // [B, P + N - 1]
    const auto prompt_part = differs.narrow(1, 0, P), decode_part = differs.narrow(1, P, N - 1);
    any_prompt = any_prompt.defined() ? any_prompt.logical_or(prompt_part) : prompt_part;
    any_decode = any_decode.defined() ? any_decode.logical_or(decode_part) : decode_part;
    std::printf("  layer %lld: routes differ on %.2f%% of prefill tokens, %.2f%% of decoded\n",
                static_cast<long long>(layer),
                100.0 * prompt_part.to(torch::kFloat64).mean().item<double>(),
                100.0 * decode_part.to(torch::kFloat64).mean().item<double>());
  }
  const int64_t prompt_differ = any_prompt.sum().item<int64_t>();
  const int64_t decode_differ = any_decode.sum().item<int64_t>();
  std::printf("  any layer: %lld of %lld prefill tokens, %lld of %lld decoded (%.2f%%)\n",
              static_cast<long long>(prompt_differ), static_cast<long long>(any_prompt.numel()),
              static_cast<long long>(decode_differ), static_cast<long long>(any_decode.numel()),
              100.0 * static_cast<double>(decode_differ) / static_cast<double>(any_decode.numel()));
}

void compare(const std::string& dir, torch::Dtype dtype, int64_t B, int64_t P, int64_t N,
             uint64_t seed) {
  torch::NoGradGuard no_grad;
  models::LoadOptions options;
  options.dtype = dtype;
  auto rollout = models::load_pretrained(dir, options);
  rollout->fuse_projections();
  auto trainer = models::load_pretrained(dir, options);
  Recorder r_rec, t_rec;
  r_rec.attach(*rollout);
  t_rec.attach(*trainer);
  torch::manual_seed(seed);
  const auto prompt = torch::randint(0, 256, {B, P}, torch::kInt64);
  const Run run = generate(*rollout, prompt, N, seed, dtype);
  const auto ids = run.tokens.narrow(1, 0, P + N);
  std::printf("%s, %lld sequences x (%lld prompt + %lld sampled tokens):\n",
              dtype == torch::kFloat32 ? "FP32" : "BF16", static_cast<long long>(B),
              static_cast<long long>(P), static_cast<long long>(N));
  trainer_side(*trainer, ids, run, r_rec, t_rec, B, P, N, "routing again");
  // Replay: the rollout's experts for positions 0 .. P + N - 2; the last position's (whose
  // output no log-prob reads, and which no earlier position attends to) repeats the one before.
  for (const auto& [layer, calls] : r_rec.layers) {
    auto e = r_rec.experts(layer, B);  // [B, P + N - 1, k]
    e = torch::cat({e, e.narrow(1, e.size(1) - 1, 1)}, 1);
    trainer->layers->ptr(layer)->as<models::DecoderLayerImpl>()->moe->replay =
        e.reshape({-1, e.size(-1)});
  }
  trainer_side(*trainer, ids, run, r_rec, t_rec, B, P, N, "replaying the rollout's routes");
}

// A random Qwen3-MoE of `experts` x top-k `top_k` (8 layers, hidden 256), saved under /tmp.
std::string random_moe(int64_t experts, int64_t top_k, uint64_t seed) {
  models::ModelConfig c = models::preset_config("tiny-moe");
  c.hidden_size = 256;
  c.intermediate_size = 512;
  c.num_hidden_layers = 8;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 4;
  c.head_dim = 32;
  c.moe.num_experts = experts;
  c.moe.num_experts_per_tok = top_k;
  c.moe.moe_intermediate_size = 64;
  c.torch_dtype = "float32";
  models::CausalLM model(c);
  model.init_weights(seed);
  const std::string dir = "/tmp/bench_moe_routes-" + std::to_string(experts) + "x" +
                          std::to_string(top_k) + "-" + std::to_string(seed);
  models::save_pretrained(model, dir);
  return dir;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir, random = "64x8";
  int64_t B = 16, P = 12, N = 32;
  uint64_t seed = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--model")
      dir = value;
    else if (flag == "--random")
      random = value;
    else if (flag == "--batch")
      B = std::stoll(value);
    else if (flag == "--prompt")
      P = std::stoll(value);
    else if (flag == "--new")
      N = std::stoll(value);
    else if (flag == "--seed")
      seed = std::stoull(value);
    else {
      std::fprintf(stderr, "bench_moe_routes: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  torch::set_num_threads(1);
  if (dir.empty()) {
    const auto x = random.find('x');
    dir = random_moe(std::stoll(random.substr(0, x)), std::stoll(random.substr(x + 1)), seed);
    std::printf("a random Qwen3-MoE, 8 layers, %s experts x top-k (%s)\n", random.c_str(),
                dir.c_str());
  }
  for (auto dtype : {torch::kFloat32, torch::kBFloat16}) compare(dir, dtype, B, P, N, seed);
  return 0;
}
