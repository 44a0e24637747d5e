// `rlhf init-model` and `rlhf logprobs`, run as the real binary.
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "models/pretrained.h"
#include "test_paths.h"
#include "test_util.h"

namespace rlhf::models {
namespace {

using testing::TempDir;

struct Result {
  int code;
  std::string output;  // stdout and stderr
};

Result run_cli(const std::string& args) {
  std::string cmd = std::string(RLHF_CLI_PATH) + " " + args + " 2>&1";
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (!pipe) throw std::runtime_error("popen failed: " + cmd);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
  int status = ::pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

TEST(Cli, InitModelWritesAnHfDirectory) {
  TempDir dir;
  auto r = run_cli("init-model --preset tiny --out " + dir.str() + " --seed 5");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("129344 parameters"), std::string::npos) << r.output;
  auto tok = nlohmann::json::parse(std::ifstream(dir / "tokenizer_config.json"));
  EXPECT_EQ(tok["tokenizer_class"], "RlhfByteTokenizer");
  EXPECT_EQ(tok["pad_token"], "<pad>");
  auto model = load_pretrained(dir.str());
  EXPECT_EQ(model->dtype(), torch::kBFloat16);
  EXPECT_EQ(model->config().bos_token_id, 257);
  EXPECT_EQ(model->config().eos_token_id, 258);
  EXPECT_EQ(model->config().pad_token_id, 256);
  // Same seed, same weights; refuses to overwrite without --force.
  EXPECT_EQ(run_cli("init-model --preset tiny --out " + dir.str()).code, 2);
  TempDir again;
  ASSERT_EQ(run_cli("init-model --preset tiny --out " + again.str() + " --seed 5").code, 0);
  EXPECT_TRUE(torch::equal(load_pretrained(again.str())->embed_tokens->weight,
                           model->embed_tokens->weight));

  TempDir critic;
  r = run_cli("init-model --preset tiny --value-head --dtype fp32 --out " + critic.str());
  ASSERT_EQ(r.code, 0) << r.output;
  auto c = load_pretrained(critic.str());
  EXPECT_EQ(c->config().head, HeadKind::kValue);
  EXPECT_EQ(c->dtype(), torch::kFloat32);
  EXPECT_EQ(run_cli("init-model --preset nope --out " + critic.str() + "/x").code, 2);
}

TEST(Cli, LogprobsMatchesTheLibraryAndRejectsBadLines) {
  TempDir dir;
  ASSERT_EQ(run_cli("init-model --preset tiny --dtype fp32 --out " + dir.str()).code, 0);
  std::ofstream(dir / "in.jsonl") << "[257, 72, 105, 33]\n\n{\"input_ids\": [257, 1]}\n";
  auto r = run_cli("logprobs --model " + dir.str() + " --input " + (dir / "in.jsonl") +
                   " --output " + (dir / "out.jsonl"));
  ASSERT_EQ(r.code, 0) << r.output;
  std::ifstream out(dir / "out.jsonl");
  std::string l1, l2;
  std::getline(out, l1);
  std::getline(out, l2);
  auto j1 = nlohmann::json::parse(l1), j2 = nlohmann::json::parse(l2);
  EXPECT_EQ(j1["line"], 1);
  EXPECT_EQ(j2["line"], 3);
  ASSERT_EQ(j1["log_probs"].size(), 3u);
  ASSERT_EQ(j2["log_probs"].size(), 1u);
  auto model = load_pretrained(dir.str());
  torch::NoGradGuard no_grad;
  auto ids = torch::tensor({257, 72, 105, 33}, torch::kInt64).unsqueeze(0);
  auto lp = model->next_token_log_probs(model->forward(ids, torch::ones_like(ids)), ids);
  for (int i = 0; i < 3; ++i)  // same code path and dtype: equal to float printing precision
    EXPECT_NEAR(j1["log_probs"][i].get<double>(), lp[0][i].item<double>(), 1e-6);

  std::ofstream(dir / "bad.jsonl") << "[1, 2]\n[1, 999]\n";
  r = run_cli("logprobs --model " + dir.str() + " --input " + (dir / "bad.jsonl"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("bad.jsonl:2: token id 999 outside the vocabulary [0, 288)"),
            std::string::npos)
      << r.output;
}

TEST(Cli, LogprobsOfTextEqualTheByteTokenizerIds) {
  TempDir dir;
  ASSERT_EQ(run_cli("init-model --preset tiny --dtype fp32 --out " + dir.str()).code, 0);
  // "Hi!" through the byte tokenizer is BOS (257) then the bytes 72, 105, 33.
  std::ofstream(dir / "in.jsonl") << "{\"text\": \"Hi!\"}\n\"Hi!\"\n[257, 72, 105, 33]\n";
  auto r = run_cli("logprobs --model " + dir.str() + " --input " + (dir / "in.jsonl") +
                   " --output " + (dir / "out.jsonl"));
  ASSERT_EQ(r.code, 0) << r.output;
  std::ifstream out(dir / "out.jsonl");
  std::vector<nlohmann::json> rows;
  for (std::string l; std::getline(out, l);) rows.push_back(nlohmann::json::parse(l));
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0]["input_ids"], nlohmann::json({257, 72, 105, 33}));
  // Same ids, same code path: identical output.
  EXPECT_EQ(rows[0]["log_probs"], rows[2]["log_probs"]);
  EXPECT_EQ(rows[1]["log_probs"], rows[2]["log_probs"]);
}

}  // namespace
}  // namespace rlhf::models
