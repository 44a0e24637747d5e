// What the end-to-end PPO job tests share: the `rlhf` binary run on ppo_tiny (or another
// example) with a test's tiny models and run directory, and reading its metrics back.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/support/learning.h"
#include "tests/support/run_cli.h"

namespace rlhf::ppo::job_test {

namespace fs = std::filesystem;
using nlohmann::json;

using Result = test::CliResult;

// `rlhf ARGS` (from the source directory, killed after 300 s).
inline Result rlhf(const std::vector<std::string>& args) {
  return test::run_cli(args);
}

inline std::vector<json> read_metrics(const fs::path& file) {
  return test::read_jsonl(file);
}

// A test's common arguments, then one run's own.
inline std::vector<std::string> concat(std::vector<std::string> common,
                                       const std::vector<std::string>& extra) {
  common.insert(common.end(), extra.begin(), extra.end());
  return common;
}

class PpoJob : public testing::Test {
 protected:
  void SetUp() override { dir_ = test::tiny_models_dir("ppo"); }
  // `rlhf run` on ppo_tiny with this test's models and run directory.
  Result run(const std::string& name, std::vector<std::string> extra,
             const std::string& example = "examples/ppo_tiny.json") {
    std::vector<std::string> args = {"run",   example,
                                     "--set", "actor.model=" + (dir_ / "tiny").string(),
                                     "--set", "logger.run_dir=" + (dir_ / "runs").string(),
                                     "--set", "name=" + name};
    if (example == "examples/ppo_tiny.json")
      args.insert(args.end(), {"--set", "critic.model=" + (dir_ / "tiny-value").string()});
    args.insert(args.end(), extra.begin(), extra.end());
    return rlhf(args);
  }
  fs::path run_dir(const std::string& name) const { return dir_ / "runs" / name; }
  fs::path dir_;
};

// Jobs with a teacher (distill_test.cpp, gkd_test.cpp).
class TeacherJob : public PpoJob {
 protected:
  // grpo_tiny with `teacher` on a fourth device, FP32 everywhere (the CPU's auto dtype may be
  // BF16 on another machine), sampled at temperature 1 (what `rlhf logprobs` scores at).
  Result with_teacher(const std::string& name, const fs::path& teacher,
                      const std::vector<std::string>& extra) {
    std::vector<std::string> args = {
        "--set", R"(cluster.nodes=[{"name":"local","kind":"cpu","devices":4,"memory_gb":4}])",
        "--set", "teacher.model=" + teacher.string(),
        "--set", "teacher.devices=[3]",
        "--set", "rollout.temperature=1.0"};
    for (const char* role : {"actor", "ref", "rollout", "teacher"})
      args.insert(args.end(), {"--set", std::string(role) + ".dtype=fp32"});
    return run(name, concat(args, extra), "examples/grpo_tiny.json");
  }
  // `rlhf init-model --preset PRESET` (FP32, seed 5) into this test's directory.
  fs::path init_model(const std::string& preset, const std::string& name) {
    const fs::path out = dir_ / name;
    EXPECT_EQ(rlhf({"init-model", "--preset", preset, "--out", out.string(), "--seed", "5",
                    "--dtype", "fp32"})
                  .exit_code,
              0);
    return out;
  }
};

// The mean of `path` ("reward.letters", "distill.reverse_kl") over records [from, to).
inline double mean_of(const std::vector<json>& m, const json::json_pointer& path, size_t from,
                      size_t to) {
  double sum = 0;
  for (size_t i = from; i < to; ++i) sum += m[i].at(path).get<double>();
  return sum / static_cast<double>(to - from);
}

}  // namespace rlhf::ppo::job_test
