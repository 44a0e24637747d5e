// Parity with Hugging Face transformers itself (the PyPI package in RLHF_PYTHON): tiny random
// Llama, Qwen2, Qwen3, Mistral, Gemma 3 and the mixtures of experts Qwen3-MoE, Qwen2-MoE and
// Mixtral, written by transformers' save_pretrained (FP32), and HF's own outputs for them
// (tests/models/hf_reference.py). rlhf must load those directories and
// give the same logits, log-probs, value-model scores and greedy tokens; an rlhf export after
// a training step must load in transformers with the same logits; a config feature rlhf
// does not implement must be refused by name at load.
//
// Tolerance (kFp32Tolerance): max absolute error 1e-4 over every compared entry. Both sides
// run FP32 with the same math; they differ only in summation order (rlhf's fused SDPA and
// chunked log-softmax vs HF's eager matmul + softmax), ~1e-6 on logits of size ~1 and
// log-probs of size ~6. An absolute bound suits both (no entry is compared relative to a
// near-zero value), leaves ~100x headroom for reduction order, and sits 100x below what a
// real defect moves (an ignored sliding window, for one, moves logits by > 1e-2: checked).
//
// The Python reference runs once per build tree: its output is kept in
// build/test-runs/hf-reference and made again when hf_reference.py, RLHF_PYTHON or the
// versions of its transformers/torch/safetensors change.
// A reference that cannot run (no Python, transformers missing) fails the tests.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "core/errors.h"
#include "models/causal_lm.h"
#include "models/decoder_layer.h"
#include "models/layer_spec.h"
#include "models/moe.h"
#include "models/param_layout.h"
#include "models/pretrained.h"
#include "models/routes.h"
#include "models/safetensors.h"
#include "test_paths.h"
#include "test_util.h"
#include "tests/support/run_cli.h"

namespace rlhf::models {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::expect_error;

constexpr double kFp32Tolerance = 1e-4;
constexpr int kSeed = 0;
const std::string kScript = std::string(RLHF_SOURCE_DIR) + "/tests/models/hf_reference.py";

std::string quote(const std::string& s) {
  return test::shell_quote(s);
}

// Runs `RLHF_PYTHON hf_reference.py ARGS`; "" on success, else the exit status and the
// script's output (why the reference could not run).
std::string run_reference(const std::string& args, const std::string& log) {
  return test::run_python_reference(kScript, args, log,
                                    "run scripts/setup to install transformers");
}

// "transformers X torch Y safetensors Z" of RLHF_PYTHON without importing them (~0.1 s);
// "" when Python or a package is missing.
std::string package_versions() {
  const std::string cmd = quote(RLHF_PYTHON) +
                          " -c 'import importlib.metadata as m; print(*(p + \" \" + m.version(p) "
                          "for p in (\"transformers\", \"torch\", \"safetensors\")))' 2>/dev/null";
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (!pipe) return "";
  std::string out;
  char buf[256];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, pipe)) > 0;) out.append(buf, n);
  return ::pclose(pipe) == 0 ? out : "";
}

// FNV-1a: a stable fingerprint of the script, for the cache stamp.
uint64_t fingerprint(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  return h;
}

// The directory hf_reference.py `make` wrote (one subdirectory per case), made at most once
// per build tree and script version; concurrent test processes wait on a lock file. Sets
// `error` (and returns "") when the reference cannot run.
std::string reference_dir(std::string& error) {
  const fs::path root = fs::path(RLHF_BINARY_DIR) / "test-runs";
  const fs::path dir = root / "hf-reference";
  // Made again when the interpreter, its packages, the script or the seed change.
  const std::string stamp = std::string("python ") + RLHF_PYTHON + "\n" + package_versions() +
                            "script " + std::to_string(fingerprint(test::slurp(kScript))) +
                            "\nseed " + std::to_string(kSeed) + "\n";
  fs::create_directories(root);
  const int lock = ::open((root / "hf-reference.lock").c_str(), O_CREAT | O_RDWR, 0644);
  if (lock < 0 || ::flock(lock, LOCK_EX) != 0) {
    error = "cannot lock " + (root / "hf-reference.lock").string();
    if (lock >= 0) ::close(lock);
    return "";
  }
  if (test::slurp((dir / "stamp").string()) != stamp) {
    const fs::path tmp = root / ("hf-reference.tmp-" + std::to_string(::getpid()));
    fs::remove_all(tmp);
    fs::create_directories(tmp);
    error = run_reference("make --out " + quote(tmp.string()) + " --seed " + std::to_string(kSeed),
                          (root / "hf-reference.log").string());
    if (error.empty()) {
      std::ofstream(tmp / "stamp") << stamp;
      fs::remove_all(dir);
      fs::rename(tmp, dir);
    } else {
      fs::remove_all(tmp);
    }
  }
  ::flock(lock, LOCK_UN);
  ::close(lock);
  return error.empty() ? dir.string() : "";
}

