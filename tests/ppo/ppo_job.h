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

}  // namespace rlhf::ppo::job_test
