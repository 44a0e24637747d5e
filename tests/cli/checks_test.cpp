// What a new user hits first, through the real `rlhf` binary (issue 19): `validate` refuses
// what `run` would refuse, key hints, hints for missing models, paths relative to the spec
// file, the sweep's grid keys, and the small things (--version, grammar, error prefixes,
// hidden internal options, logprobs --text, tables that fit the terminal).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli/table.h"
#include "report/tensorboard.h"
#include "test_paths.h"
#include "tests/support/run_cli.h"

namespace rlhf::test {
namespace {

namespace fs = std::filesystem;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// A fresh directory with a tiny policy and value model (rlhf init-model).
class WithModels : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = test::tiny_models_dir("checks"); }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }
  std::vector<std::string> models() const {
    return {"--set", "actor.model=" + (dir_ / "tiny").string(), "--set",
            "critic.model=" + (dir_ / "tiny-value").string()};
  }
  CliResult validate(std::vector<std::string> extra) const {
    std::vector<std::string> args = {"validate", "examples/ppo_tiny.json"};
    for (const auto& a : models()) args.push_back(a);
    args.insert(args.end(), extra.begin(), extra.end());
    return run_cli(args);
  }
  fs::path dir_;
};

// Each of these used to validate with exit 0 and then fail at `rlhf run`.
TEST_F(WithModels, ValidateRefusesWhatRunRefuses) {
  ASSERT_EQ(validate({}).exit_code, 0) << validate({}).err;
  struct Case {
    std::vector<std::string> set;
    std::string key, message;
  };
  const std::vector<Case> cases = {
      {{"--set", "reward.rule=leters"}, "reward.rule", "unknown rule \"leters\""},
      {{"--set", "data.prompt_dataset=synthetic:letter"},
       "data.prompt_dataset",
       "unknown synthetic dataset \"synthetic:letter\""},
      {{"--set", "actor.model=" + (dir_ / "nope").string()}, "actor.model", "nope not found"},
      {{"--set", "data.prompt_dataset=" + (dir_ / "prompts.jsonl").string()},
       "data.prompt_dataset",
       "prompts.jsonl not found"},
      {{"--set", R"(cluster.nodes=[{"name":"gpu","kind":"cuda","devices":5,"memory_gb":80}])"},
       "cluster.nodes",
       "is placed on cuda node 'gpu' device "},
  };
  for (const auto& c : cases) {
    for (const char* command : {"validate", "run"}) {
      std::vector<std::string> args = {command, "examples/ppo_tiny.json", "--set",
                                       "logger.run_dir=" + (dir_ / "runs").string()};
      for (const auto& a : models()) args.push_back(a);
      args.insert(args.end(), c.set.begin(), c.set.end());
      CliResult r = run_cli(args);
      EXPECT_EQ(r.exit_code, 2) << command << " " << c.set.back() << "\n" << r.out << r.err;
      EXPECT_TRUE(contains(r.err, "  " + c.key)) << command << "\n" << r.err;
      EXPECT_TRUE(contains(r.err, c.message)) << command << "\n" << r.err;
    }
  }
  // No worker was ever started.
  EXPECT_FALSE(fs::exists(dir_ / "runs" / "ppo_tiny" / "workers.json"));
}

