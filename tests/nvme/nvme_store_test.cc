// NvmeBlockStore: commit order, restart recovery (graceful and kill -9), CRC on first read,
// missing and overlapping extents, disk full.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include "absl/container/flat_hash_set.h"
#include "common/crc32c.h"
#include "storage/nvme_tier.h"
#include "test_util.h"

namespace strata {
namespace {

using testing_nvme::IdOf;
using testing_nvme::Payload;
using testing_nvme::TempDir;

NvmeBlockStoreOptions StoreOptions(const TempDir& dir, uint64_t capacity = 64 << 20,
                                   int files = 1) {
  NvmeBlockStoreOptions o;
  for (int f = 0; f < files; ++f) {
    o.tier.files.push_back({dir.Sub("tier" + std::to_string(f) + ".dat"), capacity});
  }
  o.tier.queue_depth = 8;
  o.catalog_path = dir.Sub("catalog");
  return o;
}

size_t SizeOf(uint64_t i) { return 3000 + (i * 7919) % 300000; }

std::vector<absl::Status> PutBlocks(NvmeBlockStore& s, uint64_t first, uint64_t n) {
  std::vector<std::vector<std::byte>> data;
  std::vector<NvmePutReq> reqs;
  data.reserve(n);
  for (uint64_t i = first; i < first + n; ++i) {
    data.push_back(Payload(i, SizeOf(i)));
    NvmePutReq r;
    r.id = IdOf(i);
    r.meta.ns = IdOf(999999);
    r.meta.parent = i > 0 ? IdOf(i - 1) : BlockId{};
    r.meta.codec_id = 1;
    r.meta.last_access_us = static_cast<int64_t>(i);
    r.data = data.back();
    reqs.push_back(r);
  }
  return s.Put(reqs);
}

// Reads block i and checks its bytes; returns the Get status.
absl::Status GetAndCheck(NvmeBlockStore& s, uint64_t i) {
  std::vector<std::byte> out(SizeOf(i) + 4096);
  std::vector<NvmeGetReq> g{{IdOf(i), out, 0}};
  absl::Status st = s.Get(g)[0];
  if (!st.ok()) return st;
  if (g[0].size != SizeOf(i)) return absl::InternalError("wrong size");
  out.resize(g[0].size);
  if (out != Payload(i, SizeOf(i))) return absl::InternalError("wrong bytes");
  return absl::OkStatus();
}

TEST(NvmeBlockStore, PutGetRemove) {
  TempDir dir;
  auto s = NvmeBlockStore::Open(StoreOptions(dir));
  ASSERT_TRUE(s.ok()) << s.status();
  for (const auto& st : PutBlocks(**s, 0, 20)) ASSERT_TRUE(st.ok()) << st;
  // Same ids again: already present, nothing rewritten.
  uint64_t free_before = (*s)->tier().free_bytes();
  for (const auto& st : PutBlocks(**s, 0, 20)) ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ((*s)->tier().free_bytes(), free_before);
  for (uint64_t i = 0; i < 20; ++i) EXPECT_TRUE(GetAndCheck(**s, i).ok()) << i;
  auto e = (*s)->Lookup(IdOf(4));
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->parent, IdOf(3));
  EXPECT_EQ(e->size, SizeOf(4));
  EXPECT_EQ(e->crc32c, Crc32c(Payload(4, SizeOf(4)).data(), SizeOf(4)));
  ASSERT_TRUE((*s)->Remove(IdOf(4)).ok());
  EXPECT_EQ(GetAndCheck(**s, 4).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ((*s)->Counters().blocks, 19u);
}

TEST(NvmeBlockStore, GracefulRestartFindsEveryBlock) {
  TempDir dir;
  uint64_t free_after = 0;
  {
    auto s = NvmeBlockStore::Open(StoreOptions(dir, 64 << 20, 2));
    ASSERT_TRUE(s.ok()) << s.status();
    for (const auto& st : PutBlocks(**s, 0, 60)) ASSERT_TRUE(st.ok()) << st;
    ASSERT_TRUE((*s)->Remove(IdOf(10)).ok());
    free_after = (*s)->tier().free_bytes();
  }
  auto s = NvmeBlockStore::Open(StoreOptions(dir, 64 << 20, 2));
  ASSERT_TRUE(s.ok()) << s.status();
  const auto& rep = (*s)->recovery();
  EXPECT_EQ(rep.entries_loaded, 59u);
  EXPECT_EQ(rep.entries_kept, 59u);
  EXPECT_EQ(rep.dropped_missing_extent + rep.dropped_overlapping + rep.dropped_undecodable, 0u);
  EXPECT_EQ((*s)->tier().free_bytes(), free_after);  // allocator rebuilt from the catalog
  EXPECT_EQ((*s)->Counters().unverified, 59u);
  for (uint64_t i = 0; i < 60; ++i) {
    if (i == 10) {
      EXPECT_EQ(GetAndCheck(**s, i).code(), absl::StatusCode::kNotFound);
    } else {
      EXPECT_TRUE(GetAndCheck(**s, i).ok()) << i;
    }
  }
  EXPECT_EQ((*s)->Counters().unverified, 0u);
  // New blocks go into the free space and do not clobber recovered ones.
  for (const auto& st : PutBlocks(**s, 100, 30)) ASSERT_TRUE(st.ok()) << st;
  for (uint64_t i = 0; i < 60; ++i) {
    if (i == 10) continue;
    EXPECT_TRUE(GetAndCheck(**s, i).ok()) << i;
  }
  for (uint64_t i = 100; i < 130; ++i) EXPECT_TRUE(GetAndCheck(**s, i).ok()) << i;
}

// The write storm of KillNineDuringWriteStorm: runs only in the child process that test execs
// (STRATA_NVME_STORM_DIR set). Writes batches of blocks forever, appending each committed index
// to committed.log after the Put returns, and writes one byte to fd STRATA_NVME_STORM_FD once
// 40 blocks are committed.
constexpr int kStormBatch = 4;

// The write-storm child: the parent re-executes this binary with STRATA_NVME_STORM_DIR set, and
// this runs before main() and never returns (it is killed, or _exits on an error).
[[noreturn]] void RunStormChild(const char* dir_env) {
  const std::string dir = dir_env;
  const int ready_fd = std::atoi(std::getenv("STRATA_NVME_STORM_FD"));
  NvmeBlockStoreOptions o;
  o.tier.files = {{dir + "/tier0.dat", 256 << 20}};
  o.tier.queue_depth = 8;
  o.catalog_path = dir + "/catalog";
  auto s = NvmeBlockStore::Open(o);
  if (!s.ok()) _exit(2);
  int fd = open((dir + "/committed.log").c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  bool signalled = false;
  for (uint64_t i = 0;; i += kStormBatch) {
    auto sts = PutBlocks(**s, i, kStormBatch);
    for (int k = 0; k < kStormBatch; ++k) {
      if (!sts[k].ok()) _exit(3);
      uint32_t rec = static_cast<uint32_t>(i + k);
      if (write(fd, &rec, sizeof(rec)) != sizeof(rec)) _exit(4);
    }
    if (!signalled && i >= 40) {
      char c = 1;
      (void)!write(ready_fd, &c, 1);
      signalled = true;
    }
    if (i > 200000) _exit(5);
  }
}

[[maybe_unused]] const bool kStormChild = [] {
  if (const char* dir = std::getenv("STRATA_NVME_STORM_DIR")) RunStormChild(dir);
  return false;
}();

// A child process (this test binary, exec'd fresh so no thread state is inherited) writes blocks
// in a loop and logs each committed index; the parent SIGKILLs it mid-storm, reopens, and checks
// the catalog against the log.
TEST(NvmeBlockStore, KillNineDuringWriteStorm) {
  TempDir dir;
  const std::string log = dir.Sub("committed.log");
  const int batch = kStormBatch;
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  // Everything the child needs is built before fork: between fork and exec it only calls
  // async-signal-safe functions.
  std::string self = std::filesystem::read_symlink("/proc/self/exe");
  std::string filter = "--gtest_list_tests";  // never reached: the child runs before main()
  std::vector<std::string> env_strings = {"STRATA_NVME_STORM_DIR=" + dir.path(),
                                          "STRATA_NVME_STORM_FD=" + std::to_string(ready[1])};
  for (char** e = environ; *e; ++e) env_strings.emplace_back(*e);
  std::vector<char*> envp;
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  char* argv[] = {self.data(), filter.data(), nullptr};
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(ready[0]);
    execve(self.c_str(), argv, envp.data());
    _exit(127);
  }
  close(ready[1]);
  char c;
  ASSERT_EQ(read(ready[0], &c, 1), 1) << "child failed before committing";
  std::this_thread::sleep_for(std::chrono::milliseconds(150));  // mid-storm
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status)) << "child exited with " << WEXITSTATUS(status);
  close(ready[0]);

