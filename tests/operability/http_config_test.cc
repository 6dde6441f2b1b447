// The 'http_listen' config field: default off, accepted as HOST:PORT, refused naming the field.
#include <gtest/gtest.h>

#include "config/daemon_config.h"

namespace strata {
namespace {

TEST(HttpConfigTest, DefaultIsOffAndHostPortIsAccepted) {
  auto d = ParseConfig("");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->http_listen, "");
  auto c = ParseConfig("http_listen: \"0.0.0.0:9420\"\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->http_listen, "0.0.0.0:9420");
}

TEST(HttpConfigTest, MalformedAddressNamesTheField) {
  for (const char* bad :
       {"http_listen: nonsense\n", "http_listen: \"127.0.0.1:\"\n", "http_listen: \":9420\"\n"}) {
    auto c = ParseConfig(bad);
    ASSERT_FALSE(c.ok()) << bad;
    EXPECT_NE(std::string(c.status().message()).find("http_listen"), std::string::npos)
        << c.status();
  }
}

}  // namespace
}  // namespace strata