// The case directory <reference dir>/<name>. Throws (failing the test with the reason)
// when the reference could not be made.
std::string case_dir(const std::string& name) {
  std::string error;
  const std::string root = reference_dir(error);
  if (!error.empty()) throw std::runtime_error(error);
  const fs::path dir = fs::path(root) / name;
  if (!fs::is_directory(dir)) throw std::runtime_error(dir.string() + ": not written");
  return dir.string();
}

// Max |a - b| over the entries where `where` (broadcast to a's shape) is true.
double max_abs_error(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& where) {
  EXPECT_EQ(a.sizes(), b.sizes());
  auto diff = (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs();
  auto keep = where.to(torch::kBool).expand_as(diff);
  EXPECT_GT(keep.sum().item<int64_t>(), 0) << "nothing to compare";
  return diff.masked_select(keep).max().item<double>();
}

void report(const std::string& what, double error) {
  std::cout << "[ measured ] " << what << ": max abs error " << error << std::endl;
}

std::shared_ptr<CausalLM> load_fp32(const std::string& dir) {
  LoadOptions options;
  options.dtype = torch::kFloat32;
  return load_pretrained(dir, options);
}

struct Reference {
  explicit Reference(const std::string& dir)
      : file((fs::path(dir) / "reference.safetensors").string()) {}
  torch::Tensor operator[](const std::string& name) const { return file.view(name).clone(); }
  SafetensorsFile file;
};

// Where logits are compared: every token that is not padding. [B, T] -> [B, T, 1].
torch::Tensor token_positions(const torch::Tensor& mask) {
  return (mask != 0).unsqueeze(-1);
}
// Where next-token log-probs are compared: both the context token and the predicted one
// are tokens. [B, T] -> [B, T-1].
torch::Tensor next_token_positions(const torch::Tensor& mask) {
  const int64_t T = mask.size(1);
  return (mask.narrow(1, 0, T - 1) != 0).logical_and(mask.narrow(1, 1, T - 1) != 0);
}

// ---- logits and log-probs ------------------------------------------------------------

class LogitsAndLogProbs : public ::testing::TestWithParam<std::string> {};

TEST_P(LogitsAndLogProbs, MatchTransformers) {
  const std::string dir = case_dir(GetParam());
  torch::NoGradGuard no_grad;
  auto model = load_fp32(dir);
  Reference ref(dir);
  // The plain batch takes SDPA's mask-free causal path; the padded batch (left padding of
  // 3 and 7, one right-padded row) the dense-mask path.
  const auto plain = ref["plain_input_ids"];
  const auto padded = ref["padded_input_ids"], mask = ref["padded_attention_mask"];
  const auto ones = torch::ones_like(plain);
  for (const auto& [kind, ids, m] : {std::tuple{std::string("plain"), plain, ones},
                                     std::tuple{std::string("padded"), padded, mask}}) {
    auto hidden = model->forward(ids, m);
    auto logits = model->logits(hidden);
    auto log_probs = model->next_token_log_probs(hidden, ids, /*chunk=*/5);  // 3 chunks
    const double logits_error = max_abs_error(logits, ref[kind + "_logits"], token_positions(m));
    const double log_probs_error =
        max_abs_error(log_probs, ref[kind + "_log_probs"], next_token_positions(m));
    report(GetParam() + " " + kind + " logits", logits_error);
    report(GetParam() + " " + kind + " log-probs", log_probs_error);
    EXPECT_LE(logits_error, kFp32Tolerance) << kind;
    EXPECT_LE(log_probs_error, kFp32Tolerance) << kind;
  }
}

const auto kMoeCases = ::testing::Values("qwen3-moe", "qwen3-moe-ties", "qwen2-moe", "mixtral");

INSTANTIATE_TEST_SUITE_P(HfParity, LogitsAndLogProbs,
                         ::testing::Values("llama", "qwen2", "qwen3", "qwen3-bias", "mistral",
                                           "gemma3"));
INSTANTIATE_TEST_SUITE_P(HfParityMoe, LogitsAndLogProbs, kMoeCases);

TEST(HfParity, ReadsTheConfigsTransformers5Writes) {
  // transformers 5 keeps rope_theta and the scaling inside "rope_parameters" and the dtype
  // as "dtype": read as transformers reads them, not defaulted (a defaulted theta of 1e4
  // would still run, with different logits).
  const std::string llama = case_dir("llama");
  auto c = ModelConfig::from_json_file(llama);
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.rope_scaling.type, RopeScalingType::kNone);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.torch_dtype, "float32");
  const std::string qwen2 = case_dir("qwen2");
  c = ModelConfig::from_json_file(qwen2);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_FALSE(c.o_proj_bias);
  // Qwen3: per-head q/k norms, biases only with attention_bias (o_proj too), head_dim as
  // given (16 and 8, not hidden_size / heads = 8 and 12).
  c = ModelConfig::from_json_file(case_dir("qwen3"));
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.qkv_bias || c.o_proj_bias || c.mlp_bias);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  c = ModelConfig::from_json_file(case_dir("qwen3-bias"));
  EXPECT_TRUE(c.qk_norm && c.qkv_bias && c.o_proj_bias);
  EXPECT_FALSE(c.mlp_bias || c.tie_word_embeddings);
  EXPECT_EQ(c.head_dim, 8);
  auto qwen3_back = json::parse(c.to_json_text());
  EXPECT_EQ(qwen3_back["model_type"], "qwen3");
  EXPECT_EQ(qwen3_back["architectures"], json::array({"Qwen3ForCausalLM"}));
  EXPECT_EQ(qwen3_back["attention_bias"], true);
  EXPECT_EQ(qwen3_back["head_dim"], 8);
  const std::string mistral = case_dir("mistral");
  c = ModelConfig::from_json_file(mistral);
  EXPECT_EQ(c.sliding_window, 4);
  EXPECT_EQ(c.head_dim, 16);  // not hidden_size / heads = 12
  EXPECT_EQ(c.rope_scaling.type, RopeScalingType::kLinear);
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 2.0);
  const std::string value = case_dir("llama-value");
  c = ModelConfig::from_json_file(value);
  EXPECT_EQ(c.head, HeadKind::kValue);
  EXPECT_EQ(c.rope_scaling.type, RopeScalingType::kLlama3);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 16);
  EXPECT_TRUE(c.qkv_bias && c.o_proj_bias && c.mlp_bias);
  // What rlhf writes reads back the same, and carries the transformers 5 keys too.
  auto back = ModelConfig::from_json_text(c.to_json_text(), "round trip");
  EXPECT_DOUBLE_EQ(back.rope_theta, 500000.0);
  EXPECT_EQ(back.rope_scaling.type, RopeScalingType::kLlama3);
  auto written = json::parse(c.to_json_text());
  EXPECT_EQ(written["rope_parameters"]["rope_theta"], 500000.0);
  EXPECT_EQ(written["rope_parameters"]["rope_type"], "llama3");
  EXPECT_EQ(written["dtype"], "float32");
}

