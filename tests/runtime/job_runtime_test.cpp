// The job runtime's own rules (runtime/job_runtime.h): what it reads of the spec, the logging
// and checkpoint schedule both drivers follow, and its console numbers. Starting roles, saving,
// resuming and exporting through it run end to end in the ppo and dpo job tests
// (tests/ppo/ppo_job_test.cpp, tests/dpo/dpo_job_test.cpp: "resumed", export loaded back).
#include "runtime/job_runtime.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "report/metrics.h"

namespace {

namespace fs = std::filesystem;

rlhf::JobSpec spec(const std::vector<std::string>& sets = {}) {
  const std::string text = R"({"kind": "sft", "name": "rt",
      "logger": {"run_dir": "/tmp/rlhf-runtime-test"},
      "actor": {"model": "preset:tiny"},
      "data": {"dataset": "synthetic:letters"},
      "train": {"batch_size": 4, "micro_batch_size": 2}})";
  return rlhf::JobSpec::parse(text, "test spec", sets);
}

TEST(RuntimeSettings, ReadsTheRunDirectoryCheckpointAndLoggingKeys) {
  const auto s = rlhf::runtime::RuntimeSettings::from_spec(spec(), "sft");
  EXPECT_EQ(s.kind, "sft");
  EXPECT_EQ(s.run_dir, "/tmp/rlhf-runtime-test/rt");
  // ckpt.path "" (the default) is the run directory's ckpt/.
  EXPECT_EQ(s.ckpt_path, "/tmp/rlhf-runtime-test/rt/ckpt");
  EXPECT_TRUE(s.export_hf);
  EXPECT_FALSE(s.save_only_model);
  EXPECT_TRUE(s.trajectory_settings.is_object());
  EXPECT_FALSE(s.trajectory_settings.empty());

  const auto set = rlhf::runtime::RuntimeSettings::from_spec(
      spec({"ckpt.path=/tmp/elsewhere", "ckpt.save_steps=5", "ckpt.max_num=2",
            "ckpt.export_hf=false", "logger.logging_steps=3"}),
      "ppo");
  EXPECT_EQ(set.ckpt_path, "/tmp/elsewhere");
  EXPECT_EQ(set.save_steps, 5);
  EXPECT_EQ(set.max_ckpt, 2);
  EXPECT_FALSE(set.export_hf);
  EXPECT_EQ(set.logging_steps, 3);
}

// Every logger.logging_steps and at the last step; every ckpt.save_steps and always after the
// last step (a finished run can be resumed with more steps).
TEST(JobRuntime, LogsAndSavesOnTheirScheduleAndAlwaysAtTheLastStep) {
  const rlhf::runtime::JobRuntime every3(rlhf::runtime::RuntimeSettings::from_spec(
      spec({"ckpt.save_steps=4", "logger.logging_steps=3"}), "sft"));
  std::vector<int64_t> logged, saved;
  for (int64_t step = 1; step <= 10; ++step) {
    if (every3.logs_at(step, 10)) logged.push_back(step);
    if (every3.saves_at(step, 10)) saved.push_back(step);
  }
  EXPECT_EQ(logged, (std::vector<int64_t>{3, 6, 9, 10}));
  EXPECT_EQ(saved, (std::vector<int64_t>{4, 8, 10}));

  // ckpt.save_steps -1 (the default): only the last step.
  const rlhf::runtime::JobRuntime last(rlhf::runtime::RuntimeSettings::from_spec(spec(), "sft"));
  saved.clear();
  for (int64_t step = 1; step <= 5; ++step)
    if (last.saves_at(step, 5)) saved.push_back(step);
  EXPECT_EQ(saved, (std::vector<int64_t>{5}));
}

TEST(JobRuntime, MetricsNeedOpening) {
  rlhf::runtime::JobRuntime rt(rlhf::runtime::RuntimeSettings::from_spec(spec(), "sft"));
  EXPECT_THROW(rt.metrics(), std::logic_error);
  fs::remove_all("/tmp/rlhf-runtime-test/rt");
  fs::create_directories("/tmp/rlhf-runtime-test/rt");
  auto& sink = rt.open_metrics();
  EXPECT_EQ(sink.path(), "/tmp/rlhf-runtime-test/rt/metrics.jsonl");
  EXPECT_EQ(&rt.metrics(), &sink);
}

TEST(Console, FixedKeepsTheStreamFormatAndRounds) {
  EXPECT_EQ(rlhf::runtime::fixed(0.69315), "0.693");
  EXPECT_EQ(rlhf::runtime::fixed(2.25, 1), "2.2");  // round half to even, as printf
  EXPECT_EQ(rlhf::runtime::fixed(1234.5, 0), "1234");
  EXPECT_EQ(rlhf::runtime::fixed(-0.5, 2), "-0.50");
}

}  // namespace
