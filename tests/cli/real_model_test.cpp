// rlhf on a real pretrained model, SmolLM2-135M-Instruct (scripts/get-model), against Hugging
// Face transformers itself (tests/cli/smollm2_reference.py, FP32, eager attention): the chat
// template's token ids, greedy generation token for token, and per-token log-probs.
// The reference is made once per build directory and made again when the script changes.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "test_paths.h"
#include "tests/support/run_cli.h"

namespace rlhf::test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// stdout of a shell command (trailing newline dropped) and its exit status.
std::pair<std::string, int> shell(const std::string& cmd) {
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (!pipe) return {"", -1};
  std::string out;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, pipe)) out.append(buf, n);
  const int status = ::pclose(pipe);
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return {out, status};
}

class RealModel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ref_ = std::string(RLHF_BINARY_DIR) + "/test-runs/smollm2-reference";
    // ctest runs each test in its own process, several at once: one makes the reference while
    // the others wait on the lock.
    fs::create_directories(std::string(RLHF_BINARY_DIR) + "/test-runs");
    const std::string lock_path = ref_ + ".lock";
    const int lock = ::open(lock_path.c_str(), O_CREAT | O_RDWR, 0644);
    if (lock < 0 || ::flock(lock, LOCK_EX) != 0) {
      error_ = "cannot lock " + lock_path;
      return;
    }
    struct Unlock {
      int fd;
      ~Unlock() { ::close(fd); }
    } unlock{lock};
    auto [dir, status] = shell(std::string(RLHF_SOURCE_DIR) + "/scripts/get-model " +
                               "smollm2-135m-instruct 2>" + ref_ + ".get-model.err");
    model_ = status == 0 ? dir : "";
    if (model_.empty()) return;
    const std::string script = std::string(RLHF_SOURCE_DIR) + "/tests/cli/smollm2_reference.py";
    // Made again when the script differs from the copy kept beside the reference.
    if (slurp(ref_ + "/script.py") != slurp(script) || !fs::exists(ref_ + "/reference.json")) {
      fs::remove_all(ref_);
      const auto [out, made] =
          shell("OMP_NUM_THREADS=2 timeout 600 '" + std::string(RLHF_PYTHON) + "' '" + script +
                "' --model '" + model_ + "' --out '" + ref_ + "' 2>&1");
      if (made != 0) {
        error_ = "smollm2_reference.py failed: " + out;
        return;
      }
      fs::copy_file(script, ref_ + "/script.py");
    }
    reference_ = json::parse(slurp(ref_ + "/reference.json"));
  }

  void SetUp() override {
    ASSERT_TRUE(error_.empty()) << error_;
    ASSERT_FALSE(model_.empty()) << "scripts/get-model smollm2-135m-instruct failed: "
                                 << slurp(ref_ + ".get-model.err");
  }

  static std::string model_, ref_, error_;
  static json reference_;
};
std::string RealModel::model_, RealModel::ref_, RealModel::error_;
json RealModel::reference_;

// The model by its names (core/model_ref.h): the directory, the name scripts/get-model makes
// it under, and, after `get-model --hf-cache`, its Hub name in a Hub cache, which transformers
// reads offline too. All give the same log-probs (the same files); transformers' sum of the
// same tokens' log-probs is within 1e-4 of rlhf's (FP32).
TEST_F(RealModel, ItsDirectoryItsNameAndItsHubNameAreTheSameFiles) {
  const std::string hf_home = ref_ + ".hf-home";
  fs::remove_all(hf_home);
  const std::string env = "HF_HOME='" + hf_home + "' HF_HUB_OFFLINE=1 ";
  const auto [made, status] = shell(env + std::string(RLHF_SOURCE_DIR) +
                                    "/scripts/get-model smollm2-135m-instruct --hf-cache 2>&1");
  ASSERT_EQ(status, 0) << made;
  const std::string text = "--text 'The capital of France is' --dtype fp32 2>/dev/null";
  auto logprobs = [&](const std::string& model) {
    return shell(env + "'" + std::string(RLHF_CLI_PATH) + "' logprobs --model " + model + " " +
                 text);
  };
  const auto by_dir = logprobs("'" + model_ + "'");
  ASSERT_EQ(by_dir.second, 0);
  // The rlhf cache scripts/get-model used (its default, or RLHF_MODEL_CACHE as set here).
  EXPECT_EQ(logprobs("smollm2-135m-instruct"), by_dir);
  EXPECT_EQ(logprobs("HuggingFaceTB/SmolLM2-135M-Instruct"), by_dir);
  const auto ours = json::parse(by_dir.first);
  const auto [hf, hf_status] =
      shell(env + "'" + std::string(RLHF_PYTHON) +
            "' -c \"import torch, transformers as t; n='HuggingFaceTB/SmolLM2-135M-Instruct'; "
            "tok=t.AutoTokenizer.from_pretrained(n); "
            "m=t.AutoModelForCausalLM.from_pretrained(n, dtype=torch.float32); "
            "ids=tok('The capital of France is', return_tensors='pt').input_ids; "
            "lp=torch.log_softmax(m(ids).logits[0,:-1].float(),-1).gather(-1,ids[0,1:,None]); "
            "print(ids[0].tolist()); print(lp.sum().item())\" 2>/dev/null");
  ASSERT_EQ(hf_status, 0) << hf;
  std::istringstream lines(hf);
  std::string ids, sum;
  std::getline(lines, ids);
  std::getline(lines, sum);
  EXPECT_EQ(json::parse(ids), ours["input_ids"]);
  EXPECT_NEAR(std::stod(sum), ours["sum"].get<double>(), 1e-4);
  fs::remove_all(hf_home);
}