// Max |logits - HF's| on the plain batch of case `dir`, for its weights loaded into a model
// of `config` (the case's config with something changed).
double plain_logits_error(const std::string& dir, const ModelConfig& config) {
  torch::NoGradGuard no_grad;
  CausalLM model(config);
  load_weights(model, CheckpointReader(dir));
  Reference ref(dir);
  const auto plain = ref["plain_input_ids"];
  const auto ones = torch::ones_like(plain);
  return max_abs_error(model.logits(model.forward(plain, ones)), ref["plain_logits"],
                       token_positions(ones));
}

TEST(HfParity, MistralSlidingWindowShorterThanTheSequenceIsHonoured) {
  // The window (4) is shorter than the 12-token sequences, so it shapes most positions: the
  // same weights with the window ignored are far from HF, i.e. the parity above checks it.
  const std::string dir = case_dir("mistral");
  ModelConfig config = ModelConfig::from_json_file(dir);
  ASSERT_EQ(config.sliding_window, 4);
  config.sliding_window = 0;
  const double error = plain_logits_error(dir, config);
  report("mistral with the window ignored, logits", error);
  EXPECT_GT(error, 1e-2);
}

// ---- Gemma 3 ------------------------------------------------------------------------------

TEST(HfParity, Gemma3ReadsItsLayerKindsAndItsParametersAreTheLayouts) {
  // What the family file read from the config transformers wrote, and the parameter layout
  // the loader and the planner use: exactly the tensors of the saved file (tied head: no
  // lm_head), so `rlhf plan` counts what loads.
  const std::string dir = case_dir("gemma3");
  const ModelConfig c = ModelConfig::from_json_file(dir);
  EXPECT_EQ(c.model_type, "gemma3_text");
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.sliding_window, 0);  // the global layer sees every key
  EXPECT_EQ(c.local_window, 4);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  EXPECT_EQ(c.rope_scaling.type, RopeScalingType::kLinear);
  EXPECT_DOUBLE_EQ(c.rope_local_theta, 10000.0);
  EXPECT_DOUBLE_EQ(c.query_pre_attn_scalar, 24.0);
  EXPECT_EQ(layer_window(c, 0), 4);
  EXPECT_EQ(layer_window(c, 1), 0);
  EXPECT_EQ(layer_window(c, 2), 4);
  const LayerSpec spec = layer_spec(c, 1);
  EXPECT_TRUE(spec.sandwich_norms && spec.norm_unit_offset && spec.qk_norm);
  EXPECT_EQ(spec.activation, Activation::kGeluTanh);
  EXPECT_NEAR(spec.attention_scale, 1.0 / std::sqrt(24.0), 1e-12);

  CheckpointReader file(dir);
  const std::vector<std::string> names = file.names();
  std::set<std::string> saved(names.begin(), names.end()), laid_out;
  int64_t saved_numel = 0;
  for (const auto& name : names) saved_numel += numel_of(file.info(name).shape);
  for (const auto& [name, shape] : parameter_shapes(c)) laid_out.insert(name);
  EXPECT_EQ(laid_out, saved);
  EXPECT_EQ(c.num_parameters(), saved_numel);
  EXPECT_TRUE(saved.count("model.layers.0.pre_feedforward_layernorm.weight"));
  EXPECT_TRUE(saved.count("model.layers.2.post_feedforward_layernorm.weight"));
}

