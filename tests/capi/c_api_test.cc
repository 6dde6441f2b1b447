// Runs the C checks of strata/c.h against a real stratad.
#include <gtest/gtest.h>

#include "c_api_checks.h"
#include "tests/integration/daemon_process.h"

namespace {

class CApiTest : public ::testing::Test {
 protected:
  strata::testing::DaemonProcess daemon_;
  char failure_[512] = {0};
};

TEST_F(CApiTest, PublishLookupFetchPinEvict) {
  ASSERT_FALSE(daemon_.endpoint().empty());
  EXPECT_EQ(CheckRoundTrip(daemon_.endpoint().c_str(), failure_, sizeof failure_), 0) << failure_;
}

TEST_F(CApiTest, ErrorsAreCodesAndMessages) {
  ASSERT_FALSE(daemon_.endpoint().empty());
  EXPECT_EQ(CheckErrors(daemon_.endpoint().c_str(), failure_, sizeof failure_), 0) << failure_;
}

TEST_F(CApiTest, VllmIdScheme) {
  ASSERT_FALSE(daemon_.endpoint().empty());
  EXPECT_EQ(CheckVllmScheme(daemon_.endpoint().c_str(), failure_, sizeof failure_), 0) << failure_;
}

}  // namespace
