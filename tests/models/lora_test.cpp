// LoRA adapters (models/lora.h) against Hugging Face PEFT itself (tests/models/
// peft_reference.py, PEFT from RLHF_PYTHON): adapters PEFT made on a tiny random Llama and
// Qwen2 (every target module, B not zero, rsLoRA on Qwen2) load in rlhf and give PEFT's
// log-probs, through the API and `rlhf logprobs --adapter`; merged equals unmerged; the
// adapters switched off give the base model; `rlhf merge-adapter`'s output loaded in
// transformers gives PEFT's merged model; an adapter rlhf writes loads in PEFT. Plus the
// initialisations, LoRA dropout under checkpointing, and the refusals of bad input.
//
// Tolerance kFp32Tolerance = 1e-5 (absolute, on log-probs of size ~5): both sides run FP32
// with the same math and differ only in reduction order (rlhf's SDPA vs HF's eager
// attention), ~1e-6; a wrong scale (alpha / r vs alpha / sqrt r) or a missing module moves
// them by > 1e-2 (the adapter moves log-probs by ~0.5 here).
#include "models/lora.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "core/errors.h"
#include "models/causal_lm.h"
#include "models/pretrained.h"
#include "models/safetensors.h"
#include "test_paths.h"
#include "test_util.h"
#include "tests/support/run_cli.h"

