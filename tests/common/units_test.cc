#include "common/units.h"

#include <gtest/gtest.h>

namespace strata {
namespace {

TEST(UnitsTest, Sizes) {
  EXPECT_EQ(*ParseSize("4096"), 4096u);
  EXPECT_EQ(*ParseSize("64KiB"), 65536u);
  EXPECT_EQ(*ParseSize("1.5 GiB"), 1610612736u);
  EXPECT_EQ(*ParseSize("2G"), 2000000000u);
  EXPECT_FALSE(ParseSize("lots").ok());
  EXPECT_FALSE(ParseSize("12 parsecs").ok());
  EXPECT_EQ(FormatSize(1536), "1.5KiB");
}

TEST(UnitsTest, Durations) {
  EXPECT_EQ(*ParseDurationText("30s"), absl::Seconds(30));
  EXPECT_EQ(*ParseDurationText("250ms"), absl::Milliseconds(250));
  EXPECT_FALSE(ParseDurationText("soon").ok());
  EXPECT_FALSE(ParseDurationText("-1s").ok());
}

}  // namespace
}  // namespace strata
