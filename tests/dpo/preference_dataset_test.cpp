// Offline datasets: JSONL preference and SFT rows with line-numbered errors, the skip
// policy, synthetic datasets, and truncation that keeps the prompt.
#include "dpo/preference_dataset.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/errors.h"

namespace rlhf::dpo {
namespace {

std::string temp_file(const std::string& name, const std::string& text) {
  auto dir =
      std::filesystem::temp_directory_path() / ("rlhf-dpo-test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::string path = (dir / name).string();
  std::ofstream(path) << text;
  return path;
}

TEST(PreferenceDataset, ReadsConfiguredKeys) {
  OfflineDataConfig c;
  c.source = temp_file("p.jsonl", "{\"q\": \"hi\", \"good\": \"a\", \"bad\": \"b\"}\n");
  c.prompt_key = "q";
  c.chosen_key = "good";
  c.rejected_key = "bad";
  auto ds = load_preferences(c);
  ASSERT_EQ(ds.rows.size(), 1u);
  EXPECT_EQ(ds.rows[0].prompt, "hi");
  EXPECT_EQ(ds.rows[0].chosen, "a");
  EXPECT_EQ(ds.rows[0].rejected, "b");
  EXPECT_EQ(ds.rows[0].line, 1);
}

TEST(PreferenceDataset, BadLineFatalNamesFileLineAndKey) {
  OfflineDataConfig c;
  c.source = temp_file("bad.jsonl",
                       "{\"prompt\": \"p\", \"chosen\": \"a\", \"rejected\": \"b\"}\n"
                       "{\"prompt\": \"p\", \"chosen\": \"a\"}\n");
  try {
    load_preferences(c);
    FAIL() << "accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(c.source + ":2: missing key \"rejected\""),
              std::string::npos)
        << e.what();
  }
  c.bad_lines = BadLinePolicy::kSkip;
  auto ds = load_preferences(c);
  EXPECT_EQ(ds.rows.size(), 1u);
  EXPECT_EQ(ds.stats.skipped, 1);
}

TEST(UnpairedDataset, ReadsLabelsAndNamesFileLineOfABadOne) {
  OfflineDataConfig c;
  c.source = temp_file("kto.jsonl",
                       "{\"prompt\": \"p\", \"output\": \"a\", \"label\": true}\n"
                       "{\"prompt\": \"q\", \"output\": \"b\", \"label\": 0}\n"
                       "{\"prompt\": \"r\", \"output\": \"c\", \"label\": \"yes\"}\n");
  try {
    load_unpaired(c);
    FAIL() << "accepted a string label";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(c.source + ":3: expected true or false"),
              std::string::npos)
        << e.what();
  }
  c.bad_lines = BadLinePolicy::kSkip;
  auto ds = load_unpaired(c);
  ASSERT_EQ(ds.rows.size(), 2u);
  EXPECT_EQ(ds.rows[0].output, "a");
  EXPECT_TRUE(ds.rows[0].desirable);
  EXPECT_FALSE(ds.rows[1].desirable);
  EXPECT_EQ(ds.rows[1].line, 2);
}

TEST(UnpairedDataset, SyntheticSplitsEachPairIntoADesirableAndAnUndesirableRow) {
  OfflineDataConfig c;
  c.source = "synthetic:preferences";
  c.max_samples = 6;
  auto ds = load_unpaired(c);
  auto pairs = synthetic_preferences("preferences", 3, c.seed);
  ASSERT_EQ(ds.rows.size(), 6u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(ds.rows[2 * i].output, pairs[i].chosen);
    EXPECT_TRUE(ds.rows[2 * i].desirable);
    EXPECT_EQ(ds.rows[2 * i + 1].output, pairs[i].rejected);
    EXPECT_FALSE(ds.rows[2 * i + 1].desirable);
  }
}

