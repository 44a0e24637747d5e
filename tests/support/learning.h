// Whether a job learned, read from its metrics.jsonl records: the criterion every job test on
// the letters task (ppo_tiny, grpo_tiny and their variants, on CPU, GPU or Slurm) shares.
#pragma once

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <vector>

namespace rlhf::test {

// The mean reward_mean of the first 5 and of the last 5 records (needs >= 5 records).
struct RewardEnds {
  double first = 0.0;
  double last = 0.0;
};
inline RewardEnds reward_ends(const std::vector<nlohmann::json>& metrics) {
  RewardEnds ends;
  for (size_t i = 0; i < 5; ++i) {
    ends.first += metrics[i]["reward_mean"].get<double>() / 5;
    ends.last += metrics[metrics.size() - 1 - i]["reward_mean"].get<double>() / 5;
  }
  return ends;
}

// The run of `metrics` (at least 10 steps) learned: the last 5 steps' mean reward exceeds the
// first 5 steps' by more than `margin` (default 0.1, for the letters task). Without learning,
// a 5-step mean of reward means has a standard deviation of ~0.006 there (per-sample std ~0.1
// over 5 x 64 samples); the CPU runs move it by ~0.4.
inline void expect_learned(const std::vector<nlohmann::json>& metrics, double margin = 0.1) {
  ASSERT_GE(metrics.size(), 10u) << "too few steps logged to tell whether the job learned";
  const RewardEnds ends = reward_ends(metrics);
  EXPECT_GT(ends.last - ends.first, margin)
      << "first 5 steps " << ends.first << ", last 5 steps " << ends.last;
}

}  // namespace rlhf::test