namespace rlhf::models {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::expect_error;
using testing::TempDir;

constexpr double kFp32Tolerance = 1e-5;
const std::string kScript = std::string(RLHF_SOURCE_DIR) + "/tests/models/peft_reference.py";

std::string quote(const std::string& s) {
  return test::shell_quote(s);
}

// Runs `RLHF_PYTHON peft_reference.py ARGS`; "" on success, else why it failed.
std::string run_reference(const std::string& args, const std::string& log) {
  return test::run_python_reference(kScript, args, log, "run scripts/setup to install peft");
}

uint64_t fingerprint(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  return h;
}

// build/test-runs/peft-reference, made once per build tree and script version (a lock file
// serialises the test processes). Throws with the reason when the reference cannot run.
std::string reference_root() {
  const fs::path root = fs::path(RLHF_BINARY_DIR) / "test-runs";
  const fs::path dir = root / "peft-reference";
  const std::string stamp = std::string("python ") + RLHF_PYTHON + "\nscript " +
                            std::to_string(fingerprint(test::slurp(kScript))) + "\n";
  fs::create_directories(root);
  const int lock = ::open((root / "peft-reference.lock").c_str(), O_CREAT | O_RDWR, 0644);
  if (lock < 0 || ::flock(lock, LOCK_EX) != 0) throw std::runtime_error("cannot lock");
  std::string error;
  if (test::slurp((dir / "stamp").string()) != stamp) {
    const fs::path tmp = root / ("peft-reference.tmp-" + std::to_string(::getpid()));
    fs::remove_all(tmp);
    fs::create_directories(tmp);
    error =
        run_reference("make --out " + quote(tmp.string()), (root / "peft-reference.log").string());
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
  if (!error.empty()) throw std::runtime_error(error);
  return dir.string();
}

struct Case {
  std::string base, adapter;
  json ref;  // sequences, base, adapter, merged: per sequence, the next-token log-probs
};

Case load_case(const std::string& name) {
  const fs::path dir = fs::path(reference_root()) / name;
  Case c{(dir / "base").string(), (dir / "adapter").string(), {}};
  c.ref = json::parse(test::slurp((dir / "reference.json").string()));
  return c;
}

std::shared_ptr<CausalLM> load_fp32(const std::string& dir) {
  LoadOptions options;
  options.dtype = torch::kFloat32;
  return load_pretrained(dir, options);
}

// rlhf's next-token log-probs of each sequence, one at a time (as `rlhf logprobs`).
std::vector<std::vector<double>> log_probs_of(CausalLM& model, const json& sequences) {
  torch::NoGradGuard no_grad;
  std::vector<std::vector<double>> out;
  for (const auto& seq : sequences) {
    auto ids = torch::tensor(seq.get<std::vector<int64_t>>(), torch::kInt64).unsqueeze(0);
    auto lp = model.next_token_log_probs(model.forward(ids, {}), ids).squeeze(0);
    out.emplace_back(lp.data_ptr<float>(), lp.data_ptr<float>() + lp.numel());
  }
  return out;
}

// Max |a - b| over every position of every sequence.
double max_error(const std::vector<std::vector<double>>& a, const json& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    EXPECT_EQ(a[i].size(), b[i].size()) << "sequence " << i;
    for (size_t t = 0; t < a[i].size() && t < b[i].size(); ++t)
      worst = std::max(worst, std::abs(a[i][t] - b[i][t].get<double>()));
  }
  return worst;
}

void report(const std::string& what, double error) {
  std::cout << "[ measured ] " << what << ": max abs error " << error << std::endl;
}

class PeftParity : public ::testing::TestWithParam<std::string> {};

TEST_P(PeftParity, AdapterMergedAndDisabledMatchPeft) {
  const Case c = load_case(GetParam());
  auto model = load_fp32(c.base);
  const LoraConfig config = load_adapter(*model, c.adapter);
  EXPECT_EQ(model->decoder_linears().size(), 14u);  // 2 layers x 7 modules, all adapted
  for (auto& [name, linear] : model->decoder_linears()) EXPECT_TRUE(linear->lora) << name;
  const double with_adapter = max_error(log_probs_of(*model, c.ref["sequences"]), c.ref["adapter"]);
  report(GetParam() + " adapter vs PEFT", with_adapter);
  EXPECT_LE(with_adapter, kFp32Tolerance);
  // The adapter matters: the base model is far from PEFT's adapted one.
  EXPECT_GT(max_error(log_probs_of(*model, c.ref["sequences"]), c.ref["base"]), 1e-2);

  model->set_adapters_enabled(false);  // the reference model of PPO / DPO
  const double disabled = max_error(log_probs_of(*model, c.ref["sequences"]), c.ref["base"]);
  report(GetParam() + " adapters off vs base", disabled);
  EXPECT_LE(disabled, kFp32Tolerance);
  model->set_adapters_enabled(true);

  const auto before = model->decoder_linears()[0].second->weight.clone();
  merge_adapters(*model);
  const double merged = max_error(log_probs_of(*model, c.ref["sequences"]), c.ref["merged"]);
  report(GetParam() + " merged vs PEFT merged", merged);
  EXPECT_LE(merged, kFp32Tolerance);
  expect_error<std::exception>([&] { model->set_adapters_enabled(false); }, {"merged"});
  unmerge_adapters(*model);
  EXPECT_LE((model->decoder_linears()[0].second->weight - before).abs().max().item<double>(), 1e-6);
  EXPECT_LE(max_error(log_probs_of(*model, c.ref["sequences"]), c.ref["adapter"]), kFp32Tolerance);
  EXPECT_EQ(config.use_rslora, GetParam() == "qwen2");
}

TEST_P(PeftParity, CliLogprobsWithAdapter) {
  const Case c = load_case(GetParam());
  TempDir tmp;
  std::ofstream input(tmp / "in.jsonl");
  for (const auto& seq : c.ref["sequences"]) input << json{{"input_ids", seq}}.dump() << "\n";
  input.close();
  auto r = test::run_cli({"logprobs", "--model", c.base, "--adapter", c.adapter, "--input",
                          tmp / "in.jsonl", "--output", tmp / "out.jsonl"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<std::vector<double>> got;
  for (const auto& line : test::read_jsonl(tmp / "out.jsonl"))
    got.push_back(line["log_probs"].get<std::vector<double>>());
  const double error = max_error(got, c.ref["adapter"]);
  report(GetParam() + " rlhf logprobs --adapter vs PEFT", error);
  EXPECT_LE(error, kFp32Tolerance);
}

// merge-adapter's directory loaded by transformers equals PEFT's merge_and_unload; an adapter
// written by rlhf's save_adapter loaded by PEFT equals PEFT's own.
TEST_P(PeftParity, MergedModelAndSavedAdapterLoadInTransformers) {
  const Case c = load_case(GetParam());
  TempDir tmp;
  auto r = test::run_cli(
      {"merge-adapter", "--model", c.base, "--adapter", c.adapter, "--out", tmp / "merged"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::exists(tmp / "merged/config.json"));
  EXPECT_FALSE(fs::exists(tmp / "merged/adapter_config.json"));
  {
    auto model = load_fp32(c.base);
    const LoraConfig config = load_adapter(*model, c.adapter);
    save_adapter(*model, config, tmp / "resaved", c.base);
  }
  std::ofstream(tmp / "seqs.json") << c.ref["sequences"].dump();
  const std::string merged_err =
      run_reference("score --model " + quote(tmp / "merged") + " --inputs " +
                        quote(tmp / "seqs.json") + " --out " + quote(tmp / "merged.json"),
                    tmp / "merged.log");
  ASSERT_EQ(merged_err, "");
  const double merged = max_error(
      json::parse(test::slurp(tmp / "merged.json")).get<std::vector<std::vector<double>>>(),
      c.ref["merged"]);
  report(GetParam() + " merge-adapter in transformers vs PEFT merged", merged);
  EXPECT_LE(merged, kFp32Tolerance);
  const std::string saved_err = run_reference(
      "score --model " + quote(c.base) + " --adapter " + quote(tmp / "resaved") + " --inputs " +
          quote(tmp / "seqs.json") + " --out " + quote(tmp / "resaved.json"),
      tmp / "resaved.log");
  ASSERT_EQ(saved_err, "");
  const double resaved = max_error(
      json::parse(test::slurp(tmp / "resaved.json")).get<std::vector<std::vector<double>>>(),
      c.ref["adapter"]);
  report(GetParam() + " rlhf-saved adapter in PEFT vs PEFT's", resaved);
  EXPECT_LE(resaved, kFp32Tolerance);
}

INSTANTIATE_TEST_SUITE_P(Models, PeftParity, ::testing::Values("llama", "qwen2"));

// ---- without the reference -----------------------------------------------------------

ModelConfig tiny_config() {
  ModelConfig c = preset_config("tiny");
  return c;
}

TEST(Lora, FreshAdaptersChangeNothingAndFreezeTheBase) {
  CausalLM model(tiny_config());
  auto ids = torch::randint(0, model.config().vocab_size, {2, 7}, torch::kInt64);
  torch::NoGradGuard no_grad;
  const auto base = model.next_token_log_probs(model.forward(ids, {}), ids);
  LoraConfig config;
  config.rank = 4;
  config.target_modules = {"q_proj", "down_proj"};
  apply_lora(model, config, 3);
  int adapted = 0;
  for (auto& [name, linear] : model.decoder_linears()) {
    if (!linear->lora) continue;
    ++adapted;
    const int64_t in = linear->weight.size(1);
    // PEFT's default: A ~ U(-1/sqrt(in), 1/sqrt(in)) (kaiming_uniform, a = sqrt 5), B = 0.
    EXPECT_LE(linear->lora->A.abs().max().item<double>(), 1.0 / std::sqrt(in) + 1e-7) << name;
    EXPECT_GT(linear->lora->A.abs().max().item<double>(), 0.5 / std::sqrt(in)) << name;
    EXPECT_EQ(linear->lora->B.abs().max().item<double>(), 0.0) << name;
    EXPECT_TRUE(linear->lora->A.requires_grad());
    EXPECT_DOUBLE_EQ(linear->lora->scale, 16.0 / 4);
  }
  EXPECT_EQ(adapted, 2 * model.num_layers());
  for (auto& p : model.parameters()) EXPECT_FALSE(p.requires_grad());
  EXPECT_TRUE(torch::equal(model.next_token_log_probs(model.forward(ids, {}), ids), base));
  // The adapters sit in the layer units, after the layer's own parameters.
  auto units = model.param_units();
  const auto& layer = units[1].params;
  EXPECT_EQ(layer[layer.size() - 4].first, "model.layers.0.self_attn.q_proj.lora_A.weight");
  EXPECT_EQ(layer.back().first, "model.layers.0.mlp.down_proj.lora_B.weight");
  EXPECT_EQ(units[1].shapes.back(), (std::vector<int64_t>{model.config().hidden_size, 4}));
}

TEST(Lora, GaussianInitAndRsloraScale) {
  CausalLM model(tiny_config());
  LoraConfig config;
  config.rank = 8;
  config.alpha = 4;
  config.use_rslora = true;
  config.init = LoraInit::kGaussian;
  apply_lora(model, config, 0);
  auto a = model.decoder_linears()[0].second->lora->A;
  // PEFT's "gaussian": normal(0, std = 1 / r); over ~500 draws the std is within 10%.
  EXPECT_NEAR(a.std().item<double>(), 1.0 / 8, 0.0125);
  EXPECT_DOUBLE_EQ(model.decoder_linears()[0].second->lora->scale, 4 / std::sqrt(8.0));
}

// With LoRA dropout, a checkpointed layer's recompute draws the same masks as its forward
// (the generator state is replayed): gradients equal those without checkpointing.
TEST(Lora, DropoutIsReplayedByCheckpointing) {
  auto grads = [](Checkpointing mode, double dropout) {
    torch::manual_seed(5);
    CausalLM model(tiny_config());
    LoraConfig config;
    config.rank = 4;
    config.dropout = dropout;
    apply_lora(model, config, 1);
    {
      torch::NoGradGuard no_grad;  // B random, so A gets gradients too
      for (auto& [name, linear] : model.decoder_linears()) linear->lora->B.normal_(0, 0.1);
    }
    model.set_checkpointing(mode);
    auto ids = torch::randint(0, model.config().vocab_size, {2, 9}, torch::kInt64);
    model.next_token_log_probs(model.forward(ids, {}), ids).sum().backward();
    std::vector<torch::Tensor> out;
    for (auto& [name, linear] : model.decoder_linears())
      out.push_back(
          torch::cat({linear->lora->A.grad().flatten(), linear->lora->B.grad().flatten()}));
    return torch::cat(out);
  };
  const auto plain = grads(Checkpointing::kNone, 0.5);
  const auto checkpointed = grads(Checkpointing::kPerLayer, 0.5);
  const double scale = plain.abs().max().item<double>();
  EXPECT_LE((plain - checkpointed).abs().max().item<double>(), 1e-5 * scale);
  // Dropout is on in those forwards: without it the gradients are far from theirs.
  EXPECT_GT((grads(Checkpointing::kNone, 0.0) - plain).abs().max().item<double>(), 0.1 * scale);
}

TEST(Lora, RefusesBadInputByName) {
  CausalLM model(tiny_config());
  LoraConfig config;
  config.rank = 4;
  config.target_modules = {"q_proj", "w_proj"};
  expect_error<InputError>([&] { apply_lora(model, config, 0, "actor.lora"); },
                           {"actor.lora.target_modules", "\"w_proj\"", "q_proj"});
  config.target_modules = {"all-linear"};
  config.rank = 0;
  expect_error<InputError>([&] { apply_lora(model, config, 0, "actor.lora"); },
                           {"actor.lora.rank", ">= 1"});
  EXPECT_FALSE(model.has_adapters());
}

TEST(Lora, RefusesAnAdapterForAnotherBase) {
  const Case c = load_case("llama");
  ModelConfig other = load_fp32(c.base)->config();
  other.intermediate_size = 40;  // gate/up/down differ from the adapter's base (48)
  CausalLM model(other);
  expect_error<InputError>(
      [&] { load_adapter(model, c.adapter); },
      {"adapter_model.safetensors", "base_model.model.model.layers.0.mlp.down_proj.lora_A.weight",
       "[4, 48]", "[4, 40]"});
  EXPECT_FALSE(model.has_adapters());
  auto r = test::run_cli({"logprobs", "--model", c.base, "--adapter", c.base, "--text", "x"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("adapter_config.json"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace rlhf::models