// --no-files sizes a spec meant for another machine: files and GPUs are not this one's
// business, but the spec's own names still are.
TEST_F(WithModels, ValidateNoFilesSkipsOnlyThisMachine) {
  CliResult gpu = run_cli({"validate", "examples/ppo_8gpu.json"});
  EXPECT_EQ(gpu.exit_code, 2) << gpu.out;
  EXPECT_TRUE(contains(gpu.err, "/data/prompts.jsonl not found")) << gpu.err;
  CliResult elsewhere = run_cli({"validate", "examples/ppo_8gpu.json", "--no-files"});
  EXPECT_EQ(elsewhere.exit_code, 0) << elsewhere.err;
  EXPECT_TRUE(contains(elsewhere.out, "ok: examples/ppo_8gpu.json")) << elsewhere.out;
  EXPECT_TRUE(contains(elsewhere.out, "not checked: --no-files")) << elsewhere.out;
  CliResult rule = run_cli({"validate", "examples/ppo_8gpu.json", "--no-files", "--set",
                            "reward.model=", "--set", "reward.rule=letterz"});
  EXPECT_EQ(rule.exit_code, 2);
  EXPECT_TRUE(contains(rule.err, "reward.rule: unknown rule \"letterz\"")) << rule.err;
}

// A corrupt safetensors file is bad input (exit 2) named before any worker starts; a
// checkpoint that does not match its config (found by the worker that loads it) is too.
TEST_F(WithModels, CorruptOrMismatchedCheckpointIsBadInput) {
  fs::copy(dir_ / "tiny", dir_ / "broken", fs::copy_options::recursive);
  const fs::path weights = dir_ / "broken" / "model.safetensors";
  fs::resize_file(weights, fs::file_size(weights) / 2);
  for (const char* command : {"validate", "run"}) {
    CliResult r = run_cli({command, "examples/ppo_tiny.json", "--set",
                           "actor.model=" + (dir_ / "broken").string(), "--set",
                           "critic.model=" + (dir_ / "tiny-value").string(), "--set",
                           "logger.run_dir=" + (dir_ / "runs").string()});
    EXPECT_EQ(r.exit_code, 2) << command << "\n" << r.out << r.err;
    EXPECT_TRUE(contains(r.err, "actor.model: ")) << r.err;
    EXPECT_TRUE(contains(r.err, weights.string())) << r.err;
  }
  EXPECT_FALSE(fs::exists(dir_ / "runs" / "ppo_tiny" / "workers.json"));

  // Headers fine, shapes wrong for the config: the actor worker refuses it (exit 2, not 1).
  fs::copy(dir_ / "tiny", dir_ / "mismatch", fs::copy_options::recursive);
  std::ifstream in(dir_ / "mismatch" / "config.json");
  std::string config((std::istreambuf_iterator<char>(in)), {});
  const auto at = config.find("\"intermediate_size\"");
  ASSERT_NE(at, std::string::npos) << config;
  const auto digits = config.find_first_of("0123456789", at);
  config.replace(digits, config.find_first_not_of("0123456789", digits) - digits, "40");
  std::ofstream(dir_ / "mismatch" / "config.json") << config;
  CliResult r = run_cli({"run", "examples/ppo_tiny.json", "--set",
                         "actor.model=" + (dir_ / "mismatch").string(), "--set",
                         "critic.model=" + (dir_ / "tiny-value").string(), "--set",
                         "logger.run_dir=" + (dir_ / "runs").string(), "--set", "name=mismatch"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "does not match the model config")) << r.err;
  EXPECT_TRUE(fs::exists(dir_ / "runs" / "mismatch" / "workers.json")) << "found by a worker";
}

