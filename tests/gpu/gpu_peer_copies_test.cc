// Copies into buffers that same-node engines lend the daemon (GpuTieredStore::CopyToPeer),
// with a shared-memory object standing in for the engine's device buffer: blocks come from the
// device or from host memory, land where their offsets say, a block that does not fit is
// refused alone, a failing device loses nothing and leaks no lease, and the stand-in memory
// opens nothing but a lender's well-formed buffer.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <mutex>
#include <string>

#include "common/device_handles.h"
#include "gpu_tier_fixture.h"

namespace strata::testing_gpu {
namespace {

// An engine's "device buffer": a shared-memory object under a stand-in name, mapped here.
class LentBuffer {
 public:
  explicit LentBuffer(size_t bytes) : bytes_(bytes) {
    static std::atomic<int> n{0};
    char hex[33];
    std::snprintf(hex, sizeof hex, "%016x%08x%08x", static_cast<unsigned>(getpid()),
                  static_cast<unsigned>(n++), 0xabcdefu);
    name_ = std::string(device_handles::kStandInPrefix) + hex;
    const int fd = shm_open(name_.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    EXPECT_GE(fd, 0) << name_;
    EXPECT_EQ(ftruncate(fd, static_cast<off_t>(bytes)), 0);
    data_ = static_cast<uint8_t*>(mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    close(fd);
  }
  ~LentBuffer() {
    munmap(data_, bytes_);
    shm_unlink(name_.c_str());
  }
  const std::string& name() const { return name_; }
  uint8_t* data() const { return data_; }

 private:
  const size_t bytes_;
  std::string name_;
  uint8_t* data_ = nullptr;
};

class GpuPeerCopyTest : public GpuTierTest {
 protected:
  std::unique_ptr<PeerBuffer> OpenLent(const LentBuffer& b, uint64_t offset, uint64_t bytes) {
    auto opened = store_->memory().OpenPeerBuffer(device_handles::kHostStandIn, b.name(), offset,
                                                  bytes);
    EXPECT_TRUE(opened.ok()) << opened.status();
    return opened.ok() ? std::move(*opened) : nullptr;
  }
  std::atomic<bool> fail_{false};
};

TEST_F(GpuPeerCopyTest, BlocksLandWhereTheirOffsetsSayFromTheDeviceOrHostMemory) {
  Open(4);
  for (int i = 0; i < 6; ++i) Publish(i);
  const BlockId on_device[] = {Id(0), Id(1)};
  ASSERT_EQ(store_->Promote(ns_, on_device), std::vector<BlockStatus>(2, BlockStatus::kOk));

  LentBuffer lent(16 * kBlock);
  // The lent range starts 3 blocks into the engine's allocation.
  auto peer = OpenLent(lent, 3 * kBlock, 8 * kBlock);
  ASSERT_TRUE(peer);
  const BlockId ids[] = {Id(0), Id(2), Id(1), Id(77), Id(3)};
  const uint64_t offsets[] = {5 * kBlock, 0, 2 * kBlock, kBlock, 7 * kBlock + 1};
  auto r = store_->CopyToPeer(ns_, ids, offsets, *peer);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, (std::vector<BlockStatus>{BlockStatus::kOk, BlockStatus::kOk,
                                                 BlockStatus::kOk, BlockStatus::kNotFound,
                                                 BlockStatus::kInvalid}));
  EXPECT_EQ(r->sources, (std::vector<Tier>{Tier::kGpu, Tier::kGpu, Tier::kGpu, Tier::kNone,
                                           Tier::kNone}))
      << "block 2 was promoted into the free device room first";
  EXPECT_EQ(r->bytes, 3 * kBlock);
  const uint8_t* range = lent.data() + 3 * kBlock;
  EXPECT_EQ(std::memcmp(range + 5 * kBlock, Bytes(0, kBlock).data(), kBlock), 0);
  EXPECT_EQ(std::memcmp(range, Bytes(2, kBlock).data(), kBlock), 0);
  EXPECT_EQ(std::memcmp(range + 2 * kBlock, Bytes(1, kBlock).data(), kBlock), 0);
  EXPECT_EQ(r->crcs[1], Crc32c(Bytes(2, kBlock).data(), kBlock));
  for (size_t k = 0; k < 3 * kBlock; ++k) ASSERT_EQ(lent.data()[k], 0) << "outside the range";

  // Without promotion, straight from host memory; the device is left as it was.
  const BlockId cold[] = {Id(4)};
  const uint64_t at[] = {kBlock};
  r = store_->CopyToPeer(ns_, cold, at, *peer, /*promote=*/false);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->sources[0], Tier::kHost);
  EXPECT_EQ(std::memcmp(range + kBlock, Bytes(4, kBlock).data(), kBlock), 0);
  EXPECT_FALSE(store_->HoldsOnDevice(Id(4)));

