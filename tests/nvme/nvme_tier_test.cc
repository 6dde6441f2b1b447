// NvmeTier against real files and a real io_uring (and the pread/pwrite fallback).
#include "storage/nvme_tier.h"

#include <gtest/gtest.h>
#include <liburing.h>
#include <sys/stat.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <thread>

#include "test_util.h"

namespace strata {
namespace {

using testing_nvme::AlignedBuf;
using testing_nvme::Payload;
using testing_nvme::TempDir;

struct Mode {
  const char* name;
  bool thread_pool;
  bool buffered;
};

class NvmeTierRoundTrip : public ::testing::TestWithParam<Mode> {};

TEST_P(NvmeTierRoundTrip, SeveralSizesAtQueueDepthEight) {
  TempDir dir;
  NvmeTierOptions o;
  o.files = {{dir.Sub("a.dat"), 64 << 20}, {dir.Sub("b.dat"), 64 << 20}};
  o.queue_depth = 8;
  o.staging_buffers = 4;  // fewer than the queue depth: ops wait for buffers
  o.staging_buffer_bytes = 256 << 10;
  o.force_thread_pool = GetParam().thread_pool;
  o.force_buffered = GetParam().buffered;
  auto tier = NvmeTier::Open(o);
  ASSERT_TRUE(tier.ok()) << tier.status();
  NvmeTier& t = **tier;
  EXPECT_EQ(t.io_backend(),
            GetParam().thread_pool ? NvmeIoBackend::kThreadPool : NvmeIoBackend::kIoUring)
      << t.io_uring_error();
  if (GetParam().buffered) {
    EXPECT_FALSE(t.direct_io());
  } else {
    EXPECT_TRUE(t.direct_io());  // /tmp accepts O_DIRECT on this machine
  }
  for (const auto& s : t.Stats()) {
    struct stat st;
    ASSERT_EQ(stat(s.path.c_str(), &st), 0);
    EXPECT_EQ(static_cast<uint64_t>(st.st_size), s.capacity_bytes);  // preallocated
  }

  const std::vector<size_t> sizes = {1, 4095, 4096, 100000, 128 << 10, (1 << 20) + 7, 4 << 20};
  std::vector<std::vector<std::byte>> data;
  std::vector<AlignedBuf> aligned;
  std::vector<NvmeWriteReq> writes;
  for (size_t k = 0; k < sizes.size() * 2; ++k) {
    data.push_back(Payload(k, sizes[k % sizes.size()]));
  }
  // Half of the writes from aligned memory (direct path when the size allows), half staged.
  aligned.reserve(data.size());
  for (size_t k = 0; k < data.size(); ++k) {
    aligned.emplace_back(data[k].size());
    std::memcpy(aligned.back().ptr, data[k].data(), data[k].size());
    if (k % 2 == 0)
      writes.push_back({{aligned[k].ptr, data[k].size()}, {}});
    else
      writes.push_back({data[k], {}});
  }
  auto ws = t.Write(writes);
  for (size_t k = 0; k < ws.size(); ++k) ASSERT_TRUE(ws[k].ok()) << k << ": " << ws[k];
  EXPECT_LT(t.free_bytes(), t.capacity_bytes());

  // Read back: into aligned buffers big enough for a direct read, and into exact-size vectors.
  std::vector<AlignedBuf> out_aligned;
  std::vector<std::vector<std::byte>> out_plain(data.size());
  std::vector<NvmeReadReq> reads;
  out_aligned.reserve(data.size());
  for (size_t k = 0; k < data.size(); ++k) {
    out_aligned.emplace_back(data[k].size());
    out_plain[k].resize(data[k].size());
    reads.push_back({writes[k].extent, {out_aligned[k].ptr, out_aligned[k].size}});
    reads.push_back({writes[k].extent, out_plain[k]});
  }
  auto rs = t.Read(reads);
  for (size_t k = 0; k < data.size(); ++k) {
    ASSERT_TRUE(rs[2 * k].ok()) << rs[2 * k];
    ASSERT_TRUE(rs[2 * k + 1].ok()) << rs[2 * k + 1];
    EXPECT_EQ(std::memcmp(out_aligned[k].ptr, data[k].data(), data[k].size()), 0) << k;
    EXPECT_EQ(out_plain[k], data[k]) << k;
  }
  for (const auto& w : writes) t.Free(w.extent);
  EXPECT_EQ(t.free_bytes(), t.capacity_bytes());
}

INSTANTIATE_TEST_SUITE_P(Modes, NvmeTierRoundTrip,
                         ::testing::Values(Mode{"io_uring_direct", false, false},
                                           Mode{"thread_pool_direct", true, false},
                                           Mode{"io_uring_buffered", false, true}),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(NvmeTier, IoUringUsesRegisteredBuffers) {
  TempDir dir;
  NvmeTierOptions o;
  o.files = {{dir.Sub("a.dat"), 1 << 20}};
  auto tier = NvmeTier::Open(o);
  ASSERT_TRUE(tier.ok()) << tier.status();
  ASSERT_EQ((*tier)->io_backend(), NvmeIoBackend::kIoUring) << (*tier)->io_uring_error();
  EXPECT_TRUE((*tier)->registered_buffers());
}

// Each thread gets its own ring (SINGLE_ISSUER); more threads than the engine keeps rings for,
// some concurrent, some one after another, writing and reading staged and direct.
// Per-thread rings (fio's flags) and one shared ring (what stratad uses: its callers are gRPC
// handler threads that come and go), from waves of short-lived threads.
class ManyThreads : public ::testing::TestWithParam<bool> {};

TEST_P(ManyThreads, ShareTheTier) {
  TempDir dir;
  NvmeTierOptions o;
  o.shared_ring = GetParam();
  o.files = {{dir.Sub("a.dat"), 64 << 20}};
  o.queue_depth = 4;
  o.staging_buffers = 2;
  o.staging_buffer_bytes = 64 << 10;
  auto tier = NvmeTier::Open(o);
  ASSERT_TRUE(tier.ok()) << tier.status();
  NvmeTier& t = **tier;
  if (t.io_backend() == NvmeIoBackend::kIoUring && GetParam()) {
    EXPECT_EQ(t.io_uring_setup_flags() & IORING_SETUP_SINGLE_ISSUER, 0u);
  }
  std::atomic<int> bad{0};
  auto work = [&](int k) {
    for (int round = 0; round < 3; ++round) {
      auto staged = Payload(k * 10 + round, 200000);
      AlignedBuf direct(256 << 10);
      auto d = Payload(k * 10 + round + 5000, direct.size);
      std::memcpy(direct.ptr, d.data(), d.size());
      std::vector<NvmeWriteReq> w = {{staged, {}}, {{direct.ptr, direct.size}, {}}};
      auto ws = t.Write(w);
      if (!ws[0].ok() || !ws[1].ok()) {
        ++bad;
        return;
      }
      std::vector<std::byte> back(staged.size());
      AlignedBuf back_direct(direct.size);
      std::vector<NvmeReadReq> r = {{w[0].extent, back},
                                    {w[1].extent, {back_direct.ptr, back_direct.size}}};
      auto rs = t.Read(r);
      if (!rs[0].ok() || !rs[1].ok() || back != staged ||
          std::memcmp(back_direct.ptr, d.data(), d.size()) != 0) {
        ++bad;
      }
      t.Free(w[0].extent);
      t.Free(w[1].extent);
    }
  };
  for (int wave = 0; wave < 3; ++wave) {
    std::vector<std::thread> threads;
    for (int k = 0; k < 6; ++k) threads.emplace_back(work, wave * 6 + k);
    for (auto& th : threads) th.join();
  }
  work(99);  // the opening thread's ring may have been closed meanwhile
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(t.free_bytes(), t.capacity_bytes());
}

INSTANTIATE_TEST_SUITE_P(Rings, ManyThreads, ::testing::Values(false, true), [](const auto& info) {
  return info.param ? "shared_ring" : "per_thread";
});

TEST(NvmeTier, FullGivesResourceExhaustedNamingThePath) {
  TempDir dir;
  NvmeTierOptions o;
  o.files = {{dir.Sub("small.dat"), 64 << 10}};
  auto tier = NvmeTier::Open(o);
  ASSERT_TRUE(tier.ok()) << tier.status();
  auto block = Payload(1, 4096);
  std::vector<NvmeWriteReq> writes(17, NvmeWriteReq{block, {}});
  auto ws = (*tier)->Write(writes);
  for (int i = 0; i < 16; ++i) ASSERT_TRUE(ws[i].ok()) << ws[i];
  EXPECT_EQ(ws[16].code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(ws[16].message().find(dir.Sub("small.dat")), std::string::npos) << ws[16];
  EXPECT_EQ((*tier)->free_bytes(), 0u);
  struct stat st;
  ASSERT_EQ(stat(dir.Sub("small.dat").c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 64 << 10);                   // never grows past capacity
  EXPECT_LE(st.st_blocks * 512, (64 << 10) + 4096);  // nor uses more disk
  (*tier)->Free(writes[3].extent);
  std::vector<NvmeWriteReq> again(1, NvmeWriteReq{block, {}});
  EXPECT_TRUE((*tier)->Write(again)[0].ok());
}

TEST(NvmeTier, TmpfsWithoutODirectFallsBackToBufferedIo) {
  if (!std::filesystem::exists("/dev/shm")) GTEST_SKIP() << "no /dev/shm";
  std::string path = "/dev/shm/strata_nvme_test_" + std::to_string(getpid()) + ".dat";
  {
    NvmeTierOptions o;
    o.files = {{path, 1 << 20}};
    auto tier = NvmeTier::Open(o);
    ASSERT_TRUE(tier.ok()) << tier.status();
    // tmpfs refuses O_DIRECT before Linux 6.6 and accepts it since; either way the data must
    // round-trip (the buffered path itself is covered by force_buffered above).
    auto block = Payload(3, 10000);
    std::vector<NvmeWriteReq> w{{block, {}}};
    ASSERT_TRUE((*tier)->Write(w)[0].ok());
    std::vector<std::byte> out(block.size());
    std::vector<NvmeReadReq> r{{w[0].extent, out}};
    ASSERT_TRUE((*tier)->Read(r)[0].ok());
    EXPECT_EQ(out, block);
    RecordProperty("tmpfs_direct_io", (*tier)->direct_io() ? "yes" : "no");
  }
  std::filesystem::remove(path);
}

TEST(NvmeTier, RejectsReadsOutsideTheTier) {
  TempDir dir;
  NvmeTierOptions o;
  o.files = {{dir.Sub("a.dat"), 1 << 20}};
  auto tier = NvmeTier::Open(o);
  ASSERT_TRUE(tier.ok());
  std::vector<std::byte> out(4096);
  std::vector<NvmeReadReq> r{{{0, 1 << 20, 4096}, out}, {{1, 0, 4096}, out}, {{0, 0, 8192}, out}};
  auto rs = (*tier)->Read(r);
  EXPECT_EQ(rs[0].code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(rs[1].code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(rs[2].code(), absl::StatusCode::kInvalidArgument);  // destination too small
}

}  // namespace
}  // namespace strata