TEST(HfParity, Gemma3LocalLayersAreWhatMakesItMatch) {
  // The local layers' window (4 < 12 tokens) and RoPE base shape the output: the same
  // weights read as if every layer were global are far from HF, i.e. the parity above checks
  // the per-layer patterns. Also on the paged engine's path (GreedyGenerate).
  const std::string dir = case_dir("gemma3");
  ModelConfig config = ModelConfig::from_json_file(dir);
  config.layer_types.assign(3, "full_attention");
  const double error = plain_logits_error(dir, config);
  report("gemma3 with every layer global, logits", error);
  EXPECT_GT(error, 1e-2);
}

TEST(HfParity, Qwen3QkNormWeightsAreRead) {
  // The reference's q_norm / k_norm weights are random (hf_reference.py): the same model
  // with them reset to HF's initial ones is far from HF, i.e. the parity above checks that
  // they are loaded and applied.
  const std::string dir = case_dir("qwen3");
  torch::NoGradGuard no_grad;
  auto model = load_fp32(dir);
  int64_t reset = 0;
  for (auto& [name, param] : model->state_tensors()) {
    if (name.find("self_attn.q_norm.") == std::string::npos &&
        name.find("self_attn.k_norm.") == std::string::npos)
      continue;
    ASSERT_EQ(param.sizes(), (std::vector<int64_t>{16})) << name << ": [head_dim]";
    param.fill_(1.0);
    ++reset;
  }
  EXPECT_EQ(reset, 4);  // q_norm and k_norm in each of 2 layers
  Reference ref(dir);
  const auto plain = ref["plain_input_ids"];
  const auto ones = torch::ones_like(plain);
  const double error = max_abs_error(model->logits(model->forward(plain, ones)),
                                     ref["plain_logits"], token_positions(ones));
  report("qwen3 with q/k norm weights reset to 1, logits", error);
  EXPECT_GT(error, 1e-2);
}

// ---- mixtures of experts ----------------------------------------------------------------

// Router logits: max absolute error 1e-5 (kRouterTolerance). They are one [E, H] map of hidden
// states that differ from HF's by ~1e-7 (summation order), logits of size ~1.
constexpr double kRouterTolerance = 1e-5;

class RouterMatchesTransformers : public ::testing::TestWithParam<std::string> {};

