#include "daemon/config.h"

#include <gtest/gtest.h>

namespace strata::daemon {
namespace {

TEST(ConfigTest, EmbeddedDefaultParsesAndValidates) {
  auto c = ParseConfig("");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->listen, "127.0.0.1:7420");
  EXPECT_EQ(c->host_capacity, 1ull << 30);
  EXPECT_EQ(c->reservation_timeout, absl::Seconds(30));
  EXPECT_TRUE(ValidateConfig(*c).ok());
  // The text printed by --print-default-config is itself a valid config file.
  auto again = ParseConfig(kDefaultConfigYaml);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->host_capacity, c->host_capacity);
}

TEST(ConfigTest, FieldsOverrideDefaults) {
  auto c = ParseConfig("host_tier:\n  capacity: 2GiB\n  low_watermark: 0.5\nlease_timeout: 250ms\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->host_capacity, 2ull << 30);
  EXPECT_DOUBLE_EQ(c->low_watermark, 0.5);
  EXPECT_DOUBLE_EQ(c->high_watermark, 0.95);  // untouched default
  EXPECT_EQ(c->lease_timeout, absl::Milliseconds(250));
}

TEST(ConfigTest, ErrorsNameTheField) {
  struct Case {
    const char* yaml;
    const char* field;
  };
  for (const Case& k : {Case{"host_tier:\n  capacity: 12 parsecs\n", "'host_tier.capacity'"},
                        Case{"host_tier:\n  arena: gpu\n", "'host_tier.arena'"},
                        Case{"nvme_tier:\n  capacity: 1GiB\n", "'nvme_tier'"},
                        Case{"reservation_timeout: 10ms\n", "'reservation_timeout'"},
                        Case{"listen: nowhere\n", "'listen'"},
                        Case{"host_tier:\n  huge_pages: maybe\n", "'host_tier.huge_pages'"},
                        Case{"log_format: xml\n", "'log_format'"}}) {
    auto c = ParseConfig(k.yaml);
    ASSERT_FALSE(c.ok()) << k.yaml;
    EXPECT_NE(c.status().message().find(k.field), std::string::npos) << c.status();
  }
  EXPECT_FALSE(ParseConfig("[not, a, mapping]").ok());
  EXPECT_FALSE(ParseConfig("host_tier: {capacity: 1GiB").ok());  // not YAML
}

}  // namespace
}  // namespace strata::daemon
