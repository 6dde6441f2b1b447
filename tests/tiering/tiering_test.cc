// Host tier over NVMe in a real stratad: demotion instead of dropping, promotion on fetch,
// recovery after SIGTERM and kill -9, CRC failures on the tier file, a full NVMe tier.
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <random>
#include <thread>

#include "storage/catalog.h"
#include "strata/client.h"
#include "strata/v1/cache.grpc.pb.h"
#include "tests/integration/daemon_process.h"
#include "tests/support/test_data.h"

namespace strata {
namespace {

using testing::DaemonProcess;
using testing::Tokens;

constexpr uint32_t kTokensPerBlock = 16;
constexpr size_t kBlockBytes = 256 << 10;
constexpr int kBatches = 12;  // x 4 blocks x 256 KiB = 12 MiB through a 4 MiB host tier
constexpr int kPerBatch = 4;

NamespaceSpec Spec() { return testing::SmallSpec("tiering-test"); }

std::vector<uint8_t> Block(uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> b(kBlockBytes);
  for (size_t i = 0; i < b.size(); i += 8) {
    uint64_t v = rng();
    std::memcpy(b.data() + i, &v, 8);
  }
  return b;
}

// A persistent directory for the tier file, the catalog and the cluster secret, shared by the
// daemons a test starts one after the other.
class TieringTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = testing::MakeTempDir("tiering");
    ASSERT_FALSE(root_.empty());
    std::ofstream(root_ + "/secret") << "0123456789abcdef0123456789abcdef\n";
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(root_, ec);
  }

  std::string Config(const std::string& nvme_capacity = "64MiB", bool nvme = true) const {
    std::string y = "host_tier:\n  capacity: 4MiB\ncluster_secret_file: " + root_ + "/secret\n";
    if (nvme)
      y += "nvme:\n  files:\n    - {path: " + root_ + "/tier0, capacity: " + nvme_capacity +
           "}\n  catalog_dir: " + root_ + "/catalog\n";
    return y;
  }

  struct Published {
    std::vector<std::vector<BlockId>> ids;  // per batch
    std::vector<std::vector<std::vector<uint8_t>>> bytes;
  };

  static std::unique_ptr<Client> Connect(const DaemonProcess& d) {
    ClientOptions o;
    o.endpoint = d.endpoint();
    auto c = Client::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }

  // kBatches separate prompts of kPerBatch blocks each.
  static Published PublishAll(Client& c, const NamespaceId& ns) {
    Published p;
    for (int b = 0; b < kBatches; ++b) {
      std::vector<std::vector<uint8_t>> blocks;
      std::vector<ConstBuffer> views;
      for (int k = 0; k < kPerBatch; ++k) blocks.push_back(Block(1000 * b + k));
      for (auto& x : blocks) views.push_back({x.data(), x.size()});
      auto r = c.Publish(ns, Tokens(kPerBatch * kTokensPerBlock, 77 + b), views);
      EXPECT_TRUE(r.ok()) << r.status();
      if (!r.ok()) return p;
      EXPECT_EQ(r->stored, static_cast<size_t>(kPerBatch)) << "batch " << b;
      p.ids.push_back(r->ids);
      p.bytes.push_back(std::move(blocks));
    }
    return p;
  }

  static uint64_t Counter(Client& c, const std::string& name) {
    auto s = c.Stats();
    if (!s.ok()) return 0;
    for (auto& [k, v] : s->counters)
      if (k == name) return v;
    return 0;
  }

