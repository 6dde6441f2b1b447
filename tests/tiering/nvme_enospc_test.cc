// Issue 14, item "Faults": a full disk must not leave the NVMe tier broken once space returns,
// and while the tier cannot write, /readyz and /metrics must say so.
//
// A real stratad keeps its NVMe tier file and its catalog on a small ext4 filesystem (an image
// loop-mounted in a temp dir). A filler file takes every free block; publishes through a 4 MiB
// host tier then push victims down to a tier whose writes fail (ENOSPC). The filler is deleted
// and the test checks that demotions succeed again, that demoted blocks come back byte-identical,
// and that the degraded state showed up on /readyz and /metrics and went away.
//
// Needs root (mount) and mkfs.ext4 (e2fsprogs); skips with the reason otherwise.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <thread>

#include "strata/client.h"
#include "tests/integration/daemon_process.h"
#include "tests/operability/ops_helpers.h"
#include "tests/support/test_data.h"

namespace strata {
namespace {

using testing::DaemonProcess;
using testing::HttpGet;
using testing::RunCommand;
using testing::Tokens;

constexpr uint32_t kTokensPerBlock = 16;
constexpr size_t kBlockBytes = 256 << 10;
constexpr int kPerBatch = 4;

NamespaceSpec Spec() { return testing::SmallSpec("enospc-test"); }

// Block contents derived from (batch, index), so any block read back can be checked.
std::vector<uint8_t> Block(uint32_t batch, uint32_t k) {
  std::mt19937_64 rng(uint64_t{batch} * 1000 + k + 1);
  std::vector<uint8_t> b(kBlockBytes);
  for (size_t i = 0; i < b.size(); i += 8) {
    uint64_t v = rng();
    std::memcpy(b.data() + i, &v, 8);
  }
  return b;
}

// An ext4 image loop-mounted at `mnt`; unmounted and removed on destruction.
class SmallFilesystem {
 public:
  // Empty `skip_reason` when mounted.
  SmallFilesystem(const std::string& root, const std::string& size, std::string* skip_reason)
      : image_(root + "/fs.img"), mnt_(root + "/mnt") {
    if (geteuid() != 0) {
      *skip_reason = "needs root to loop-mount a small ext4 filesystem";
      return;
    }
    const std::string mkfs = testing::FindExecutable("mkfs.ext4");
    if (mkfs.empty()) {
      *skip_reason = "mkfs.ext4 not found (e2fsprogs; scripts/install-deps.sh installs it)";
      return;
    }
    std::filesystem::create_directories(mnt_);
    // -m 0: no blocks reserved for root (the test runs as root and must be able to fill it).
    auto [rc, out] = RunCommand("truncate -s " + size + " " + image_ + " && " + mkfs +
                                " -q -F -m 0 -b 4096 " + image_);
    if (rc != 0) {
      *skip_reason = "cannot create an ext4 image: " + out;
      return;
    }
    auto [mrc, mout] = RunCommand("mount -o loop " + image_ + " " + mnt_);
    if (mrc != 0) {
      *skip_reason = "cannot loop-mount an ext4 image (no loop devices here?): " + mout;
      return;
    }
    mounted_ = true;
  }
  ~SmallFilesystem() {
    if (mounted_) {
      if (umount2(mnt_.c_str(), 0) != 0) umount2(mnt_.c_str(), MNT_DETACH);
    }
    std::error_code ec;
    std::filesystem::remove(image_, ec);
  }
  const std::string& mnt() const { return mnt_; }

  // Writes `path` until the filesystem refuses more (ENOSPC); the bytes written.
  static uint64_t FillWith(const std::string& path) {
    int fd = ::open(path.c_str(), O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return 0;
    std::vector<char> buf(1 << 20, 'x');
    uint64_t total = 0;
    // Large writes first, then 4 KiB ones for the last partial megabyte, then a sync (delayed
    // allocation may only find out at writeback), and the same again for what that freed.
    for (int round = 0; round < 2; ++round) {
      for (size_t chunk : {size_t{1} << 20, size_t{4096}}) {
        while (true) {
          ssize_t n = ::write(fd, buf.data(), chunk);
          if (n <= 0) break;
          total += static_cast<uint64_t>(n);
        }
      }
      fsync(fd);
    }
    close(fd);
    return total;
  }

 private:
  std::string image_, mnt_;
  bool mounted_ = false;
};

class NvmeEnospcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = testing::MakeTempDir("enospc");
    ASSERT_FALSE(root_.empty());
    std::ofstream(root_ + "/secret") << "0123456789abcdef0123456789abcdef\n";
    std::string why;
    fs_ = std::make_unique<SmallFilesystem>(root_, "32M", &why);
    if (!why.empty()) GTEST_SKIP() << why;
  }
  void TearDown() override {
    daemon_.reset();
    fs_.reset();
    std::error_code ec;
    std::filesystem::remove_all(root_, ec);
  }