// Relative paths in a spec file are relative to the file; --set paths to the current
// directory (run_cli runs from the source directory, not the spec's).
TEST_F(WithModels, RelativePathsResolveAgainstTheSpecFile) {
  const fs::path project = dir_ / "project";
  fs::create_directories(project / "models");
  fs::copy(dir_ / "tiny", project / "models" / "tiny", fs::copy_options::recursive);
  std::ofstream(project / "prompts.jsonl") << "{\"input\": \"abc:\"}\n{\"input\": \"def:\"}\n";
  std::ofstream(project / "job.json") << R"({
    "kind": "ppo", "name": "rel",
    "cluster": {"nodes": [{"name": "local", "kind": "cpu", "devices": 3, "memory_gb": 4}]},
    "actor": {"model": "models/tiny"},
    "reward": {"rule": "letters"},
    "rollout": {"batch_size": 2, "micro_batch_size": 2, "n_samples_per_prompt": 2,
                "max_new_tokens": 4},
    "data": {"prompt_dataset": "./prompts.jsonl", "prompt_max_len": 8, "max_len": 16},
    "train": {"batch_size": 4, "micro_batch_size": 2},
    "algo": {"advantage": {"estimator": "grpo"}},
    "logger": {"run_dir": "out"}
  })";
  CliResult r = run_cli({"validate", (project / "job.json").string(), "--print"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto resolved = nlohmann::json::parse(r.out);
  EXPECT_EQ(resolved["actor"]["model"], (project / "models" / "tiny").string());
  EXPECT_EQ(resolved["data"]["prompt_dataset"], (project / "prompts.jsonl").string());
  EXPECT_EQ(resolved["logger"]["run_dir"], (project / "out").string());
  // Built-in sources stay as they are; --set is relative to where the command runs.
  CliResult set =
      run_cli({"validate", (project / "job.json").string(), "--no-files", "--print", "--set",
               "data.prompt_dataset=synthetic:letters", "--set", "actor.model=runs/models/x"});
  ASSERT_EQ(set.exit_code, 0) << set.err;
  const auto overridden = nlohmann::json::parse(set.out);
  EXPECT_EQ(overridden["data"]["prompt_dataset"], "synthetic:letters");
  EXPECT_EQ(overridden["actor"]["model"], "runs/models/x");
  const std::string docs = slurp(std::string(RLHF_SOURCE_DIR) + "/docs/job-spec.md");
  EXPECT_TRUE(contains(docs, "relative to the directory of that file")) << "docs state the rule";
}

TEST(Checks, NearestKeyPrefersTheSameSectionAndTheLongestPrefix) {
  const std::string spec = write_temp(
      "typos.json", R"({"rollout": {"n_samples": 2, "max_new": 8}, "job": {"name": "x"}})");
  CliResult r = run_cli({"validate", spec, "--no-files"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err,
                       "rollout.n_samples: unknown key (did you mean "
                       "rollout.n_samples_per_prompt?)"))
      << r.err;
  EXPECT_TRUE(contains(r.err,
                       "rollout.max_new: unknown key (did you mean "
                       "rollout.max_new_tokens?)"))
      << r.err;
  EXPECT_TRUE(contains(r.err, "job.name: unknown key (did you mean name?)")) << r.err;
  // The reference lists name as a top-level key, not under a "job" section.
  const std::string docs = slurp(std::string(RLHF_SOURCE_DIR) + "/docs/job-spec.md");
  EXPECT_FALSE(contains(docs, "## job\n")) << "a heading that reads as a section";
  EXPECT_TRUE(contains(docs, "## top level")) << docs.substr(0, 400);
}

// A missing model that is a released one is to be downloaded; a test model can be made.
TEST(Checks, MissingModelHintFitsThePath) {
  CliResult real = run_cli({"validate", "examples/ppo_8gpu.json"});
  EXPECT_EQ(real.exit_code, 2);
  EXPECT_TRUE(contains(real.err, "/models/Meta-Llama-3-8B-Instruct not found (download"))
      << real.err;
  EXPECT_FALSE(contains(real.err, "init-model")) << real.err;
  CliResult tiny = run_cli(
      {"validate", "examples/sft_tiny.json", "--set", "actor.model=/nonexistent/models/tiny"});
  EXPECT_EQ(tiny.exit_code, 2);
  EXPECT_TRUE(contains(tiny.err, "rlhf init-model --preset tiny --out /nonexistent/models/tiny"))
      << tiny.err;
}

TEST(Checks, SweepRefusesAnUnknownGridKeyBeforeRunningAnything) {
  const std::string out = fs::temp_directory_path() / ("sweep-typo-" + std::to_string(getpid()));
  CliResult r =
      run_cli({"sweep", "examples/ppo_tiny.json", "--grid", "rollout.n_samples=1,2", "--out", out});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_TRUE(contains(r.err,
                       "--grid rollout.n_samples: unknown key (did you mean "
                       "rollout.n_samples_per_prompt?)"))
      << r.err;
  CliResult bad_value = run_cli({"sweep", "examples/ppo_tiny.json", "--grid",
                                 "rollout.n_samples_per_prompt=2,x", "--out", out});
  EXPECT_EQ(bad_value.exit_code, 2) << bad_value.err;
  EXPECT_TRUE(contains(bad_value.err, "rollout.n_samples_per_prompt=x")) << bad_value.err;
  EXPECT_FALSE(fs::exists(fs::path(out) / "sweep.csv")) << "nothing ran";
}

// A variant that never ran shows no memory ("-"), not "0 B": the plan-only sweep's second
// value makes a bad spec (48 samples do not divide into train batches of 32).
TEST(Checks, SweepShowsNoMemoryForABadVariant) {
  const std::string out = fs::temp_directory_path() / ("sweep-bad-" + std::to_string(getpid()));
  CliResult r =
      run_cli({"sweep", "examples/ppo_tiny.json", "--grid", "rollout.n_samples_per_prompt=4,3",
               "--plan-only", "--out", out, "--set", "actor.model=preset:llama-3-8b", "--set",
               "critic.model=preset:llama-3-8b"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string md = slurp(fs::path(out) / "sweep.md");
  EXPECT_TRUE(contains(md, "bad spec")) << md;
  EXPECT_FALSE(contains(md, " 0 B")) << md;
  EXPECT_TRUE(contains(md, "- / - / -")) << md;
  fs::remove_all(out);
}

// The README and the guides point only inside the repository, and every relative link
// resolves to a file in it.
TEST(Checks, DocsLinkOnlyInsideTheRepository) {
  const fs::path root = RLHF_SOURCE_DIR;
  std::vector<fs::path> pages = {root / "README.md"};
  for (const auto& f : fs::directory_iterator(root / "docs"))
    if (f.path().extension() == ".md") pages.push_back(f.path());
  size_t links = 0;
  for (const auto& page : pages) {
    const std::string text = slurp(page.string());
    EXPECT_FALSE(contains(text, "../shared")) << page;
    for (size_t at = text.find("]("); at != std::string::npos; at = text.find("](", at + 2)) {
      const std::string target = text.substr(at + 2, text.find(')', at) - at - 2);
      // Web links, anchors, and code that only looks like a link ("[&](int64_t m)").
      if (target.rfind("http", 0) == 0 || target.rfind("#", 0) == 0 ||
          target.find(' ') != std::string::npos)
        continue;
      const fs::path file = page.parent_path() / target.substr(0, target.find('#'));
      EXPECT_TRUE(fs::exists(file)) << page << " links to " << target;
      const auto inside = fs::relative(fs::weakly_canonical(file), fs::weakly_canonical(root));
      EXPECT_NE(*inside.begin(), "..") << page << " links outside: " << target;
      ++links;
    }
  }
  EXPECT_GT(links, 5u);
}

// The TFRecord checksum of TensorBoard event files: CRC-32C's check value (RFC 3720).
TEST(Checks, Crc32cKnownAnswer) {
  EXPECT_EQ(report::crc32c("123456789"), 0xe3069283u);
  EXPECT_EQ(report::crc32c(""), 0u);
}

TEST(Checks, SmallThings) {
  CliResult version = run_cli({"--version"});
  EXPECT_EQ(version.exit_code, 0);
  EXPECT_EQ(version.out.rfind("rlhf ", 0), 0u) << version.out;
  EXPECT_EQ(test::count_of(version.out, "\n"), 1u) << version.out;

  CliResult one = run_cli({"validate", "examples/sft_tiny.json", "--no-files"});
  EXPECT_TRUE(contains(one.out, ": 1 worker on 1 node")) << one.out;
  CliResult many = run_cli({"validate", "examples/ppo_tiny.json", "--no-files"});
  EXPECT_TRUE(contains(many.out, ": 4 workers on 1 node")) << many.out;

  CliResult spec = run_cli({"spec"});
  EXPECT_EQ(spec.exit_code, 2);
  EXPECT_EQ(test::count_of(spec.err, "rlhf spec"), 1u) << spec.err;

  CliResult help = run_cli({"run", "--help"});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_FALSE(contains(help.out, "--smoke-rounds")) << help.out;
  EXPECT_TRUE(contains(help.out, "--resume-changed")) << help.out;
}

TEST_F(WithModels, LogprobsOfText) {
  CliResult r = run_cli(
      {"logprobs", "--model", (dir_ / "tiny").string(), "--text", "abc", "--text", "hello"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::istringstream lines(r.out);
  std::vector<nlohmann::json> rows;
  for (std::string line; std::getline(lines, line);) rows.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(rows.size(), 2u) << r.out;
  // One log-prob per token after the first, each a log-probability (<= 0).
  for (const auto& row : rows) {
    EXPECT_EQ(row["log_probs"].size() + 1, row["input_ids"].size()) << row.dump();
    for (const auto& v : row["log_probs"]) EXPECT_LE(v.get<double>(), 0.0);
  }
  CliResult both = run_cli(
      {"logprobs", "--model", (dir_ / "tiny").string(), "--text", "a", "--input", "x.jsonl"});
  EXPECT_EQ(both.exit_code, 2);
}

// Tables fit the terminal: cells of the widest columns wrap; columns are dropped (and named)
// only when wrapping cannot make the table fit.
TEST(Checks, TablesFitTheTerminalWidth) {
  cli::TextTable t({"role", "device", "environment"});
  t.add({"actor", "cuda:0", "OMP_NUM_THREADS=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"});
  t.add({"rollout", "cuda:1", "OMP_NUM_THREADS=1"});
  const std::string whole = t.str(0);
  EXPECT_TRUE(contains(whole, "expandable_segments:True")) << whole;
  for (size_t width : {60, 40, 30}) {
    const std::string fitted = t.str(width);
    std::istringstream lines(fitted);
    for (std::string line; std::getline(lines, line);)
      if (line.rfind("(", 0) != 0) {
        EXPECT_LE(line.size(), width) << "\n" << fitted;
      }
    EXPECT_TRUE(contains(fitted, "rollout")) << fitted;
  }
  // Wrapped, nothing lost at 40 columns.
  std::string joined;
  for (char c : t.str(40))
    if (c != '\n' && c != ' ') joined += c;
  EXPECT_TRUE(contains(joined, "PYTORCH_CUDA_ALLOC_CONF")) << t.str(40);
  // Too narrow for three columns of at least 8: the last is dropped and named.
  const std::string narrow = t.str(20);
  EXPECT_TRUE(contains(narrow, "1 column not shown for a 20-column terminal: environment"))
      << narrow;
  // The CLI reads $COLUMNS.
  ::setenv("COLUMNS", "50", 1);
  CliResult plan =
      run_cli({"plan", "examples/ppo_8gpu.json", "--set", "actor.model=preset:llama-3-8b", "--set",
               "critic.model=preset:llama-3-8b", "--set", "reward.model=preset:llama-3-8b"});
  ::unsetenv("COLUMNS");
  ASSERT_EQ(plan.exit_code, 0) << plan.err;
  const auto rule = plan.out.find("----");
  ASSERT_NE(rule, std::string::npos) << plan.out;
  const auto line_start = plan.out.rfind('\n', rule) + 1;
  EXPECT_LE(plan.out.find('\n', rule) - line_start, 50u) << plan.out;
}

}  // namespace
}  // namespace rlhf::test