TEST_P(RouterMatchesTransformers, LogitsAndSelectedExperts) {
  // Every sparse layer's router logits and the experts it selects for each token, plain and
  // padded batches. Selected experts are compared as sets (their order does not change the
  // output); in qwen3-moe-ties layer 0 has exact ties (torch.topk on the same FP32 values in
  // the same order breaks them alike on both sides) and layer 2 near-ties (1e-6 apart).
  const std::string dir = case_dir(GetParam());
  torch::NoGradGuard no_grad;
  auto model = load_fp32(dir);
  Reference ref(dir);
  std::map<int64_t, std::vector<Routes>> seen;
  for (int64_t i = 0; i < model->num_layers(); ++i) {
    auto* layer = model->layers->ptr(i)->as<DecoderLayerImpl>();
    if (layer->moe) layer->moe->record = &seen[i];
  }
  ASSERT_FALSE(seen.empty()) << "no sparse layer";
  const auto plain = ref["plain_input_ids"];
  const auto padded = ref["padded_input_ids"], mask = ref["padded_attention_mask"];
  for (const auto& [kind, ids, m] :
       {std::tuple{std::string("plain"), plain, torch::ones_like(plain)},
        std::tuple{std::string("padded"), padded, mask}}) {
    for (auto& [i, routes] : seen) routes.clear();
    model->forward(ids, m);
    const auto tokens = m.reshape({-1}) != 0;  // [B T]
    for (auto& [i, routes] : seen) {
      SCOPED_TRACE(kind + " layer " + std::to_string(i));
      ASSERT_EQ(routes.size(), 1u);
      const std::string at = "_" + std::to_string(i);
      const double error =
          max_abs_error(routes[0].logits, ref[kind + "_router_logits" + at], tokens.unsqueeze(-1));
      const auto ours = std::get<0>(routes[0].experts.sort(-1));
      const auto theirs = std::get<0>(ref[kind + "_router_experts" + at].sort(-1));
      ASSERT_EQ(ours.sizes(), theirs.sizes());
      const int64_t differ = (ours != theirs).any(-1).logical_and(tokens).sum().item<int64_t>();
      report(GetParam() + " " + kind + " layer " + std::to_string(i) + " router logits", error);
      std::cout << "[ measured ] " << GetParam() << " " << kind << " layer " << i << ": " << differ
                << " of " << tokens.sum().item<int64_t>()
                << " tokens routed to other experts than transformers'" << std::endl;
      EXPECT_LE(error, kRouterTolerance);
      EXPECT_EQ(differ, 0);
    }
  }
}

TEST_P(RouterMatchesTransformers, LoadBalancingLossAndItsRouterGradient) {
  // transformers' aux_loss (output_router_logits: load_balancing_loss_func over every sparse
  // layer, padding masked) of the padded batch, and its gradient on each router's weight:
  // rlhf's AuxLoss with per-layer checkpointing (the gradient comes from the recompute, with
  // the counts the forward sealed). FP32: the loss within 1e-6 relative, gradients within
  // 1e-4 relative (summation order only).
  const std::string dir = case_dir(GetParam());
  auto model = load_fp32(dir);
  Reference ref(dir);
  const auto ids = ref["padded_input_ids"], mask = ref["padded_attention_mask"];
  model->set_checkpointing(Checkpointing::kPerLayer);
  model->zero_grad();
  AuxLossScope scope(*model);
  ASSERT_TRUE(scope.sparse());
  scope.loss().begin(mask.reshape({-1}), /*grad_scale=*/1.0);
  const auto hidden = model->forward(ids, mask);
  scope.loss().seal();
  (hidden.sum() * 0).backward();  // only the aux loss's gradient is not zero
  const double theirs = ref["padded_aux_loss"].item<double>();
  const double ours = scope.loss().value();
  std::cout << "[ measured ] " << GetParam() << " load-balancing loss: rlhf " << ours
            << ", transformers " << theirs << std::endl;
  EXPECT_LT(std::abs(ours - theirs), 1e-6 * std::abs(theirs));
  int64_t layers = 0;
  for (int64_t i = 0; i < model->num_layers(); ++i) {
    auto* layer = model->layers->ptr(i)->as<DecoderLayerImpl>();
    if (!layer->moe) continue;
    ++layers;
    const auto expected = ref["padded_aux_grad_" + std::to_string(i)];
    const auto got = layer->moe->gate->weight.grad();
    ASSERT_TRUE(got.defined()) << "layer " << i;
    EXPECT_LT(testing::relative_error(got, expected), 1e-4) << "layer " << i;
    EXPECT_GT(expected.abs().max().item<double>(), 0.0);
  }
  EXPECT_GT(layers, 0);
}