  std::string Config() const {
    return "host_tier:\n  capacity: 4MiB\ncluster_secret_file: " + root_ +
           "/secret\nhttp_listen: 127.0.0.1:0\n"
           "nvme:\n  files:\n    - {path: " +
           fs_->mnt() + "/tier0, capacity: 8MiB}\n  catalog_dir: " + fs_->mnt() + "/catalog\n";
  }

  std::unique_ptr<Client> Connect() {
    ClientOptions o;
    o.endpoint = daemon_->endpoint();
    o.rpc_timeout = absl::Seconds(10);
    auto c = Client::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }

  uint64_t Counter(const std::string& name) {
    auto s = client_->Stats();
    if (!s.ok()) return 0;
    for (auto& [k, v] : s->counters)
      if (k == name) return v;
    return 0;
  }

  // Waits until write-back goes quiet: no demotion, drop or write error for 500 ms.
  void Settle() {
    auto sum = [&] {
      return Counter("demotions_total") + Counter("nvme_write_errors_total") +
             Counter("nvme_full_drops_total");
    };
    uint64_t last = sum();
    for (int i = 0; i < 40; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      uint64_t now = sum();
      if (now == last) return;
      last = now;
    }
  }

  // Publishes batches [first, first + n), kPerBatch blocks each (each batch its own prompt).
  void PublishBatches(uint32_t first, uint32_t n) {
    for (uint32_t b = first; b < first + n; ++b) {
      std::vector<std::vector<uint8_t>> blocks;
      for (uint32_t k = 0; k < kPerBatch; ++k) blocks.push_back(Block(b, k));
      auto r = client_->Publish(ns_, Tokens(kPerBatch * kTokensPerBlock, 500 + b),
                                testing::BufferViews(blocks));
      ASSERT_TRUE(r.ok()) << "batch " << b << ": " << r.status() << "\n" << daemon_->log();
      ASSERT_EQ(r->stored + r->deduplicated, static_cast<size_t>(kPerBatch)) << "batch " << b;
      ids_[b] = r->ids;
    }
  }

  // Fetches batch `b`; the blocks that came back OK (each checked byte for byte).
  size_t FetchBatch(uint32_t b) {
    std::vector<std::vector<uint8_t>> out(kPerBatch, std::vector<uint8_t>(kBlockBytes, 0));
    std::vector<MutableBuffer> bufs;
    for (auto& x : out) bufs.push_back({x.data(), x.size()});
    auto f = client_->Fetch(ns_, ids_[b], bufs);
    EXPECT_TRUE(f.ok()) << f.status();
    if (!f.ok()) return 0;
    size_t ok = 0;
    for (uint32_t k = 0; k < kPerBatch; ++k) {
      if (f->status[k] != BlockStatus::kOk) continue;
      EXPECT_EQ(out[k], Block(b, k)) << "batch " << b << " block " << k << ": wrong bytes";
      ++ok;
    }
    return ok;
  }

