// Issue 28's per-phase check on a finished run: `rlhf plan --check RUN_DIR --json`, and each
// phase's planned tracked bytes (plan.json's engine_phases) against the largest
// tensor_phases peak the workers measured over that phase's operations.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "tests/support/run_cli.h"

namespace rlhf::test {

// The whole-run tolerance of the tracked peak elsewhere (tests/cli/sweep_test.cpp: 1%); the
// planner replays the engine's allocations, so on the CPU machine they match to the byte.
inline constexpr double kTrackedPhaseTolerance = 0.01;

// Asserts every measured phase of every model rank is within kTrackedPhaseTolerance and
// returns the phases compared, per role ({"actor": {"load", "score", ...}, ...}).
inline std::map<std::string, std::set<std::string>> expect_tracked_phases_match(
    const std::string& run_dir) {
  std::map<std::string, std::set<std::string>> compared;
  const CliResult check = run_cli({"plan", "--check", run_dir, "--json"});
  EXPECT_EQ(check.exit_code, 0) << check.err;
  if (check.exit_code != 0) return compared;
  for (const auto& row : nlohmann::json::parse(check.out)) {
    const std::string role = row["role"].get<std::string>();
    for (const auto& p : row["tensor_phases"]) {
      if (p["measured_tensor"].get<int64_t>() < 0) continue;
      compared[role].insert(p["phase"].get<std::string>());
      EXPECT_GT(p["planned_tensor"].get<int64_t>(), 0) << role << " " << p.dump();
      EXPECT_LE(std::abs(p["error"].get<double>()), kTrackedPhaseTolerance)
          << role << " rank " << row["rank"] << " " << p.dump();
    }
  }
  return compared;
}

}  // namespace rlhf::test