TEST_F(RealModel, ChatTemplateTokensEqualApplyChatTemplate) {
  // SmolLM2's ChatML template, with its default system prompt where a chat has none.
  const auto r = run_cli({"tokenize", "--tokenizer", model_, "--input", ref_ + "/chats.jsonl",
                          "--apply-chat-template"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::istringstream lines(r.out);
  std::string line;
  size_t i = 0;
  for (; std::getline(lines, line); ++i) {
    ASSERT_LT(i, reference_["chat_ids"].size());
    EXPECT_EQ(json::parse(line), reference_["chat_ids"][i]) << "chat " << i;
  }
  EXPECT_EQ(i, reference_["chat_ids"].size());
}

TEST_F(RealModel, GreedyGenerationIsTokenIdenticalToTransformers) {
  const std::string out = ref_ + "/rlhf-greedy.jsonl";
  const auto r = run_cli({"generate", "--model", model_, "--input", ref_ + "/chats.jsonl",
                          "--apply-chat-template", "--temperature", "0", "--max-new-tokens", "24",
                          "--dtype", "fp32", "--output", out});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto rows = read_jsonl(out);
  ASSERT_EQ(rows.size(), reference_["greedy"].size());
  for (size_t i = 0; i < rows.size(); ++i) {
    auto ids = rows[i]["response_ids"].get<std::vector<int64_t>>();
    if (rows[i]["finish_reason"] == "stop") ids.pop_back();  // HF's output has EOS dropped too
    EXPECT_EQ(json(ids), reference_["greedy"][i]) << "chat " << i << ": " << rows[i]["response"];
  }
}

TEST_F(RealModel, LogProbsEqualTransformersInFp32) {
  // The conversation and HF's greedy answer, scored by both.
  std::string lines;
  for (size_t i = 0; i < reference_["chat_ids"].size(); ++i) {
    auto ids = reference_["chat_ids"][i].get<std::vector<int64_t>>();
    for (const auto& t : reference_["greedy"][i]) ids.push_back(t.get<int64_t>());
    lines += json({{"input_ids", ids}}).dump() + "\n";
  }
  const auto r = run_cli({"logprobs", "--model", model_, "--input",
                          write_temp("smollm2-ids.jsonl", lines), "--dtype", "fp32"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::istringstream out(r.out);
  std::string line;
  double worst = 0;
  size_t tokens = 0, i = 0;
  for (; std::getline(out, line); ++i) {
    const auto ours = json::parse(line)["log_probs"].get<std::vector<double>>();
    const auto theirs = reference_["log_probs"][i].get<std::vector<double>>();
    ASSERT_EQ(ours.size(), theirs.size()) << "sequence " << i;
    for (size_t t = 0; t < ours.size(); ++t) worst = std::max(worst, std::abs(ours[t] - theirs[t]));
    tokens += ours.size();
  }
  EXPECT_EQ(i, reference_["log_probs"].size());
  // FP32 with different reduction orders (SDPA vs eager attention, our fused head): 1e-4 is
  // the issue's bound; measured ~3.5e-5 on this CPU.
  EXPECT_LE(worst, 1e-4) << "over " << tokens << " tokens";
  std::cout << "max |log-prob diff| vs transformers: " << worst << " over " << tokens
            << " tokens\n";
}

// The RLVR example on the real model, cut to two small steps (the full run is a benchmark,
// bench/RESULTS.md): prompts in SmolLM2's chat template, the held-out evaluation before and
// after, and a trained export that transformers loads and computes as rlhf does.
// The easiest problems of synthetic:arith ("What is 51 + 26? ..."), as a JSONL dataset: the
// training split's and the held-out split's, written by `rlhf dataset`.
std::string easy_additions(const std::string& source, const std::string& name) {
  const auto r = run_cli({"dataset", source, "--count", "2000"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const std::regex addition(R"(^What is \d+ \+ \d+\?)");
  std::string rows;
  std::istringstream in(r.out);
  for (std::string line; std::getline(in, line);)
    if (std::regex_search(json::parse(line)["prompt"].get<std::string>(), addition))
      rows += line + "\n";
  return write_temp(name, rows);
}

// The example's job, short (3 steps of 8 prompts x 8 samples, ~3 minutes on 2 cores), on the
// easiest problems: held-out accuracy must rise. Measured (lr 5e-5): 5/32 -> 21/32 after 4
// steps on an AMD EPYC (BF16); 4/32 -> 25/32 after 3 steps on an Intel Xeon (FP32). Greedy
// evaluation is deterministic, so an actor that did not learn (or learned the wrong way)
// scores the same or less; a rise of 5 problems of 32 is well inside what was measured and
// far from an unchanged policy. Then transformers loads the export.
TEST_F(RealModel, ShortGrpoJobRaisesAccuracyOnTheEasiestProblemsAndExports) {
  const std::string runs =
      std::string(RLHF_BINARY_DIR) + "/test-runs/real-model-" + std::to_string(::getpid());
  const std::string train = easy_additions("synthetic:arith", "easy-train.jsonl");
  const std::string held_out = easy_additions("synthetic:arith_test", "easy-test.jsonl");
  const auto r = run_cli({"run",   "examples/grpo_smollm2_arith.json",
                          "--set", "actor.model=" + model_,
                          "--set", "logger.run_dir=" + runs,
                          "--set", "data.prompt_dataset=" + train,
                          "--set", "data.eval_dataset=" + held_out,
                          "--set", "data.input_key=prompt",
                          "--set", "data.label_key=label",
                          "--set", "train.max_steps=3",
                          "--set", "rollout.batch_size=8",
                          "--set", "rollout.micro_batch_size=8",
                          "--set", "rollout.max_new_tokens=32",
                          "--set", "train.batch_size=64",
                          "--set", "train.micro_batch_size=16",
                          "--set", "actor.adam.lr=5e-5",
                          "--set", "eval.steps=3",
                          "--set", "eval.max_samples=32",
                          "--set", "cluster.threads_per_worker=2"},
                         540);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::string dir = runs + "/grpo_smollm2_arith";
  std::vector<json> evals, steps;
  for (auto& m : read_jsonl(dir + "/metrics.jsonl"))
    (m.value("split", "") == "eval" ? evals : steps).push_back(m);
  ASSERT_EQ(steps.size(), 3u);
  ASSERT_EQ(evals.size(), 2u);
  EXPECT_EQ(evals[0]["step"], 0);
  EXPECT_EQ(evals[1]["step"], 3);
  EXPECT_EQ(evals[0]["prompts"], 32);
  const int64_t before = evals[0]["correct"].get<int64_t>();
  const int64_t after = evals[1]["correct"].get<int64_t>();
  std::cout << "held-out easy additions correct: " << before << " -> " << after << " of 32\n";
  EXPECT_GE(after, before + 5) << "held-out easy additions correct: " << before << " -> " << after
                               << " of 32";
  for (const auto& s : steps) {
    EXPECT_TRUE(s["reward"].contains("correct")) << s.dump();
    EXPECT_TRUE(s["reward"].contains("ends_with_number")) << s.dump();
  }
  // The policy saw the chat template with SmolLM2's default system prompt.
  const auto samples = read_jsonl(dir + "/samples.jsonl");
  ASSERT_FALSE(samples.empty());
  EXPECT_EQ(samples[0]["prompt"].get<std::string>().rfind(
                "<|im_start|>system\nYou are a helpful AI assistant named SmolLM", 0),
            0u)
      << samples[0]["prompt"];
  // The job says which compute dtype `auto` chose (BF16 with BF16 units, else FP32).
  EXPECT_NE(r.err.find("compute dtype (auto): actor"), std::string::npos) << r.err;
  // transformers loads the export; its log-probs equal rlhf's on the export (FP32, 1e-4).
  const std::string exported = dir + "/export/actor";
  const std::string ids = "[1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308]";
  const auto ours = run_cli({"logprobs", "--model", exported, "--input",
                             write_temp("export-ids.jsonl", "{\"input_ids\": " + ids + "}\n"),
                             "--dtype", "fp32"});
  ASSERT_EQ(ours.exit_code, 0) << ours.err;
  const auto [theirs, status] =
      shell("OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 '" + std::string(RLHF_PYTHON) +
            "' -c \"import torch, json, transformers as t; "
            "m = t.AutoModelForCausalLM.from_pretrained('" +
            exported + "', dtype=torch.float32).eval(); x = torch.tensor([" + ids +
            "]); lp = torch.log_softmax(m(x).logits[0, :-1].float(), -1)"
            ".gather(1, x[0, 1:, None])[:, 0]; print(json.dumps(lp.tolist()))\" 2>&1");
  ASSERT_EQ(status, 0) << theirs;
  const auto a = json::parse(ours.out)["log_probs"].get<std::vector<double>>();
  const auto b = json::parse(theirs.substr(theirs.rfind('\n') + 1)).get<std::vector<double>>();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-4) << "position " << i;
  std::filesystem::remove_all(runs);
}

}  // namespace
}  // namespace rlhf::test
