// The process-level helpers of core: host_name() against the kernel's own record of the
// name, seconds_since() against a known interval.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "core/host.h"
#include "core/text.h"
#include "core/timing.h"

namespace rlhf {
namespace {

TEST(Host, NameIsTheKernelsNodeName) {
  // gethostname(2) returns the UTS node name, which Linux also shows in this file.
  std::ifstream in("/proc/sys/kernel/hostname");
  std::string expected;
  ASSERT_TRUE(std::getline(in, expected)) << "cannot read /proc/sys/kernel/hostname";
  const auto name = host_name();
  ASSERT_TRUE(name.has_value());
  EXPECT_EQ(*name, trim(expected));
  EXPECT_FALSE(name->empty());
}

TEST(Timing, SecondsSinceAPointTwoSecondsAgo) {
  // No sleep: the start is placed 2 s in the past. Upper bound 2.5 s: the call itself takes
  // microseconds, so only a descheduled test process could exceed it.
  const double s = seconds_since(std::chrono::steady_clock::now() - std::chrono::seconds(2));
  EXPECT_GE(s, 2.0);
  EXPECT_LT(s, 2.5);
  EXPECT_LT(seconds_since(std::chrono::steady_clock::now()), 0.5);
}

}  // namespace
}  // namespace rlhf