  std::string root_;
  std::unique_ptr<SmallFilesystem> fs_;
  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<Client> client_;
  NamespaceId ns_;
  std::map<uint32_t, std::vector<BlockId>> ids_;
};

TEST_F(NvmeEnospcTest, TierRecoversAfterDiskFullAndReadyzSaysDegradedMeanwhile) {
  daemon_ = std::make_unique<DaemonProcess>(Config());
  ASSERT_TRUE(daemon_->ok()) << daemon_->log();
  const std::string http = daemon_->ReadyField("http_endpoint");
  ASSERT_FALSE(http.empty());
  client_ = Connect();
  ASSERT_TRUE(client_);
  ns_ = *client_->OpenNamespace(Spec(), "t");

  // 1. Healthy: 6 MiB through the 4 MiB host tier: some blocks demote to NVMe.
  ASSERT_NO_FATAL_FAILURE(PublishBatches(0, 6));
  Settle();
  const uint64_t demoted_before = Counter("demotions_total");
  ASSERT_GT(demoted_before, 0u) << daemon_->log();
  ASSERT_EQ(Counter("nvme_write_errors_total"), 0u) << daemon_->log();
  auto ready = HttpGet(http, "/readyz");
  EXPECT_EQ(ready.status, 200);
  EXPECT_EQ(ready.body, "ready\n");

  // 2. Disk full: every free block of the filesystem goes to a filler file. Publishing keeps
  // working (host memory), while demotions (data, catalog, and the NVMe evictions that make
  // room past the watermark) fail.
  const std::string filler = fs_->mnt() + "/filler";
  ASSERT_GT(SmallFilesystem::FillWith(filler), 0u);
  ASSERT_NO_FATAL_FAILURE(PublishBatches(6, 16));
  Settle();
  EXPECT_GT(Counter("nvme_write_errors_total"), 0u)
      << "no NVMe write failed on a full disk: the test did not reach ENOSPC\n"
      << daemon_->log();
  ready = HttpGet(http, "/readyz");
  // Still serving from host memory: ready (the chart keeps the pod), but saying what is wrong.
  EXPECT_EQ(ready.status, 200);
  EXPECT_NE(ready.body.find("degraded: nvme tier"), std::string::npos) << ready.body;
  auto metrics = HttpGet(http, "/metrics");
  EXPECT_NE(metrics.body.find("strata_tier_degraded{tier=\"nvme\"} 1"), std::string::npos)
      << metrics.body.substr(0, 4000);
  // The newest batch is in host memory and served.
  EXPECT_EQ(FetchBatch(21), static_cast<size_t>(kPerBatch));

  // 3. Space returns: the tier must work again without a restart.
  ASSERT_TRUE(std::filesystem::remove(filler));
  sync();
  bool recovered = false;
  for (int i = 0; i < 100 && !recovered; ++i) {
    ready = HttpGet(http, "/readyz");
    recovered = ready.status == 200 && ready.body == "ready\n";
    if (!recovered) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(recovered) << "still degraded 10 s after space returned: " << ready.body << "\n"
                         << daemon_->log();
  const uint64_t errors_before = Counter("nvme_write_errors_total");
  const uint64_t drops_before = Counter("nvme_full_drops_total");
  const uint64_t demoted_mid = Counter("demotions_total");
  // 16 more batches (16 MiB) through the 4 MiB host tier and the 8 MiB NVMe tier: demotions
  // succeed, the NVMe tier evicts its own old blocks to make room, nothing fails.
  ASSERT_NO_FATAL_FAILURE(PublishBatches(22, 16));
  Settle();
  EXPECT_GE(Counter("demotions_total") - demoted_mid, 32u) << daemon_->log();
  EXPECT_EQ(Counter("nvme_write_errors_total"), errors_before) << daemon_->log();
  EXPECT_EQ(Counter("nvme_full_drops_total"), drops_before)
      << "the NVMe tier cannot make room after the disk-full period\n"
      << daemon_->log();
  metrics = HttpGet(http, "/metrics");
  EXPECT_NE(metrics.body.find("strata_tier_degraded{tier=\"nvme\"} 0"), std::string::npos);
  const std::string log = daemon_->log();
  EXPECT_NE(log.find("nvme tier degraded"), std::string::npos) << log;
  EXPECT_NE(log.find("nvme tier recovered"), std::string::npos) << log;

  // Blocks that went down after the recovery come back from NVMe, byte for byte (FetchBatch
  // checks bytes; a miss is allowed only for blocks the NVMe tier evicted).
  size_t served = 0;
  for (uint32_t b = 22; b < 38; ++b) served += FetchBatch(b);
  EXPECT_GE(served, 8u * kPerBatch) << daemon_->log();
  EXPECT_GT(Counter("promotions_total"), 0u);
  // Every batch, also those from the disk-full period: right bytes or a miss, never garbage.
  for (uint32_t b = 0; b < 22; ++b) FetchBatch(b);
}

}  // namespace
}  // namespace strata