INSTANTIATE_TEST_SUITE_P(HfParityMoe, RouterMatchesTransformers, kMoeCases);

TEST(HfParity, MoeConfigsAndTheirLayoutsAreTheSavedFiles) {
  // What each family file read from the config transformers wrote, and the parameter layout
  // (loader, planner, ZeRO units): exactly the tensors of the saved file, one per expert.
  struct Case {
    const char* name;
    std::vector<bool> sparse;  // per layer
    int64_t experts, top_k, intermediate, shared;
    bool norm_topk;
    const char* expert_tensor;
  };
  const Case cases[] = {
      {"qwen3-moe",
       {true, false, true},
       8,
       2,
       24,
       0,
       true,
       "model.layers.2.mlp.experts.7.down_proj.weight"},
      {"qwen2-moe",
       {false, true, false},
       16,
       4,
       16,
       40,
       false,
       "model.layers.1.mlp.shared_expert_gate.weight"},
      {"mixtral",
       {true, true},
       8,
       2,
       64,
       0,
       true,
       "model.layers.1.block_sparse_moe.experts.7.w3.weight"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    const std::string dir = case_dir(k.name);
    const ModelConfig c = ModelConfig::from_json_file(dir);
    ASSERT_EQ(static_cast<size_t>(c.num_hidden_layers), k.sparse.size());
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
      const MoeSpec moe = layer_spec(c, i).moe;
      EXPECT_EQ(moe.sparse(), k.sparse[i]) << "layer " << i;
      if (!moe.sparse()) continue;
      EXPECT_EQ(moe.experts, k.experts);
      EXPECT_EQ(moe.top_k, k.top_k);
      EXPECT_EQ(moe.intermediate, k.intermediate);
      EXPECT_EQ(moe.shared_intermediate, k.shared);
      EXPECT_EQ(moe.norm_topk, k.norm_topk);
    }
    CheckpointReader file(dir);
    const std::vector<std::string> names = file.names();
    std::set<std::string> saved(names.begin(), names.end()), laid_out;
    int64_t saved_numel = 0;
    for (const auto& name : names) saved_numel += numel_of(file.info(name).shape);
    for (const auto& [name, shape] : parameter_shapes(c)) laid_out.insert(name);
    EXPECT_EQ(laid_out, saved);
    EXPECT_EQ(c.num_parameters(), saved_numel);
    EXPECT_TRUE(saved.count(k.expert_tensor));
    // What rlhf writes reads back as the same model.
    const ModelConfig back = ModelConfig::from_json_text(c.to_json_text(), "round trip");
    EXPECT_EQ(parameter_shapes(back), parameter_shapes(c));
    EXPECT_EQ(back.moe.norm_topk_prob, c.moe.norm_topk_prob);
  }
}

TEST(HfParity, CheckpointMissingAnExpertIsRefusedByName) {
  const std::string dir = case_dir("qwen3-moe");
  const fs::path copy = fs::path(RLHF_BINARY_DIR) / "test-runs" /
                        ("moe-missing-expert-" + std::to_string(::getpid()));
  fs::remove_all(copy);
  fs::create_directories(copy);
  fs::copy_file(fs::path(dir) / "config.json", copy / "config.json");
  const std::string dropped = "model.layers.2.mlp.experts.5.up_proj.weight";
  SafetensorsFile file((fs::path(dir) / "model.safetensors").string());
  NamedTensors kept;
  for (const auto& info : file.tensors())
    if (info.name != dropped) kept.emplace_back(info.name, file.view(info.name));
  save_safetensors((copy / "model.safetensors").string(), kept);
  expect_error<InputError>([&] { load_pretrained(copy.string()); }, {"missing tensors", dropped});
  fs::remove_all(copy);
}

// ---- value model -----------------------------------------------------------------------

