#include <gtest/gtest.h>

#include "config/daemon_config.h"

namespace strata {
namespace {

TEST(ConfigTest, EmbeddedDefaultParsesAndValidates) {
  auto c = ParseConfig("");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->listen, "127.0.0.1:7420");
  EXPECT_EQ(c->host.capacity, 1ull << 30);
  EXPECT_EQ(c->host.reservation_timeout, absl::Seconds(30));
  EXPECT_TRUE(ValidateConfig(*c).ok());
  // The text printed by --print-default-config is itself a valid config file.
  auto again = ParseConfig(DefaultConfigYaml());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->host.capacity, c->host.capacity);
}

TEST(ConfigTest, FieldsOverrideDefaults) {
  auto c =
      ParseConfig("host_tier:\n  capacity: 2GiB\n  low_watermark: 0.5\nlease_timeout: 250ms\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->host.capacity, 2ull << 30);
  EXPECT_DOUBLE_EQ(c->host.low_watermark, 0.5);
  EXPECT_DOUBLE_EQ(c->host.high_watermark, 0.95);  // untouched default
  EXPECT_EQ(c->host.lease_timeout, absl::Milliseconds(250));
}

TEST(ConfigTest, BusyPollIsBounded) {
  auto c = ParseConfig("busy_poll: 0s\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->busy_poll, absl::ZeroDuration());
  EXPECT_TRUE(ValidateConfig(*c).ok());
  EXPECT_EQ(ParseConfig("")->busy_poll, absl::Microseconds(50));
  auto too_long = ParseConfig("busy_poll: 1s\n");
  ASSERT_FALSE(too_long.ok());
  EXPECT_NE(too_long.status().message().find("busy_poll"), std::string::npos)
      << too_long.status();
}

TEST(ConfigTest, DataPlaneWorkersAreBounded) {
  auto defaults = ParseConfig("");
  ASSERT_TRUE(defaults.ok()) << defaults.status();
  EXPECT_EQ(defaults->data_plane_workers, 0u);  // automatic
  auto c = ParseConfig("data_plane_workers: 3\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->data_plane_workers, 3u);
  EXPECT_TRUE(ValidateConfig(*c).ok());
  auto many = ParseConfig("data_plane_workers: 65\n");
  absl::Status refused = many.ok() ? ValidateConfig(*many) : many.status();
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find("data_plane_workers"), std::string::npos) << refused;
  EXPECT_FALSE(ParseConfig("data_plane_workers: -1\n").ok());
}

// Found by tests/fuzz/config_fuzzer (corpus/config/crash-null-key): keys that are not text used
// to throw out of ParseConfig and terminate stratad.
TEST(ConfigTest, KeysThatAreNotTextAreRefused) {
  for (const char* yaml : {"?\n:", "? [a, b]\n: 1\n", "host_tier:\n  ? {a: 1}\n  : 2\n",
                           "nvme:\n  files:\n    - ? \n      : x\n"}) {
    auto c = ParseConfig(yaml);
    ASSERT_FALSE(c.ok()) << yaml;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << yaml;
    EXPECT_NE(c.status().message().find("key that is not text"), std::string::npos)
        << c.status();
  }
}

TEST(ConfigTest, ErrorsNameTheField) {
  struct Case {
    const char* yaml;
    const char* field;
  };
  for (const Case& k :
       {Case{"host_tier:\n  capacity: 12 parsecs\n", "'host_tier.capacity'"},
        Case{"host_tier:\n  arena: gpu\n", "'host_tier.arena'"},
        Case{"nvme_tier:\n  capacity: 1GiB\n", "'nvme_tier'"},
        Case{"reservation_timeout: 10ms\n", "'reservation_timeout'"},
        Case{"max_pin_ttl: 0s\n", "'max_pin_ttl'"},
        Case{"max_pin_ttl: 500ms\n", "'max_pin_ttl'"},
        Case{"listen: nowhere\n", "'listen'"},
        Case{"host_tier:\n  huge_pages: maybe\n", "'host_tier.huge_pages'"},
        Case{"log_format: xml\n", "'log_format'"},
        Case{"host_tier:\n  policy: fifo\n", "'host_tier.policy'"},
        Case{"nvme:\n  policy: belady\n", "'nvme.policy'"},
        Case{"nvme:\n  admission: sometimes\n", "'nvme.admission'"},
        Case{"nvme:\n  queue_depth: 0\n", "'nvme.queue_depth'"},
        Case{"nvme:\n  low_watermark: 0.99\n", "'nvme.low_watermark'"},
        Case{"nvme:\n  sync_after_write: often\n", "'nvme.sync_after_write'"},
        Case{"nvme:\n  files: /dev/nvme0\n", "'nvme.files'"},
        Case{"nvme:\n  files:\n    - /dev/nvme0\n", "'nvme.files[0]'"},
        Case{"nvme:\n  files:\n    - {path: /a, capacity: 1GiB}\n"
             "    - {path: /b, capacity: lots}\n",
             "'nvme.files[1].capacity'"},
        Case{"nvme:\n  files:\n    - {path: /a}\n", "'nvme.files[0].capacity'"},
        Case{"nvme:\n  files:\n    - {capacity: 1GiB}\n", "'nvme.files[0].path'"},
        Case{"nvme:\n  files:\n    - {path: /a, capacity: 1KiB}\n", "'nvme.files[0].capacity'"},
        Case{"nvme:\n  files:\n    - {path: /a, capacity: 1GiB, mode: raw}\n",
             "'nvme.files[0].mode'"},
        Case{"nvme:\n  files:\n    - {path: /a, capacity: 1GiB}\n"
             "    - {path: /a, capacity: 1GiB}\n",
             "'nvme.files[1].path'"},
        Case{"cluster:\n  membership: zookeeper\n", "'cluster.membership'"},
        Case{"cluster:\n  static_nodes: [\"n1-no-address\"]\n", "'cluster.static_nodes[0]'"},
        Case{"cluster:\n  static_nodes: [\"a@h:1\", \"a@h:2\"]\n", "'cluster.static_nodes[1]'"},
        Case{"cluster:\n  etcd_endpoints: [\"https://x:2379\"]\n", "'cluster.etcd_endpoints[0]'"},
        Case{"cluster:\n  membership: etcd\n  etcd_endpoints: []\n", "'cluster.etcd_endpoints'"},
        Case{"cluster:\n  replicas: 0\n", "'cluster.replicas'"},
        Case{"cluster:\n  directory_owners: 9\n", "'cluster.directory_owners'"},
        Case{"cluster:\n  peer_timeout: 1ms\n", "'cluster.peer_timeout'"},
        Case{"cluster:\n  advertise_address: nowhere\n", "'cluster.advertise_address'"},
        Case{"cluster:\n  rereplicate: sometimes\n", "'cluster.rereplicate'"},
        Case{"limits:\n  tenant_max_share: 0\n", "'limits.tenant_max_share'"},
        Case{"limits:\n  tenant_max_share: 1.01\n", "'limits.tenant_max_share'"},
        Case{"limits:\n  tenant_max_share: half\n", "'limits.tenant_max_share'"},
        Case{"limits:\n  tenant_max_reserved_bytes: lots\n", "'limits.tenant_max_reserved_bytes'"},
        Case{"host_tier:\n  capacity: 64MiB\nlimits:\n  tenant_max_reserved_bytes: 65MiB\n",
             "'limits.tenant_max_reserved_bytes'"}}) {
    auto c = ParseConfig(k.yaml);
    ASSERT_FALSE(c.ok()) << k.yaml;
    EXPECT_NE(c.status().message().find(k.field), std::string::npos) << c.status();
  }
  EXPECT_FALSE(ParseConfig("[not, a, mapping]").ok());
  EXPECT_FALSE(ParseConfig("host_tier: {capacity: 1GiB").ok());  // not YAML
}

TEST(ConfigTest, ClusterSectionParses) {
  auto d = ParseConfig("");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->cluster.membership, "static");
  EXPECT_TRUE(d->cluster.static_nodes.empty());
  EXPECT_EQ(d->cluster.replicas, 1u);
  auto c = ParseConfig(
      "cluster:\n  membership: etcd\n  etcd_endpoints: [\"http://e1:2379\", \"http://e2:2379\"]\n"
      "  static_nodes: [\"n1@10.0.0.1:7420\"]\n  replicas: 2\n  directory_ttl: 90s\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->cluster.membership, "etcd");
  ASSERT_EQ(c->cluster.etcd_endpoints.size(), 2u);
  ASSERT_EQ(c->cluster.static_nodes.size(), 1u);
  EXPECT_EQ(c->cluster.static_nodes[0].id, "n1");
  EXPECT_EQ(c->cluster.static_nodes[0].address, "10.0.0.1:7420");
  EXPECT_EQ(c->cluster.replicas, 2u);
  EXPECT_EQ(c->cluster.directory_ttl, absl::Seconds(90));
}

TEST(ConfigTest, NvmeSectionDefaultsToNoTier) {
  auto c = ParseConfig("");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->nvme.files.empty());
  EXPECT_EQ(c->host.policy, "lru");
  EXPECT_EQ(c->nvme.policy, "lru");
  EXPECT_EQ(c->nvme.admission, "always");
  EXPECT_EQ(c->nvme.queue_depth, 32u);
  EXPECT_TRUE(c->nvme.sync_after_write);
  EXPECT_DOUBLE_EQ(c->nvme.high_watermark, 0.95);
  EXPECT_DOUBLE_EQ(c->nvme.low_watermark, 0.85);
  EXPECT_EQ(c->nvme.catalog_dir, "");
}

// The watermark defaults come from storage/watermarks.h alone: the embedded YAML, the config
// structs and the tiers' own options all agree with it.
TEST(ConfigTest, WatermarkDefaultsAreTheTiersDefaults) {
  auto c = ParseConfig("");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->host.high_watermark, kDefaultHighWatermark);
  EXPECT_EQ(c->host.low_watermark, kDefaultLowWatermark);
  EXPECT_EQ(c->nvme.high_watermark, kDefaultHighWatermark);
  EXPECT_EQ(c->nvme.low_watermark, kDefaultLowWatermark);
  const DaemonConfig blank;
  EXPECT_EQ(blank.host.high_watermark, kDefaultHighWatermark);
  EXPECT_EQ(blank.nvme.low_watermark, kDefaultLowWatermark);
  EXPECT_EQ(DefaultConfigYaml().find("{high_watermark}"), std::string_view::npos);
  EXPECT_EQ(DefaultConfigYaml().find("{low_watermark}"), std::string_view::npos);
}

