// `rlhf tokenize` as a user runs it: the real binary (RLHF_CLI_PATH) on real tokenizer files,
// checking stdout line by line and the exit codes.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "test_paths.h"

namespace {

namespace fs = std::filesystem;

struct Result {
  int exit_code;
  std::string out;  // stdout
  std::string err;  // stderr
};

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs `rlhf tokenize ARGS` through /bin/sh; arguments are single-quoted by the caller.
// stderr goes to a file named after this process: two test runs may share the build folder.
Result tokenize(const std::string& args) {
  const fs::path err = fs::path(RLHF_BINARY_DIR) /
                       ("tests/tokenizer/cli_stderr." + std::to_string(getpid()) + ".txt");
  const std::string cmd = std::string(RLHF_CLI_PATH) + " tokenize " + args + " 2>" + err.string();
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) throw std::runtime_error("popen failed: " + cmd);
  std::string out;
  char buffer[4096];
  for (size_t n; (n = fread(buffer, 1, sizeof(buffer), pipe)) > 0;) out.append(buffer, n);
  const int status = pclose(pipe);
  Result r{WIFEXITED(status) ? WEXITSTATUS(status) : -1, out, read_file(err)};
  fs::remove(err);
  return r;
}

std::string mistral_dir() {
  const fs::path dir = fs::path(RLHF_SOURCE_DIR) / ".cache/tokenizers/mistral";
  EXPECT_TRUE(fs::exists(dir / "tokenizer.json"))
      << "run \"$(scripts/python-env)\" scripts/make-test-tokenizers (needs PyPI)";
  return "'" + dir.string() + "'";
}

TEST(CliTokenize, EncodesJsonlLinesLikeTheReference) {
  const auto expected = nlohmann::json::parse(read_file(
      fs::path(RLHF_SOURCE_DIR) / "tests/fixtures/tokenizer/expected_mistral.json"))["cases"];
  const fs::path input = fs::path(RLHF_BINARY_DIR) / "tests/tokenizer/cli_input.jsonl";
  {
    std::ofstream out(input);
    for (int i = 0; i < 6; ++i) out << expected[i]["text"].dump() << '\n';
  }
  const auto r = tokenize("--tokenizer " + mistral_dir() + " --input '" + input.string() + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::istringstream lines(r.out);
  std::string line;
  int i = 0;
  for (; std::getline(lines, line); ++i) {
    ASSERT_LT(i, 6);
    EXPECT_EQ(nlohmann::json::parse(line), expected[i]["ids"]) << expected[i]["text"];
  }
  EXPECT_EQ(i, 6);
}

TEST(CliTokenize, DecodeAndSpecialTokens) {
  auto r = tokenize("--tokenizer " + mistral_dir() + " --text 'Hello, world!' --add-special");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "[1,22557,28725,1526,28808]\n");
  r = tokenize("--tokenizer " + mistral_dir() + " --decode --text '[1,22557,28725,1526,28808]'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // The space is HF's too: Strip removes one leading space from the fused text, which starts
  // with "<s>" here (HF's tokenizers decodes these ids to the same string).
  EXPECT_EQ(r.out, "\"<s> Hello, world!\"\n");
  r = tokenize("--tokenizer " + mistral_dir() +
               " --decode --skip-special --text '[1,22557,28725,1526,28808]'");
  EXPECT_EQ(r.out, "\"Hello, world!\"\n");
}

// A tokenizer.model inside the rlhf binary, beside LibTorch (libsentencepiece could not:
// its embedded protobuf aborted the process there).
TEST(CliTokenize, SentencePieceModelInTheRlhfBinary) {
  const fs::path fixtures = fs::path(RLHF_SOURCE_DIR) / "tests/fixtures/tokenizer";
  const auto cases =
      nlohmann::json::parse(read_file(fixtures / "expected_sentencepiece.json"))["cases"];
  const auto& c = cases[0];
  const std::string dir = "'" + (fixtures / "tiny_sp").string() + "'";
  const fs::path input = fs::path(RLHF_BINARY_DIR) / "tests/tokenizer/cli_sp_input.jsonl";
  std::ofstream(input) << c["text"].dump() << '\n';
  auto r = tokenize("--tokenizer " + dir + " --input '" + input.string() + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out), c["ids"]);
  r = tokenize("--tokenizer " + dir + " --decode --skip-special --text '" + c["ids"].dump() + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out), c["decoded_skip_special"]);
}

TEST(CliTokenize, BadInputExitsTwoNamingTheLine) {
  const fs::path input = fs::path(RLHF_BINARY_DIR) / "tests/tokenizer/cli_bad.jsonl";
  std::ofstream(input) << "\"fine\"\n{not json\n";
  auto r = tokenize("--tokenizer " + mistral_dir() + " --input '" + input.string() + "'");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("cli_bad.jsonl:2"), std::string::npos) << r.err;
  r = tokenize("--tokenizer " + mistral_dir() + " --decode --text '[1, 999999]'");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("999999"), std::string::npos) << r.err;
  r = tokenize("--tokenizer '" + std::string(RLHF_BINARY_DIR) + "' --text x");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("no tokenizer found"), std::string::npos) << r.err;
  r = tokenize("--help");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("--tokenizer DIR"), std::string::npos);
}

}  // namespace
