// A zoned arena: each tenant's blocks in its own sealed shared-memory file, which can be handed
// to that tenant's clients read-only; a full zone evicts only its own blocks.
#include "storage/zoned_arena.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "common/crc32c.h"

namespace strata {
namespace {

constexpr uint64_t kMiB = 1 << 20;

BlockId Id(int i) {
  return ComputeBlockId(Digest{}, std::vector<uint32_t>{static_cast<uint32_t>(i)});
}

TEST(ZonedArenaTest, ZonesTileTheArenaInWholeUnits) {
  const std::vector<std::string> tenants = {"alpha", "beta", "gamma"};
  auto arena = ZonedArena::Create(64 * kMiB, tenants, /*prefault=*/false);
  ASSERT_TRUE(arena.ok()) << arena.status();
  const auto& zones = (*arena)->zones();
  ASSERT_EQ(zones.size(), 4u);
  EXPECT_EQ(zones[0].tenant, "");
  uint64_t next = 0;
  for (const auto& z : zones) {
    EXPECT_EQ(z.begin, next);
    EXPECT_EQ(z.size % ZonedArena::kZoneAlignment, 0u);
    EXPECT_GE(z.size, ZonedArena::kZoneAlignment);
    next += z.size;
  }
  EXPECT_EQ(next, (*arena)->size());
  EXPECT_EQ(zones[1].size, zones[3].size);  // an equal split among tenants
  EXPECT_EQ((*arena)->Find("beta"), &zones[2]);
  EXPECT_EQ((*arena)->Find("nobody"), nullptr);
  EXPECT_EQ((*arena)->Find(""), nullptr);  // the common zone goes to no client
}

TEST(ZonedArenaTest, TooSmallForItsTenantsIsRefused) {
  std::vector<std::string> tenants;
  for (int i = 0; i < 8; ++i) tenants.push_back("t" + std::to_string(i));
  auto arena = ZonedArena::Create(8 * kMiB, tenants, false);
  ASSERT_FALSE(arena.ok());
  EXPECT_NE(arena.status().message().find("too small"), std::string::npos);
}

// What a client holding the zone's file can do with it: map it to read, nothing else.
TEST(ZonedArenaTest, AZoneFileMapsReadOnlyAndCannotBeMadeWritable) {
  const std::vector<std::string> tenants = {"alpha", "beta"};
  auto arena = ZonedArena::Create(16 * kMiB, tenants, false);
  ASSERT_TRUE(arena.ok()) << arena.status();
  const ZonedArena::Zone* zone = (*arena)->Find("alpha");
  ASSERT_NE(zone, nullptr);
  uint8_t* daemon_view = (*arena)->data() + zone->begin;
  std::memcpy(daemon_view + 4096, "committed", 9);

  void* ro = mmap(nullptr, zone->size, PROT_READ, MAP_SHARED, zone->fd, 0);
  ASSERT_NE(ro, MAP_FAILED);
  EXPECT_EQ(std::memcmp(static_cast<uint8_t*>(ro) + 4096, "committed", 9), 0);
  std::memcpy(daemon_view + 4096, "rewritten", 9);  // the daemon's writes show through
  EXPECT_EQ(std::memcmp(static_cast<uint8_t*>(ro) + 4096, "rewritten", 9), 0);
  EXPECT_NE(mprotect(ro, zone->size, PROT_READ | PROT_WRITE), 0);
  munmap(ro, zone->size);

  errno = 0;
  EXPECT_EQ(mmap(nullptr, zone->size, PROT_READ | PROT_WRITE, MAP_SHARED, zone->fd, 0),
            MAP_FAILED);
  EXPECT_EQ(errno, EPERM);
  EXPECT_LT(pwrite(zone->fd, "forged", 6, 4096), 0);
  EXPECT_NE(ftruncate(zone->fd, 0), 0);
  // Reopened through /proc, as a client holding the descriptor could: still sealed.
  const std::string path = "/proc/self/fd/" + std::to_string(zone->fd);
  const int again = open(path.c_str(), O_RDWR);
  ASSERT_GE(again, 0);
  EXPECT_EQ(mmap(nullptr, zone->size, PROT_READ | PROT_WRITE, MAP_SHARED, again, 0), MAP_FAILED);
  EXPECT_LT(pwrite(again, "forged", 6, 4096), 0);
  EXPECT_NE(fcntl(again, F_ADD_SEALS, 0), 0) << "the seals can be changed";
  close(again);
  EXPECT_EQ(std::memcmp(daemon_view + 4096, "rewritten", 9), 0);
}

class ZonedHostTierTest : public ::testing::Test {
 protected:
  void Make(uint64_t capacity) {
    arena_ = *ZonedArena::Create(capacity, tenants_, false);
    HostTierOptions o;
    o.alignment = 4096;
    o.zones = arena_->Layout();
    tier_ = std::make_unique<HostTier>(arena_->data(), arena_->size(), o);
    tier_->SetNamespaceTenant(alpha_ns_, "alpha");
    tier_->SetNamespaceTenant(beta_ns_, "beta");
  }
  // Returns the block's offset, or ~0 when it was not stored.
  uint64_t Publish(const NamespaceId& ns, int i, uint64_t size) {
    ReserveItem item{Id(i), {}, size};
    auto r = tier_->Reserve(ns, {&item, 1});
    if (r.status[0] != BlockStatus::kOk) return ~uint64_t{0};
    uint8_t* p = tier_->base() + r.offsets[0];
    std::memset(p, i & 0xff, size);
    uint32_t crc = Crc32c(p, size);
    auto c = tier_->Commit(r.reservation_id, {&crc, 1});
    return c.ok() && (*c)[0] == BlockStatus::kOk ? r.offsets[0] : ~uint64_t{0};
  }
  bool Has(const NamespaceId& ns, int i) {
    BlockId id = Id(i);
    return tier_->Lookup(ns, {&id, 1}) == 1;
  }
  bool Inside(const ZonedArena::Zone* z, uint64_t offset, uint64_t size) {
    return offset >= z->begin && offset + size <= z->begin + z->size;
  }