  std::vector<uint32_t> committed;
  {
    int fd = open(log.c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    uint32_t rec;
    while (read(fd, &rec, sizeof(rec)) == sizeof(rec)) committed.push_back(rec);
    close(fd);
  }
  ASSERT_GE(committed.size(), 40u);
  uint32_t max_reported = 0;
  for (uint32_t r : committed) max_reported = std::max(max_reported, r);

  auto s = NvmeBlockStore::Open(StoreOptions(dir, 256 << 20));
  ASSERT_TRUE(s.ok()) << s.status();
  const auto& rep = (*s)->recovery();
  EXPECT_EQ(rep.dropped_missing_extent + rep.dropped_overlapping + rep.dropped_undecodable, 0u);
  // Every block the child reported is there and reads back with a good CRC and the right bytes.
  for (uint32_t r : committed) ASSERT_TRUE(GetAndCheck(**s, r).ok()) << r;
  // Nothing else: at most the batch that committed just before the kill was not yet logged.
  absl::flat_hash_set<BlockId> reported;
  for (uint32_t r : committed) reported.insert(IdOf(r));
  uint64_t extra = 0;
  for (const BlockId& id : (*s)->Ids()) {
    if (reported.contains(id)) continue;
    ++extra;
    bool known = false;
    for (uint64_t i = max_reported + 1; i <= max_reported + batch; ++i) {
      if (IdOf(i) == id) {
        known = true;
        EXPECT_TRUE(GetAndCheck(**s, i).ok()) << "torn block " << i;
      }
    }
    EXPECT_TRUE(known) << "unexpected block " << id.ShortHex();
  }
  EXPECT_LE(extra, static_cast<uint64_t>(batch));
  EXPECT_EQ((*s)->Counters().crc_failures, 0u);
  RecordProperty("committed_before_kill", std::to_string(committed.size()));
}

TEST(NvmeBlockStore, CorruptionIsDetectedOnFirstReadAndDropped) {
  TempDir dir;
  CatalogEntry victim;
  {
    auto s = NvmeBlockStore::Open(StoreOptions(dir));
    ASSERT_TRUE(s.ok()) << s.status();
    for (const auto& st : PutBlocks(**s, 0, 10)) ASSERT_TRUE(st.ok()) << st;
    victim = *(*s)->Lookup(IdOf(6));
  }
  {
    // Flip bytes in the middle of block 6's extent, behind the tier's back.
    int fd = open(dir.Sub("tier0.dat").c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    char junk[16];
    std::memset(junk, 0x5A, sizeof(junk));
    ASSERT_EQ(pwrite(fd, junk, sizeof(junk), victim.offset + victim.size / 2), 16);
    fsync(fd);
    close(fd);
  }
  {
    auto s = NvmeBlockStore::Open(StoreOptions(dir));
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ((*s)->recovery().entries_kept, 10u);
    absl::Status st = GetAndCheck(**s, 6);
    EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
    EXPECT_EQ((*s)->Counters().crc_failures, 1u);
    EXPECT_FALSE((*s)->Lookup(IdOf(6)).has_value());
    EXPECT_EQ(GetAndCheck(**s, 6).code(), absl::StatusCode::kNotFound);  // never served
    for (uint64_t i = 0; i < 10; ++i) {
      if (i == 6) continue;
      EXPECT_TRUE(GetAndCheck(**s, i).ok()) << i;
    }
  }
  auto s = NvmeBlockStore::Open(StoreOptions(dir));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->recovery().entries_loaded, 9u);  // the drop reached the catalog
}

TEST(NvmeBlockStore, EntriesWhoseExtentIsMissingAreDroppedAtStart) {
  TempDir dir;
  std::vector<uint64_t> in_file0, in_file1;
  {
    auto s = NvmeBlockStore::Open(StoreOptions(dir, 16 << 20, 2));
    ASSERT_TRUE(s.ok()) << s.status();
    for (const auto& st : PutBlocks(**s, 0, 40)) ASSERT_TRUE(st.ok()) << st;
    for (uint64_t i = 0; i < 40; ++i) {
      (*s)->Lookup(IdOf(i))->file_index == 0 ? in_file0.push_back(i) : in_file1.push_back(i);
    }
  }
  ASSERT_FALSE(in_file0.empty());
  ASSERT_FALSE(in_file1.empty());
  // File 1 removed; file 0 cut short so its upper blocks vanish.
  std::filesystem::remove(dir.Sub("tier1.dat"));
  uint64_t cut = 1 << 20;
  ASSERT_EQ(truncate(dir.Sub("tier0.dat").c_str(), cut), 0);
  uint64_t lost0 = 0;
  {
    auto cat = Catalog::Open(dir.Sub("catalog"));
    ASSERT_TRUE(cat.ok());
    for (uint64_t i : in_file0) {
      auto e = (*cat)->Get(IdOf(i));
      ASSERT_TRUE(e.ok());
      if (e->offset + NvmeTier::RoundUp(e->size) > cut) ++lost0;
    }
  }
  ASSERT_GT(lost0, 0u);
  auto s = NvmeBlockStore::Open(StoreOptions(dir, 16 << 20, 2));
  ASSERT_TRUE(s.ok()) << s.status();
  const auto& rep = (*s)->recovery();
  EXPECT_EQ(rep.entries_loaded, 40u);
  EXPECT_EQ(rep.dropped_missing_extent, in_file1.size() + lost0);
  EXPECT_EQ(rep.entries_kept, in_file0.size() - lost0);
  for (uint64_t i : in_file1) EXPECT_EQ(GetAndCheck(**s, i).code(), absl::StatusCode::kNotFound);
  for (uint64_t i : in_file0) {
    absl::Status st = GetAndCheck(**s, i);
    EXPECT_TRUE(st.ok() || st.code() == absl::StatusCode::kNotFound) << st;
  }
  EXPECT_EQ((*s)->Counters().crc_failures, 0u);
}

TEST(NvmeBlockStore, OverlappingAndUndecodableEntriesAreDroppedAtStart) {
  TempDir dir;
  {
    auto s = NvmeBlockStore::Open(StoreOptions(dir));
    ASSERT_TRUE(s.ok()) << s.status();
    for (const auto& st : PutBlocks(**s, 0, 5)) ASSERT_TRUE(st.ok()) << st;
  }
  {
    auto cat = Catalog::Open(dir.Sub("catalog"));
    ASSERT_TRUE(cat.ok());
    CatalogEntry e = *(*cat)->Get(IdOf(2));
    e.offset += 4096;  // overlaps block 2 (and maybe 3)
    ASSERT_TRUE((*cat)->Put(IdOf(777), e).ok());
  }
  auto s = NvmeBlockStore::Open(StoreOptions(dir));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->recovery().dropped_overlapping, 1u);
  EXPECT_EQ((*s)->recovery().entries_kept, 5u);
  for (uint64_t i = 0; i < 5; ++i) EXPECT_TRUE(GetAndCheck(**s, i).ok()) << i;
}

TEST(NvmeBlockStore, DiskFullIsResourceExhaustedAndServingContinues) {
  TempDir dir;
  auto s = NvmeBlockStore::Open(StoreOptions(dir, 1 << 20));
  ASSERT_TRUE(s.ok()) << s.status();
  auto sts = PutBlocks(**s, 0, 40);  // ~6 MiB into 1 MiB
  size_t ok = 0;
  absl::Status full;
  for (const auto& st : sts) {
    if (st.ok())
      ++ok;
    else
      full = st;
  }
  EXPECT_GT(ok, 0u);
  EXPECT_LT(ok, 40u);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_NE(full.message().find(dir.Sub("tier0.dat")), std::string::npos) << full;
  EXPECT_LE((*s)->Counters().used_bytes, uint64_t{1} << 20);
  EXPECT_EQ(std::filesystem::file_size(dir.Sub("tier0.dat")), uint64_t{1} << 20);
  for (uint64_t i = 0; i < 40; ++i) {
    if (sts[i].ok()) {
      EXPECT_TRUE(GetAndCheck(**s, i).ok()) << i;
    } else {
      EXPECT_EQ(GetAndCheck(**s, i).code(), absl::StatusCode::kNotFound);
    }
  }
}

}  // namespace
}  // namespace strata