  // A full device (every block leased) copies from host memory instead of refusing.
  const BlockId fill[] = {Id(0), Id(1), Id(2), Id(3)};
  AcquireResult held = store_->AcquireOnDevice(ns_, fill);
  ASSERT_EQ(held.status, std::vector<BlockStatus>(4, BlockStatus::kOk));
  const BlockId more[] = {Id(5)};
  r = store_->CopyToPeer(ns_, more, at, *peer);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status[0], BlockStatus::kOk);
  EXPECT_EQ(r->sources[0], Tier::kHost);
  EXPECT_EQ(std::memcmp(range + kBlock, Bytes(5, kBlock).data(), kBlock), 0);
  ASSERT_TRUE(store_->ReleaseOnDevice(held.lease_id).ok());

  GpuTierCounters c = Counters();
  EXPECT_EQ(c.peer_copies, 5u);
  EXPECT_EQ(c.peer_copied_bytes, 5 * kBlock);
  EXPECT_EQ(c.device.open_leases, 0u);
  EXPECT_EQ(host_->Stats().open_leases, 0u);
}

TEST_F(GpuPeerCopyTest, AFailingDeviceIsAnErrorThatLeaksNoLease) {
  HostStandInOptions f;
  f.fault = [this](bool, const DeviceCopy&) {
    return fail_.load() ? absl::InternalError("injected device copy failure") : absl::OkStatus();
  };
  Open(4, 64, std::move(f));
  Publish(0);
  Publish(1);
  const BlockId ids[] = {Id(0), Id(1)};
  ASSERT_EQ(store_->Promote(ns_, ids), std::vector<BlockStatus>(2, BlockStatus::kOk));
  LentBuffer lent(4 * kBlock);
  auto peer = OpenLent(lent, 0, 4 * kBlock);
  ASSERT_TRUE(peer);
  fail_ = true;
  const uint64_t offsets[] = {0, kBlock};
  auto r = store_->CopyToPeer(ns_, ids, offsets, *peer);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("injected"), std::string::npos) << r.status();
  EXPECT_EQ(Counters().copy_errors, 1u);
  EXPECT_EQ(Counters().device.open_leases, 0u);
  EXPECT_GE(Warnings(), 1u);
  fail_ = false;
  r = store_->CopyToPeer(ns_, ids, offsets, *peer);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(std::memcmp(lent.data() + kBlock, Bytes(1, kBlock).data(), kBlock), 0);
  EXPECT_TRUE(DeviceBytesMatch(0)) << "the device copies are intact";
}