  std::vector<std::string> tenants_ = {"alpha", "beta"};
  std::unique_ptr<ZonedArena> arena_;
  std::unique_ptr<HostTier> tier_;
  NamespaceId alpha_ns_ = ComputeBlockId(Digest{}, std::vector<uint32_t>{1});
  NamespaceId beta_ns_ = ComputeBlockId(Digest{}, std::vector<uint32_t>{2});
  NamespaceId untenanted_ns_ = ComputeBlockId(Digest{}, std::vector<uint32_t>{3});
};

TEST_F(ZonedHostTierTest, EachNamespaceLandsInItsTenantsZone) {
  Make(32 * kMiB);
  const ZonedArena::Zone* alpha = arena_->Find("alpha");
  const ZonedArena::Zone* beta = arena_->Find("beta");
  const ZonedArena::Zone& common = arena_->zones()[0];
  for (int i = 0; i < 8; ++i) {
    uint64_t a = Publish(alpha_ns_, i, 100 * 1024);
    uint64_t b = Publish(beta_ns_, 100 + i, 100 * 1024);
    uint64_t c = Publish(untenanted_ns_, 200 + i, 10 * 1024);
    EXPECT_TRUE(Inside(alpha, a, 100 * 1024)) << a;
    EXPECT_TRUE(Inside(beta, b, 100 * 1024)) << b;
    EXPECT_TRUE(Inside(&common, c, 10 * 1024)) << c;
  }
  EXPECT_EQ(tier_->Stats().blocks, 24u);
}

TEST_F(ZonedHostTierTest, AFullZoneEvictsOnlyItsOwnBlocks) {
  Make(32 * kMiB);
  const uint64_t zone_bytes = arena_->Find("alpha")->size;
  const uint64_t block = 1 * kMiB;
  // beta first, so a tier-wide LRU would pick beta's blocks as alpha's victims.
  for (int i = 0; i < 4; ++i) ASSERT_NE(Publish(beta_ns_, 100 + i, block), ~uint64_t{0});
  const int alpha_blocks = static_cast<int>(2 * zone_bytes / block);
  for (int i = 0; i < alpha_blocks; ++i)
    ASSERT_NE(Publish(alpha_ns_, i, block), ~uint64_t{0}) << "alpha's publish " << i;
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(Has(beta_ns_, 100 + i)) << "beta lost block " << i;
  EXPECT_TRUE(Has(alpha_ns_, alpha_blocks - 1));
  EXPECT_FALSE(Has(alpha_ns_, 0));  // alpha made room from its own oldest
  EXPECT_GT(tier_->Stats().evictions_lru, 0u);
  // A block larger than the zone, though not than the arena, finds no room.
  ReserveItem big{Id(999), {}, zone_bytes + block};
  EXPECT_EQ(tier_->Reserve(alpha_ns_, {&big, 1}).status[0], BlockStatus::kNoSpace);
}

}  // namespace
}  // namespace strata