TEST(PreferenceDataset, MarginKeyIsReadAndCheckedPerLine) {
  OfflineDataConfig c;
  c.source =
      temp_file("m.jsonl",
                "{\"prompt\": \"p\", \"chosen\": \"a\", \"rejected\": \"b\", \"m\": 0.75}\n"
                "{\"prompt\": \"p\", \"chosen\": \"a\", \"rejected\": \"b\", \"m\": \"x\"}\n");
  c.margin_key = "m";
  c.bad_lines = BadLinePolicy::kSkip;
  auto ds = load_preferences(c);
  ASSERT_EQ(ds.rows.size(), 1u);
  EXPECT_EQ(ds.rows[0].margin, 0.75);
  EXPECT_EQ(ds.stats.skipped, 1);
  EXPECT_NE(ds.stats.first_problem.find(":2:"), std::string::npos) << ds.stats.first_problem;
  c.margin_key.clear();  // without the key, margins are 0 and the field is ignored
  auto plain = load_preferences(c);
  ASSERT_EQ(plain.rows.size(), 2u);
  EXPECT_EQ(plain.rows[0].margin, 0.0);
}

TEST(PreferenceDataset, SyntheticPairsPreferLowercase) {
  auto rows = synthetic_preferences("preferences", 50, 3);
  ASSERT_EQ(rows.size(), 50u);
  for (const auto& r : rows) {
    for (char ch : r.chosen) EXPECT_TRUE(ch >= 'a' && ch <= 'z') << r.chosen;
    for (char ch : r.rejected) EXPECT_FALSE(ch >= 'a' && ch <= 'z') << r.rejected;
    EXPECT_EQ(r.prompt.back(), ':');
  }
  EXPECT_EQ(synthetic_preferences("preferences", 5, 3)[4].chosen, rows[4].chosen);
  EXPECT_THROW(synthetic_preferences("nope", 1, 1), InputError);
  auto sft = synthetic_sft("letters_sft", 3, 1);
  EXPECT_EQ(sft[0].prompt, sft[0].output + ":");
  // noisy_sft: same words, each character a digit/capital with probability 0.5. Over 400
  // rows (~2200 characters) the noisy share is 0.5 +- 0.011 (1 sd); 0.45-0.55 is 4.5 sd.
  auto noisy = synthetic_sft("noisy_sft", 400, 1);
  int64_t chars = 0, replaced = 0;
  for (const auto& r : noisy) {
    ASSERT_EQ(r.prompt.size(), r.output.size() + 1);
    for (size_t i = 0; i < r.output.size(); ++i) {
      ++chars;
      if (r.output[i] != r.prompt[i]) {
        ++replaced;
        EXPECT_FALSE(r.output[i] >= 'a' && r.output[i] <= 'z') << r.output;
      }
    }
  }
  const double share = static_cast<double>(replaced) / static_cast<double>(chars);
  EXPECT_GT(share, 0.45);
  EXPECT_LT(share, 0.55);
}

TEST(Truncation, KeepsPromptEndThenCutsResponse) {
  std::vector<int64_t> prompt = {1, 2, 3, 4, 5}, response = {6, 7, 8, 9};
  EXPECT_TRUE(truncate_pair(prompt, response, 3, 5));
  EXPECT_EQ(prompt, (std::vector<int64_t>{3, 4, 5}));
  EXPECT_EQ(response, (std::vector<int64_t>{6, 7}));
  std::vector<int64_t> p2 = {1}, r2 = {2, 3};
  EXPECT_FALSE(truncate_pair(p2, r2, 3, 5));
  // With an EOS id, a cut response still ends in EOS (OpenRLHF overwrites the last kept
  // token); an uncut one is left alone.
  std::vector<int64_t> p3 = {1, 2, 3}, r3 = {6, 7, 8, 99};
  EXPECT_TRUE(truncate_pair(p3, r3, 3, 5, /*eos_id=*/99));
  EXPECT_EQ(r3, (std::vector<int64_t>{6, 99}));
  std::vector<int64_t> p4 = {1}, r4 = {2, 99};
  EXPECT_FALSE(truncate_pair(p4, r4, 3, 5, 99));
  EXPECT_EQ(r4, (std::vector<int64_t>{2, 99}));
}

}  // namespace
}  // namespace rlhf::dpo