// The mode a daemon's progress thread uses (a fetch by message): served only by the device
// alone, at once and within the byte bound; anything else is declined with nothing copied and
// no lease left, for the caller to fetch the usual way.
TEST_F(GpuPeerCopyTest, ADeviceOnlyFetchIsDeclinedUnlessTheDeviceAloneServesItAtOnce) {
  HostStandInOptions f;
  f.fault = [this](bool, const DeviceCopy&) {
    return fail_.load() ? absl::UnavailableError("injected: other copies under way")
                        : absl::OkStatus();
  };
  Open(4, 64, std::move(f));
  for (int i = 0; i < 3; ++i) Publish(i);
  const BlockId on_device[] = {Id(0), Id(1)};
  ASSERT_EQ(store_->Promote(ns_, on_device), std::vector<BlockStatus>(2, BlockStatus::kOk));
  LentBuffer lent(4 * kBlock);
  auto peer = OpenLent(lent, 0, 4 * kBlock);
  ASSERT_TRUE(peer);
  const uint64_t offsets[] = {0, kBlock};
  const std::vector<uint8_t> zeros(2 * kBlock, 0);
  auto nothing_changed = [&] {
    EXPECT_EQ(std::memcmp(lent.data(), zeros.data(), zeros.size()), 0);
    EXPECT_EQ(Counters().device.open_leases, 0u);
    EXPECT_EQ(host_->Stats().open_leases, 0u);
    EXPECT_EQ(Counters().peer_fetches_device_only, 0u);
  };
  const BlockId one_in_host[] = {Id(0), Id(2)};
  auto r = store_->CopyToPeer(ns_, one_in_host, offsets, *peer, true, uint64_t{1} << 30);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->declined) << "block 2 is in host memory only";
  EXPECT_FALSE(store_->HoldsOnDevice(Id(2))) << "declined, not promoted";
  nothing_changed();
  r = store_->CopyToPeer(ns_, on_device, offsets, *peer, true, kBlock);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->declined) << "two blocks are more than the bound of one";
  nothing_changed();
  fail_ = true;
  r = store_->CopyToPeer(ns_, on_device, offsets, *peer, true, uint64_t{1} << 30);
  fail_ = false;
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->declined) << "busy with other copies";
  nothing_changed();

  r = store_->CopyToPeer(ns_, on_device, offsets, *peer, true, uint64_t{1} << 30);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->declined);
  EXPECT_EQ(r->sources, (std::vector<Tier>{Tier::kGpu, Tier::kGpu}));
  EXPECT_EQ(std::memcmp(lent.data(), Bytes(0, kBlock).data(), kBlock), 0);
  EXPECT_EQ(std::memcmp(lent.data() + kBlock, Bytes(1, kBlock).data(), kBlock), 0);
  EXPECT_EQ(Counters().peer_fetches_device_only, 1u);
  EXPECT_EQ(Counters().device.open_leases, 0u);
}

TEST_F(GpuPeerCopyTest, OnlyALendersWellFormedBufferIsOpened) {
  Open(4);
  LentBuffer lent(2 * kBlock);
  DeviceMemory& m = store_->memory();
  auto code = [&](std::string_view kind, const std::string& name, uint64_t off, uint64_t n) {
    return m.OpenPeerBuffer(kind, name, off, n).status().code();
  };
  EXPECT_EQ(code(device_handles::kCudaIpc, std::string(64, 'x'), 0, kBlock),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(device_handles::kHostStandIn, "/etc/passwd", 0, 10),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(device_handles::kHostStandIn,
                 std::string(device_handles::kStandInPrefix) + "../../../../etc/shadow00000000",
                 0, 10),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(device_handles::kHostStandIn,
                 std::string(device_handles::kStandInPrefix) + std::string(32, '0'), 0, 10),
            absl::StatusCode::kFailedPrecondition)
      << "a well-formed name nobody lent";
  EXPECT_EQ(code(device_handles::kHostStandIn, lent.name(), kBlock, 2 * kBlock),
            absl::StatusCode::kInvalidArgument)
      << "a range past the object's end";
  EXPECT_EQ(code(device_handles::kHostStandIn, lent.name(), 0, 0),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(device_handles::kHostStandIn, lent.name(), 0, 2 * kBlock), absl::StatusCode::kOk);
}

TEST_F(GpuPeerCopyTest, ALenderThatShrinksItsBufferDoesNotTakeTheDaemonDown) {
  Open(4);
  Publish(0);
  LentBuffer lent(2 * kBlock);
  auto peer = OpenLent(lent, 0, 2 * kBlock);
  ASSERT_TRUE(peer);
  const int fd = shm_open(lent.name().c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 0), 0);
  close(fd);
  const BlockId ids[] = {Id(0)};
  const uint64_t offsets[] = {kBlock};
  auto r = store_->CopyToPeer(ns_, ids, offsets, *peer);  // a mapping would die of SIGBUS here
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status[0], BlockStatus::kOk);
}