TEST(ConfigTest, NvmeCatalogDirDefaultsUnderDataDir) {
  auto c = ParseConfig("data_dir: /srv/strata\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(NvmeCatalogDir(*c), "/srv/strata/nvme-catalog");
  c->nvme.catalog_dir = "/fast/catalog";
  EXPECT_EQ(NvmeCatalogDir(*c), "/fast/catalog");
}

TEST(ConfigTest, NvmeSectionParses) {
  auto c = ParseConfig(
      "host_tier:\n  policy: prefix-adaptive\n"
      "nvme:\n"
      "  files:\n"
      "    - {path: /mnt/a/strata.tier, capacity: 2GiB}\n"
      "    - path: /mnt/b/strata.tier\n"
      "      capacity: 512MiB\n"
      "  catalog_dir: /var/lib/strata/cat\n"
      "  high_watermark: 0.9\n  low_watermark: 0.7\n"
      "  policy: s3fifo\n  admission: second-access\n"
      "  queue_depth: 64\n  sync_after_write: false\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->host.policy, "prefix-adaptive");
  ASSERT_EQ(c->nvme.files.size(), 2u);
  EXPECT_EQ(c->nvme.files[0].path, "/mnt/a/strata.tier");
  EXPECT_EQ(c->nvme.files[0].capacity, 2ull << 30);
  EXPECT_EQ(c->nvme.files[1].path, "/mnt/b/strata.tier");
  EXPECT_EQ(c->nvme.files[1].capacity, 512ull << 20);
  EXPECT_EQ(c->nvme.catalog_dir, "/var/lib/strata/cat");
  EXPECT_DOUBLE_EQ(c->nvme.high_watermark, 0.9);
  EXPECT_DOUBLE_EQ(c->nvme.low_watermark, 0.7);
  EXPECT_EQ(c->nvme.policy, "s3fifo");
  EXPECT_EQ(c->nvme.admission, "second-access");
  EXPECT_EQ(c->nvme.queue_depth, 64u);
  EXPECT_FALSE(c->nvme.sync_after_write);
  // An explicit empty list is no NVMe tier.
  auto none = ParseConfig("nvme:\n  files: []\n");
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->nvme.files.empty());
}

// The 'http_listen' field: default off, accepted as HOST:PORT, refused naming the field.
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

TEST(AuthConfigTest, NonLoopbackListenNeedsTokensOrInsecure) {
  for (const char* loopback :
       {"127.0.0.1:7420", "127.3.2.1:0", "[::1]:7420", "localhost:7420", "unix:/tmp/strata.sock"}) {
    EXPECT_TRUE(IsLoopbackListen(loopback)) << loopback;
    EXPECT_TRUE(ParseConfig(std::string("listen: \"") + loopback + "\"\n").ok()) << loopback;
  }
  for (const char* open : {"0.0.0.0:7420", "[::]:7420", "10.1.2.3:7420", "node-1:7420"}) {
    EXPECT_FALSE(IsLoopbackListen(open)) << open;
    auto refused = ParseConfig(std::string("listen: \"") + open + "\"\n");
    ASSERT_FALSE(refused.ok()) << open;
    EXPECT_NE(refused.status().message().find("'listen'"), std::string::npos);
    EXPECT_NE(refused.status().message().find("insecure"), std::string::npos);
    EXPECT_TRUE(ParseConfig(std::string("listen: \"") + open + "\"\ninsecure: true\n").ok());
    auto with_auth = ParseConfig(std::string("listen: \"") + open +
                                 "\"\nauth:\n  tokens_file: /etc/strata/tokens\n"
                                 "  peer_token_file: /etc/strata/peer\n");
    ASSERT_TRUE(with_auth.ok()) << with_auth.status();
    EXPECT_EQ(with_auth->auth.tokens_file, "/etc/strata/tokens");
    EXPECT_EQ(with_auth->auth.peer_token_file, "/etc/strata/peer");
    EXPECT_FALSE(with_auth->insecure);
  }
}

TEST(TlsConfigTest, OffByDefaultAndFieldsThatNeedEachOtherAreNamed) {
  auto d = ParseConfig("");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_FALSE(d->tls.enabled());
  EXPECT_TRUE(d->tls.client_ca_file.empty());
  EXPECT_FALSE(d->tls.require_client_cert);

  auto full = ParseConfig(
      "tls:\n  cert_file: /c.pem\n  key_file: /k.pem\n  client_ca_file: /ca.pem\n"
      "  require_client_cert: true\n  peer_ca_file: /peer.pem\n"
      "  peer_server_name: strata.svc\n"
      "cluster:\n  static_nodes: [\"n1@10.0.0.2:7420\"]\n");
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_TRUE(full->tls.enabled());
  EXPECT_EQ(full->tls.cert_file, "/c.pem");
  EXPECT_EQ(full->tls.key_file, "/k.pem");
  EXPECT_EQ(full->tls.client_ca_file, "/ca.pem");
  EXPECT_TRUE(full->tls.require_client_cert);
  EXPECT_EQ(full->tls.peer_ca_file, "/peer.pem");
  EXPECT_EQ(full->tls.peer_server_name, "strata.svc");

  const std::pair<const char*, const char*> bad[] = {
      {"tls:\n  cert_file: /c.pem\n", "tls.cert_file"},
      {"tls:\n  key_file: /k.pem\n", "tls.key_file"},
      {"tls:\n  client_ca_file: /ca.pem\n", "tls.client_ca_file"},
      {"tls:\n  cert_file: /c.pem\n  key_file: /k.pem\n  require_client_cert: true\n",
       "tls.require_client_cert"},
      {"tls:\n  peer_server_name: x\n", "tls.peer_server_name"},
      {"tls:\n  cert_file: /c.pem\n  key_file: /k.pem\n"
       "cluster:\n  static_nodes: [\"n1@10.0.0.2:7420\"]\n",
       "tls.peer_ca_file"},
      {"tls:\n  require_client_cert: maybe\n", "tls.require_client_cert"},
      {"tls:\n  ca_file: /ca.pem\n", "tls.ca_file"},
  };
  for (const auto& [yaml, field] : bad) {
    auto c = ParseConfig(yaml);
    ASSERT_FALSE(c.ok()) << yaml;
    EXPECT_NE(c.status().message().find(std::string("'") + field + "'"), std::string::npos)
        << yaml << " -> " << c.status();
  }
}

}  // namespace
}  // namespace strata
