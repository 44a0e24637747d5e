#include "core/text.h"

#include <gtest/gtest.h>

namespace rlhf {
namespace {

TEST(Text, EditDistanceTable) {
  struct Case {
    const char* a;
    const char* b;
    size_t d;
  };
  const Case cases[] = {{"", "", 0},       {"abc", "abc", 0},
                        {"abc", "abd", 1}, {"kitten", "sitting", 3},
                        {"", "xyz", 3},    {"batch_size", "bach_size", 1}};
  for (const auto& c : cases) EXPECT_EQ(edit_distance(c.a, c.b), c.d) << c.a << " vs " << c.b;
}

TEST(Text, ClosestMatchFindsTypoAndRejectsFarWords) {
  std::vector<std::string> keys = {"rollout.batch_size", "rollout.n_samples_per_prompt"};
  EXPECT_EQ(closest_match("rollout.n_sample_per_prompt", keys), "rollout.n_samples_per_prompt");
  EXPECT_EQ(closest_match("zzzzzzzzzzzz", keys), "");
}

TEST(Text, LineColAndBytes) {
  auto lc = line_col("ab\ncd\nef", 4);
  EXPECT_EQ(lc.line, 2u);
  EXPECT_EQ(lc.column, 2u);
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_bytes(3.0 * (1ull << 30)), "3.00 GiB");
}

TEST(Text, SplitNamesDropsSpacesAndEmptyEntries) {
  using V = std::vector<std::string>;
  EXPECT_EQ(split_names("q_proj, v_proj"), (V{"q_proj", "v_proj"}));
  EXPECT_EQ(split_names(" all-linear "), (V{"all-linear"}));
  EXPECT_EQ(split_names(",a,,b ,"), (V{"a", "b"}));
  EXPECT_EQ(split_names(""), V{});
}

TEST(Text, EndsWithTable) {
  struct Case {
    const char* s;
    const char* suffix;
    bool ends;
  };
  const Case cases[] = {{"model.norm.weight", "norm.weight", true},
                        {"q_proj.bias", ".bias", true},
                        {"bias", ".bias", false},  // shorter than the suffix
                        {"q_proj.bias.x", ".bias", false},
                        {"anything", "", true},
                        {"", "", true},
                        {"", "a", false}};
  for (const auto& c : cases)
    EXPECT_EQ(ends_with(c.s, c.suffix), c.ends) << c.s << " / " << c.suffix;
}

}  // namespace
}  // namespace rlhf