  static bool WaitCounter(Client& c, const std::string& name, uint64_t at_least) {
    for (int i = 0; i < 500; ++i) {
      if (Counter(c, name) >= at_least) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

  // Waits until write-back has gone quiet (no new demotion for 300 ms).
  static void Settle(Client& c) {
    uint64_t last = Counter(c, "demotions_total");
    for (int i = 0; i < 50; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      uint64_t now = Counter(c, "demotions_total");
      if (now == last) return;
      last = now;
    }
  }

  // Tier of each id as Lookup reports it (one lookup per id, so a miss does not hide the rest).
  static std::vector<v1::Tier> Tiers(const DaemonProcess& d, const NamespaceId& ns,
                                     const std::vector<BlockId>& ids) {
    auto stub =
        v1::Cache::NewStub(grpc::CreateChannel(d.endpoint(), grpc::InsecureChannelCredentials()));
    std::vector<v1::Tier> out;
    for (const BlockId& id : ids) {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
      v1::LookupRequest q;
      q.set_namespace_id(std::string(ns.AsBytes()));
      q.set_ids(std::string(reinterpret_cast<const char*>(id.bytes.data()), 32));
      v1::LookupResponse r;
      EXPECT_TRUE(stub->Lookup(&ctx, q, &r).ok());
      out.push_back(r.prefix_blocks() == 1 ? r.tiers(0) : v1::TIER_UNKNOWN);
    }
    return out;
  }

  // Fetches every published block; returns how many came back byte-identical. Blocks that do
  // not come back are reported as not found, never as garbage.
  static size_t FetchAll(Client& c, const NamespaceId& ns, const Published& p,
                         std::vector<BlockStatus>* statuses = nullptr) {
    size_t good = 0;
    for (size_t b = 0; b < p.ids.size(); ++b) {
      std::vector<std::vector<uint8_t>> out(kPerBatch, std::vector<uint8_t>(kBlockBytes, 0));
      std::vector<MutableBuffer> bufs;
      for (auto& x : out) bufs.push_back({x.data(), x.size()});
      auto f = c.Fetch(ns, p.ids[b], bufs);
      EXPECT_TRUE(f.ok()) << f.status();
      if (!f.ok()) continue;
      for (int k = 0; k < kPerBatch; ++k) {
        if (statuses) statuses->push_back(f->status[k]);
        if (f->status[k] == BlockStatus::kOk) {
          EXPECT_EQ(out[k], p.bytes[b][k]) << "batch " << b << " block " << k;
          good += out[k] == p.bytes[b][k];
        } else {
          EXPECT_NE(f->status[k], BlockStatus::kInvalid);
        }
      }
    }
    return good;
  }

  std::vector<BlockId> Flatten(const Published& p) {
    std::vector<BlockId> all;
    for (auto& v : p.ids) all.insert(all.end(), v.begin(), v.end());
    return all;
  }

  std::string root_;
};

TEST_F(TieringTest, MoreThanHostHoldsStaysFetchableThroughNvme) {
  DaemonProcess d(Config());
  ASSERT_TRUE(d.ok()) << d.log();
  auto c = Connect(d);
  ASSERT_TRUE(c);
  auto ns = c->OpenNamespace(Spec(), "t");
  ASSERT_TRUE(ns.ok()) << ns.status();
  Published p = PublishAll(*c, *ns);
  ASSERT_EQ(p.ids.size(), static_cast<size_t>(kBatches));
  ASSERT_TRUE(WaitCounter(*c, "demotions_total", 1)) << d.log();

  auto tiers = Tiers(d, *ns, Flatten(p));
  size_t nvme = 0, host = 0;
  for (auto t : tiers) {
    nvme += t == v1::TIER_NVME;
    host += t == v1::TIER_HOST;
  }
  EXPECT_EQ(nvme + host, tiers.size()) << "every block is in one of the tiers";
  EXPECT_GT(nvme, 0u);
  EXPECT_GT(host, 0u);
  EXPECT_LE(host, 16u) << "the host tier holds at most 4 MiB";

  // Every block comes back byte-identical (NVMe ones staged through host memory).
  EXPECT_EQ(FetchAll(*c, *ns, p), static_cast<size_t>(kBatches * kPerBatch));
  EXPECT_GT(Counter(*c, "promotions_total"), 0u);
  EXPECT_EQ(Counter(*c, "nvme_crc_failures_total"), 0u);
  EXPECT_EQ(Counter(*c, "host_pressure_drops_total"), 0u);
  auto stats = c->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_LE(stats->host_used_bytes, stats->host_capacity_bytes);
}

TEST_F(TieringTest, WithoutNvmeTheSameWorkloadEvicts) {
  DaemonProcess d(Config("", /*nvme=*/false));
  ASSERT_TRUE(d.ok()) << d.log();
  auto c = Connect(d);
  ASSERT_TRUE(c);
  auto ns = c->OpenNamespace(Spec(), "t");
  ASSERT_TRUE(ns.ok());
  Published p = PublishAll(*c, *ns);
  std::vector<BlockStatus> st;
  size_t good = FetchAll(*c, *ns, p, &st);
  EXPECT_LE(good, 16u);
  EXPECT_GT(Counter(*c, "evictions_lru_total"), 0u);
  EXPECT_EQ(Counter(*c, "demotions_total"), 0u);  // no such series without NVMe
  for (auto t : Tiers(d, *ns, Flatten(p))) EXPECT_NE(t, v1::TIER_NVME);
}

TEST_F(TieringTest, FetchPromotesAnNvmeBlockToHost) {
  DaemonProcess d(Config());
  ASSERT_TRUE(d.ok()) << d.log();
  auto c = Connect(d);
  ASSERT_TRUE(c);
  auto ns = *c->OpenNamespace(Spec(), "t");
  Published p = PublishAll(*c, ns);
  ASSERT_TRUE(WaitCounter(*c, "demotions_total", 1));
  // The first batch was published first: with LRU it is the first written back.
  ASSERT_TRUE(WaitCounter(*c, "demotions_total", kPerBatch));
  auto before = Tiers(d, ns, p.ids[0]);
  ASSERT_EQ(before[0], v1::TIER_NVME);
  std::vector<uint8_t> out(kBlockBytes);
  MutableBuffer buf{out.data(), out.size()};
  auto f = c->Fetch(ns, {&p.ids[0][0], 1}, {&buf, 1});
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ(f->status[0], BlockStatus::kOk);
  EXPECT_EQ(out, p.bytes[0][0]);
  EXPECT_EQ(Tiers(d, ns, {p.ids[0][0]})[0], v1::TIER_HOST);
  EXPECT_GE(Counter(*c, "promotions_total"), 1u);
  // Evict works on NVMe blocks too, and cascades from a host block into NVMe descendants.
  auto ev = c->Evict(ns, {&p.ids[0][0], 1}, /*cascade=*/true);
  ASSERT_TRUE(ev.ok());
  EXPECT_EQ(ev->removed_blocks, static_cast<uint64_t>(kPerBatch));
  for (auto t : Tiers(d, ns, p.ids[0])) EXPECT_EQ(t, v1::TIER_UNKNOWN);
}

TEST_F(TieringTest, RestartRecoversNvmeBlocksAfterSigtermAndKill9) {
  for (int sig : {SIGTERM, SIGKILL}) {
    SCOPED_TRACE(sig == SIGTERM ? "SIGTERM" : "SIGKILL");
    TearDown();
    SetUp();
    Published p;
    std::vector<v1::Tier> tiers;
    {
      DaemonProcess d(Config());
      ASSERT_TRUE(d.ok()) << d.log();
      auto c = Connect(d);
      ASSERT_TRUE(c);
      auto ns = *c->OpenNamespace(Spec(), "t");
      p = PublishAll(*c, ns);
      ASSERT_TRUE(WaitCounter(*c, "demotions_total", 8));
      Settle(*c);
      tiers = Tiers(d, ns, Flatten(p));
      c.reset();
      d.Signal(sig);
      auto code = d.WaitExit(std::chrono::seconds(20));
      ASSERT_TRUE(code.has_value());
      if (sig == SIGTERM) {
        EXPECT_EQ(*code, 0) << d.log();
      }
    }
    DaemonProcess d(Config());
    ASSERT_TRUE(d.ok()) << d.log();
    EXPECT_NE(d.log().find("nvme tier:"), std::string::npos) << d.log();
    auto c = Connect(d);
    ASSERT_TRUE(c);
    auto ns = *c->OpenNamespace(Spec(), "t");  // same secret, same namespace id
    auto after = Tiers(d, ns, Flatten(p));
    size_t were_nvme = 0;
    for (size_t i = 0; i < tiers.size(); ++i) {
      if (tiers[i] != v1::TIER_NVME) continue;
      ++were_nvme;
      EXPECT_EQ(after[i], v1::TIER_NVME) << "block " << i;
    }
    EXPECT_GE(were_nvme, 8u);
    // Host blocks are lost on restart; the NVMe ones are fetched byte-identical.
    std::vector<BlockStatus> st;
    size_t good = FetchAll(*c, ns, p, &st);
    EXPECT_GE(good, were_nvme);
    EXPECT_LT(good, tiers.size()) << "host blocks do not survive a restart";
    for (size_t i = 0; i < tiers.size(); ++i)
      if (tiers[i] == v1::TIER_NVME) {
        EXPECT_EQ(st[i], BlockStatus::kOk) << "block " << i;
      }
    EXPECT_EQ(Counter(*c, "nvme_crc_failures_total"), 0u);
  }
}

TEST_F(TieringTest, CorruptNvmeBlockIsDroppedAndCountedOthersServed) {
  Published p;
  std::vector<BlockId> nvme_ids;
  {
    DaemonProcess d(Config());
    ASSERT_TRUE(d.ok()) << d.log();
    auto c = Connect(d);
    ASSERT_TRUE(c);
    auto ns = *c->OpenNamespace(Spec(), "t");
    p = PublishAll(*c, ns);
    ASSERT_TRUE(WaitCounter(*c, "demotions_total", 8));
    auto all = Flatten(p);
    auto tiers = Tiers(d, ns, all);
    for (size_t i = 0; i < all.size(); ++i)
      if (tiers[i] == v1::TIER_NVME) nvme_ids.push_back(all[i]);
    c.reset();
    d.Signal(SIGTERM);
    ASSERT_TRUE(d.WaitExit(std::chrono::seconds(20)).has_value());
  }
  ASSERT_GE(nvme_ids.size(), 2u);
  const BlockId victim = nvme_ids[1];
  {
    // Where the block lies, from the catalog the daemon left; flip bytes there in the file.
    auto cat = Catalog::Open(root_ + "/catalog");
    ASSERT_TRUE(cat.ok()) << cat.status();
    auto e = (*cat)->Get(victim);
    ASSERT_TRUE(e.ok()) << e.status();
    int fd = ::open((root_ + "/tier0").c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    uint8_t bytes[16];
    ASSERT_EQ(pread(fd, bytes, sizeof bytes, e->offset + 1000), 16);
    for (auto& b : bytes) b ^= 0xFF;
    ASSERT_EQ(pwrite(fd, bytes, sizeof bytes, e->offset + 1000), 16);
    fsync(fd);
    close(fd);
  }
  DaemonProcess d(Config());
  ASSERT_TRUE(d.ok()) << d.log();
  auto c = Connect(d);
  ASSERT_TRUE(c);
  auto ns = *c->OpenNamespace(Spec(), "t");
  std::vector<std::vector<uint8_t>> out(nvme_ids.size(), std::vector<uint8_t>(kBlockBytes));
  std::vector<MutableBuffer> bufs;
  for (auto& x : out) bufs.push_back({x.data(), x.size()});
  // One block at a time, so each has its own outcome.
  for (size_t i = 0; i < nvme_ids.size(); ++i) {
    auto f = c->Fetch(ns, {&nvme_ids[i], 1}, {&bufs[i], 1});
    ASSERT_TRUE(f.ok()) << f.status();
    if (nvme_ids[i] == victim) {
      EXPECT_NE(f->status[0], BlockStatus::kOk) << "a corrupt block is never served";
    } else {
      EXPECT_EQ(f->status[0], BlockStatus::kOk) << i;
    }
  }
  EXPECT_EQ(Counter(*c, "nvme_crc_failures_total"), 1u);
  EXPECT_NE(d.log().find("CRC32C"), std::string::npos) << d.log();
  // Dropped: not found any more.
  EXPECT_EQ(Tiers(d, ns, {victim})[0], v1::TIER_UNKNOWN);
  // Everything else was byte-identical.
  for (size_t b = 0; b < p.ids.size(); ++b)
    for (int k = 0; k < kPerBatch; ++k)
      for (size_t i = 0; i < nvme_ids.size(); ++i)
        if (nvme_ids[i] == p.ids[b][k] && nvme_ids[i] != victim) {
          EXPECT_EQ(out[i], p.bytes[b][k]);
        }
}

TEST_F(TieringTest, FullNvmeDropsVictimsAndKeepsServingFromHost) {
  // 64 KiB of NVMe: no 256 KiB block ever fits.
  DaemonProcess d(Config("64KiB"));
  ASSERT_TRUE(d.ok()) << d.log();
  auto c = Connect(d);
  ASSERT_TRUE(c);
  auto ns = *c->OpenNamespace(Spec(), "t");
  Published p = PublishAll(*c, ns);  // every publish succeeds (checked inside)
  ASSERT_EQ(p.ids.size(), static_cast<size_t>(kBatches));
  ASSERT_TRUE(WaitCounter(*c, "nvme_full_drops_total", 1)) << d.log();
  EXPECT_EQ(Counter(*c, "demotions_total"), 0u);
  EXPECT_NE(d.log().find("nvme tier full"), std::string::npos) << d.log();
  // The latest batch is in host memory and served.
  std::vector<std::vector<uint8_t>> out(kPerBatch, std::vector<uint8_t>(kBlockBytes));
  std::vector<MutableBuffer> bufs;
  for (auto& x : out) bufs.push_back({x.data(), x.size()});
  auto f = c->Fetch(ns, p.ids.back(), bufs);
  ASSERT_TRUE(f.ok()) << f.status();
  for (int k = 0; k < kPerBatch; ++k) {
    EXPECT_EQ(f->status[k], BlockStatus::kOk);
    EXPECT_EQ(out[k], p.bytes.back()[k]);
  }
  // The tier file never grew past its capacity.
  EXPECT_LE(std::filesystem::file_size(root_ + "/tier0"), 64u << 10);
  auto stats = c->Stats();
  ASSERT_TRUE(stats.ok());
}

}  // namespace
}  // namespace strata