TEST(HfParity, ValueModelMatchesLlamaForSequenceClassification) {
  const std::string dir = case_dir("llama-value");
  torch::NoGradGuard no_grad;
  auto model = load_fp32(dir);
  ASSERT_EQ(model->config().head, HeadKind::kValue);
  Reference ref(dir);
  const auto plain = ref["plain_input_ids"];
  const auto padded = ref["padded_input_ids"], mask = ref["padded_attention_mask"];
  for (const auto& [kind, ids, m] :
       {std::tuple{std::string("plain"), plain, torch::ones_like(plain)},
        std::tuple{std::string("padded"), padded, mask}}) {
    // Per-token values: HF's score head over its final hidden states.
    auto values = model->values(model->forward(ids, m));
    const double values_error = max_abs_error(values, ref[kind + "_values"], m != 0);
    // Scores: HF pools the last token that is not pad_token_id (left- and right-padded
    // rows); rlhf takes the last position of the attention mask.
    auto scores = last_token_values(values, m);
    const double scores_error =
        max_abs_error(scores, ref[kind + "_scores"], torch::ones_like(scores));
    report("llama-value " + kind + " values", values_error);
    report("llama-value " + kind + " scores", scores_error);
    EXPECT_LE(values_error, kFp32Tolerance) << kind;
    EXPECT_LE(scores_error, kFp32Tolerance) << kind;
  }
}

// ---- greedy generation (the real binary) ------------------------------------------------

class GreedyGenerate : public ::testing::TestWithParam<std::string> {};

TEST_P(GreedyGenerate, RlhfGenerateGivesTransformersTokens) {
  const std::string dir = case_dir(GetParam());
  const json hf = json::parse(test::slurp((fs::path(dir) / "greedy.json").string()));
  std::string prompts;
  for (const auto& p : hf["prompts"]) prompts += json{{"prompt", p}}.dump() + "\n";
  const std::string input = test::write_temp("greedy-" + GetParam() + ".jsonl", prompts);
  const std::string output = input + ".out";
  // Three prompts of different lengths in one left-padded batch, KV-cached decoding; for
  // mistral the window (4) is shorter than every prompt plus response.
  auto r = test::run_cli({"generate", "--model", dir, "--input", input, "--temperature", "0",
                          "--max-new-tokens", hf["max_new_tokens"].dump(), "--dtype", "fp32",
                          "--output", output});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto lines = test::read_jsonl(output);
  ASSERT_EQ(lines.size(), hf["responses"].size());
  for (size_t i = 0; i < lines.size(); ++i) {
    EXPECT_EQ(lines[i]["prompt"], hf["prompts"][i]);
    EXPECT_EQ(lines[i]["response_ids"], hf["responses"][i])
        << GetParam() << " prompt " << hf["prompts"][i];
  }
}

INSTANTIATE_TEST_SUITE_P(HfParity, GreedyGenerate,
                         ::testing::Values("llama", "qwen2", "qwen3", "qwen3-bias", "mistral",
                                           "gemma3"));
INSTANTIATE_TEST_SUITE_P(HfParityMoe, GreedyGenerate, kMoeCases);

// ---- export after training ---------------------------------------------------------------

class ExportAfterATrainingStep : public ::testing::TestWithParam<std::string> {};