// Blocks another node's daemon sends over a device link: reserved on the device, written there
// by the link, committed with the sender's CRC.
class GpuArrivalTest : public GpuTierTest {
 protected:
  // Block i "arrives": reserved, its bytes written into the pool, committed with `crc`.
  BlockStatus Arrive(int i, uint32_t crc, int parent = -1) {
    ReserveItem item{Id(i), parent < 0 ? BlockId{} : Id(parent), kBlock};
    ReserveResult r = store_->ReserveOnDevice(ns_, {&item, 1});
    if (r.status[0] != BlockStatus::kOk) return r.status[0];
    const auto bytes = Bytes(i, kBlock);
    std::memcpy(pool_ + r.offsets[0], bytes.data(), kBlock);
    auto c = store_->CommitOnDevice(r.reservation_id, {&item.id, 1}, {&crc, 1});
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? (*c)[0] : BlockStatus::kInvalid;
  }
  static uint32_t CrcOf(int i) { return Crc32c(Bytes(i, kBlock).data(), kBlock); }
};

TEST_F(GpuArrivalTest, AnArrivedBlockIsOnTheDeviceOnlyAnnouncedAndServedToHostReaders) {
  Open(8);
  std::vector<BlockEvent> events;
  std::mutex mu;
  store_->SetChangeHook([&](const BlockEvent& e) {
    std::lock_guard<std::mutex> l(mu);
    events.push_back(e);
  });
  ASSERT_EQ(Arrive(1, CrcOf(1)), BlockStatus::kOk);
  ASSERT_EQ(Arrive(2, CrcOf(2), 1), BlockStatus::kOk);
  {
    std::lock_guard<std::mutex> l(mu);
    ASSERT_EQ(events.size(), 2u);
    EXPECT_EQ(events[1].kind, BlockEvent::kStored);
    EXPECT_EQ(events[1].tier, Tier::kGpu);
    EXPECT_EQ(events[1].id, Id(2));
    EXPECT_EQ(events[1].parent, Id(1));
  }
  const BlockId id = Id(1);
  std::vector<Tier> tiers;
  EXPECT_EQ(store_->Lookup(ns_, {&id, 1}, &tiers), 1u);
  EXPECT_EQ(tiers[0], Tier::kGpu);
  EXPECT_TRUE(store_->Holds(id));
  EXPECT_TRUE(DeviceBytesMatch(1));
  // Host memory never had it: a CPU fetch stages it down, checked against the sender's CRC.
  EXPECT_EQ(FetchFromHost(1), BlockStatus::kOk);
  EXPECT_EQ(Counters().staged_down, 1u);
  // Arriving again: already here.
  EXPECT_EQ(Arrive(1, CrcOf(1)), BlockStatus::kExists);
  store_->SetChangeHook(nullptr);
}

TEST_F(GpuArrivalTest, ABlockThatArrivedDamagedIsNeverServed) {
  Open(8);
  ASSERT_EQ(Arrive(3, CrcOf(3) ^ 1), BlockStatus::kOk);  // the bytes do not match the CRC
  EXPECT_NE(FetchFromHost(3), BlockStatus::kOk);
  EXPECT_EQ(Counters().crc_failures, 1u);
  EXPECT_FALSE(store_->HoldsOnDevice(Id(3)));
}

TEST_F(GpuArrivalTest, HeldBlocksAreRefusedAndAnAbortedArrivalLeavesNothing) {
  Open(4);
  Publish(5);  // host memory holds it: the receiver promotes instead
  ReserveItem held{Id(5), BlockId{}, kBlock};
  EXPECT_EQ(store_->ReserveOnDevice(ns_, {&held, 1}).status[0], BlockStatus::kExists);
  // The whole device reserved, then given back: every extent is free again.
  std::vector<ReserveItem> items;
  for (int i = 10; i < 14; ++i) items.push_back({Id(i), BlockId{}, kBlock});
  ReserveResult r = store_->ReserveOnDevice(ns_, items);
  ASSERT_NE(r.reservation_id, 0u);
  for (auto s : r.status) EXPECT_EQ(s, BlockStatus::kOk);
  ReserveItem more{Id(20), BlockId{}, kBlock};
  EXPECT_EQ(store_->ReserveOnDevice(ns_, {&more, 1}).status[0], BlockStatus::kNoSpace);
  ASSERT_TRUE(store_->AbortOnDevice(r.reservation_id).ok());
  EXPECT_FALSE(store_->HoldsOnDevice(Id(10)));
  EXPECT_EQ(Arrive(20, CrcOf(20)), BlockStatus::kOk);
  EXPECT_EQ(Counters().device.allocated_bytes, kBlock);
  EXPECT_EQ(Counters().device.open_reservations, 0u);
}

}  // namespace
}  // namespace strata::testing_gpu