TEST_P(ExportAfterATrainingStep, LoadsInTransformers) {
  // One real SFT step (`rlhf run`, FP32) on the HF-written model (Qwen2; Qwen3 with its
  // q/k norms and tied head), the HF export of the trained actor, then transformers loads
  // that export: its logits must equal rlhf's.
  const std::string initial = case_dir(GetParam());
  const fs::path work = fs::path(RLHF_BINARY_DIR) / "test-runs" /
                        ("hf-export-" + GetParam() + "-" + std::to_string(::getpid()));
  fs::remove_all(work);
  fs::create_directories(work);
  std::string data;
  for (const char* word : {"ab", "cat", "dog", "tree", "sun", "moon", "sky", "sea"})
    data += json{{"prompt", std::string(word) + ":"}, {"output", word}}.dump() + "\n";
  std::ofstream((work / "sft.jsonl").string()) << data;
  auto r = test::run_cli(
      {"run", "examples/sft_tiny.json", "--set", "actor.model=" + initial, "--set",
       "actor.dtype=fp32", "--set", "data.dataset=" + (work / "sft.jsonl").string(), "--set",
       "train.batch_size=8", "--set", "train.micro_batch_size=8", "--set", "train.max_epochs=1",
       "--set", "logger.run_dir=" + (work / "runs").string(), "--set", "name=export"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const fs::path exported = work / "runs" / "export" / "export" / "actor";
  ASSERT_TRUE(fs::exists(exported / "config.json")) << r.out;

  // The export holds every tensor of the initial model, trained: weights moved.
  CheckpointReader before(initial), after(exported.string());
  EXPECT_EQ(after.names(), before.names());
  double largest_change = 0;
  for (const auto& name : before.names()) {
    if (!after.contains(name)) continue;
    ASSERT_EQ(after.info(name).shape, before.info(name).shape) << name;
    largest_change = std::max(largest_change, (after.view(name).to(torch::kFloat64) -
                                               before.view(name).to(torch::kFloat64))
                                                  .abs()
                                                  .max()
                                                  .item<double>());
  }
  std::cout << "[ measured ] largest weight change after one step: " << largest_change << std::endl;
  EXPECT_GT(largest_change, 1e-4);  // AdamW's first step moves weights by ~lr (3e-3)

  // rlhf's logits of the trained model vs transformers' load of the export.
  torch::NoGradGuard no_grad;
  Reference ref(initial);
  const auto ids = ref["padded_input_ids"], mask = ref["padded_attention_mask"];
  const std::string inputs = (work / "inputs.safetensors").string();
  const std::string hf_out = (work / "hf_logits.safetensors").string();
  save_safetensors(inputs, {{"input_ids", ids}, {"attention_mask", mask}});
  const std::string error =
      run_reference("logits --model " + quote(exported.string()) + " --inputs " + quote(inputs) +
                        " --out " + quote(hf_out),
                    (work / "hf_logits.log").string());
  ASSERT_TRUE(error.empty()) << error;
  auto model = load_fp32(exported.string());
  auto logits = model->logits(model->forward(ids, mask));
  const auto hf_logits = SafetensorsFile(hf_out).view("logits");
  const double export_error = max_abs_error(logits, hf_logits, token_positions(mask));
  const double trained_vs_initial =
      max_abs_error(logits, ref["padded_logits"], token_positions(mask));
  report(GetParam() + " export after one step, logits (rlhf vs transformers)", export_error);
  report(GetParam() + " trained vs initial logits (the step's effect)", trained_vs_initial);
  EXPECT_LE(export_error, kFp32Tolerance);
  EXPECT_GT(trained_vs_initial, 1e-3);  // the comparison is of a trained model
  if (!HasFailure()) fs::remove_all(work);
}

INSTANTIATE_TEST_SUITE_P(HfParity, ExportAfterATrainingStep,
                         ::testing::Values("qwen2", "qwen3", "gemma3", "qwen3-moe", "mixtral"));

// ---- features rlhf does not implement ----------------------------------------------------

TEST(HfParity, UnimplementedFeaturesAreRefusedByName) {
  // Config directories transformers wrote, each with one feature rlhf does not implement:
  // loading must fail naming the file and the feature, never run a different model.
  const std::string refuse = case_dir("refuse");
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"qwen2-sliding-window", {"use_sliding_window"}},
      {"qwen2-layer-types", {"layer_types[1]", "\"sliding_attention\""}},
      {"qwen3-sliding-window", {"use_sliding_window", "qwen3"}},
      {"deepseek-v3",
       {"model_type \"deepseek_v3\"", "routing is not implemented", "qwen3_moe, qwen2_moe"}},
      {"mixtral-jitter", {"router_jitter_noise"}},
      {"qwen3-moe-top-k", {"num_experts_per_tok", "between 1 and num_local_experts (4), got 6"}},
      {"llama-yarn", {"rope_parameters type \"yarn\""}},
      {"llama-dynamic", {"rope_parameters type \"dynamic\""}},
      {"llama-partial-rotary", {"partial_rotary_factor"}},
      {"llama-attention-dropout", {"attention_dropout"}},
      {"llama-gelu", {"hidden_act \"gelu\""}},
      {"gemma3-softcapping", {"final_logit_softcapping 30.0", "soft-capping"}},
      {"llama-token-classification", {"LlamaForTokenClassification"}},
  };
  std::set<std::string> made, checked;
  for (const auto& entry : fs::directory_iterator(refuse))
    made.insert(entry.path().filename().string());
  for (const auto& [name, needles] : cases) {
    checked.insert(name);
    const std::string config = (fs::path(refuse) / name / "config.json").string();
    std::vector<std::string> expected = needles;
    expected.push_back(config);
    SCOPED_TRACE(name);
    expect_error<InputError>([&] { load_pretrained((fs::path(refuse) / name).string()); },
                             expected);
  }
  EXPECT_EQ(made, checked) << "every case hf_reference.py writes is checked here";
}

}  // namespace
}  // namespace rlhf::models
