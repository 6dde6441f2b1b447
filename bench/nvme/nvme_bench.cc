// nvme_bench: NVMe-tier write and read throughput against fio (ioengine=io_uring, direct=1)
// at the same block size, queue depth, bytes, filesystem and file, measured back to back in the
// same run; plus the time to reopen a store whose catalog holds 100k blocks.
//
//   nvme_bench [--dir /tmp] [--sizes 131072,...] [--qd 1,4,16] [--bytes N] [--repeat 5]
//              [--reads 1] [--fio-flags "..."] [--ab-ring] [--memory 4k|thp|hugetlb] [--json]
//              [--smoke]
//
// Each (block size, queue depth) point runs `repeat` rounds. A round:
//   write: the tier writes every block of a fresh preallocated file T with O_DIRECT (no
//          fdatasync, as fio does none); fio writes a fresh file F sequentially (rw=write) and
//          F is removed. The two writes run in alternating order from round to round.
//   read:  `reads` times: the tier reads every block of T once, in a random order (a fresh
//          permutation each time); fio does rw=randread over the same file T (its random map
//          also reads every block once). Same file, so the same on-disk layout and the same cache
//          state below the guest (O_DIRECT bypasses the guest page cache for both). The order
//          of tier and fio alternates.
// Memory (--memory): the tier reads into fresh memory of the named kind each time, fio into its
// own buffers of the same kind where fio has one: 4k (default: 4 KiB pages vs fio's malloc),
// hugetlb (reserved 2 MiB pages vs fio --iomem=shmhuge; needs vm.nr_hugepages, which
// --reserve-huge-pages sets for the run), thp (tier only). On a virtual disk the
// physical layout of that memory (segments per I/O) moves throughput by up to 2x; the read
// samples show the destination's contiguous runs per buffer when /proc/self/pagemap is readable.
// Reported per point: the median (and best) of the samples for each side, ratio = tier / fio
// of the medians, and for reads a pass/fail against the 0.90 target. CPU time per operation is
// taken from getrusage for the tier (the io_uring engine runs in the calling thread) and from
// fio's usr_cpu/sys_cpu (different accounting: compare trends, not single values).
#include <fcntl.h>
#include <liburing.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/nvme/fio.h"
#include "common/status_macros.h"
#include "storage/nvme_tier.h"

namespace strata {
namespace {

namespace fio = strata::bench::fio;

constexpr double kReadTarget = 0.90;

// One measured run: MiB/s and CPU microseconds per operation (-1: unknown).
struct Sample {
  double mibps = -1;
  double cpu_us_per_op = -1;
  double segments = -1;  // tier: physically contiguous runs per destination buffer
};

struct Series {
  std::vector<Sample> runs;
  double Median() const {
    std::vector<double> v;
    for (const auto& s : runs) v.push_back(s.mibps);
    if (v.empty()) return -1;
    std::sort(v.begin(), v.end());
    size_t n = v.size();
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  }
  double Best() const {
    double b = -1;
    for (const auto& s : runs) b = std::max(b, s.mibps);
    return b;
  }
  double MedianCpu() const {
    std::vector<double> v;
    for (const auto& s : runs)
      if (s.cpu_us_per_op >= 0) v.push_back(s.cpu_us_per_op);
    if (v.empty()) return -1;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  }
  std::string Numbers(bool segments = false) const {  // JSON array body
    std::vector<std::string> parts;
    for (const auto& s : runs)
      parts.push_back(absl::StrFormat("%.1f", segments ? s.segments : s.mibps));
    return absl::StrJoin(parts, ", ");
  }
  std::string List() const {
    std::vector<std::string> parts;
    for (const auto& s : runs) {
      parts.push_back(s.segments < 0 ? absl::StrFormat("%.1f", s.mibps)
                                     : absl::StrFormat("%.1f/%.0fseg", s.mibps, s.segments));
    }
    return absl::StrJoin(parts, ", ");
  }
};

struct Row {
  uint64_t block = 0;
  uint32_t qd = 0;
  Series tier_write, fio_write, tier_read, fio_read;
  Series plain_read;  // --ab-ring: the tier with plain io_uring rings (no setup flags)
};

double Ratio(double a, double b) { return a > 0 && b > 0 ? a / b : -1.0; }

Sample RunFio(const std::string& file, const std::string& rw, uint64_t bs, uint32_t qd,
              uint64_t bytes, const std::string& extra) {
  const fio::Result r = fio::Run(file, rw, bs, qd, bytes, extra);
  Sample s;
  s.mibps = r.mibps;
  s.cpu_us_per_op = r.mibps > 0 ? r.cpu_us_per_op : -1;
  return s;
}

double ThreadCpuSeconds() {
  rusage ru{};
  getrusage(RUSAGE_THREAD, &ru);
  return double(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         double(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

// What memory the reads land in, on both sides.
//   k4k:     4 KiB pages (MADV_NOHUGEPAGE) vs fio's malloc'ed buffers (THP is "madvise" here).
//   kThp:    transparent huge pages (MADV_HUGEPAGE) for the tier only: fio has no THP option.
//   kHugetlb: reserved 2 MiB pages (MAP_HUGETLB) vs fio --iomem=shmhuge (SHM_HUGETLB): the
//            memory stratad's arena gets when huge pages are reserved (UCX's sysv/posix
//            allocators use them, as does arena: mmap with huge_pages), like for like.
enum class Memory { k4k, kThp, kHugetlb };

const char* MemoryName(Memory m) {
  return m == Memory::k4k ? "4k" : m == Memory::kThp ? "thp" : "hugetlb";
}

uint64_t FreeHugePages() {
  FILE* f = std::fopen("/proc/meminfo", "r");
  if (!f) return 0;
  char line[256];
  unsigned long long n = 0;
  while (std::fgets(line, sizeof(line), f)) {
    if (std::sscanf(line, "HugePages_Free: %llu", &n) == 1) break;
  }
  std::fclose(f);
  return n;
}

// Buffers for the tier's I/O, 2 MiB aligned, of the kind `memory` names.
struct AlignedPool {
  AlignedPool(size_t n, size_t bytes, Memory memory, bool fill = true) : n(n), bytes(bytes) {
    size_t total = n * bytes, align = size_t{2} << 20;
    if (memory == Memory::kHugetlb) {
      map_bytes = (total + align - 1) & ~(align - 1);
      void* p = mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
      if (p == MAP_FAILED) {
        std::fprintf(stderr, "nvme_bench: MAP_HUGETLB of %zu bytes failed: %s\n", map_bytes,
                     std::strerror(errno));
        std::abort();
      }
      map = p;
      base = static_cast<std::byte*>(p);
    } else {
      map_bytes = total + align;
      void* p =
          mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) std::abort();
      map = p;
      base =
          reinterpret_cast<std::byte*>((reinterpret_cast<uintptr_t>(p) + align - 1) & ~(align - 1));
      madvise(base, total, memory == Memory::kThp ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    }
    if (!fill) return;
    uint64_t pattern = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < total; i += 8) std::memcpy(base + i, &pattern, 8), pattern += 0x51;
  }
  ~AlignedPool() { munmap(map, map_bytes); }
  std::byte* at(size_t i) const { return base + (i % n) * bytes; }
  // Mean number of physically contiguous runs per buffer (what a scatter list of one I/O
  // needs), from /proc/self/pagemap; -1 when page frame numbers are not readable (not root).
  double SegmentsPerBuffer() const {
    int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    uint64_t pages = bytes / 4096, runs = 0;
    std::vector<uint64_t> e(pages);
    for (size_t b = 0; b < n; ++b) {
      off_t off = off_t(reinterpret_cast<uintptr_t>(at(b)) / 4096 * 8);
      if (pread(fd, e.data(), pages * 8, off) != ssize_t(pages * 8)) return close(fd), -1;
      for (uint64_t p = 0; p < pages; ++p) {
        uint64_t pfn = e[p] & ((uint64_t{1} << 55) - 1);
        if (pfn == 0) return close(fd), -1;
        if (p == 0 || pfn != (e[p - 1] & ((uint64_t{1} << 55) - 1)) + 1) ++runs;
      }
    }
    close(fd);
    return double(runs) / double(n);
  }
  size_t n, bytes, map_bytes;
  void* map;
  std::byte* base;
};

// A tier holding one file of `bytes`, written block by block.
class TierRun {
 public:
  static absl::StatusOr<std::unique_ptr<TierRun>> Create(const std::string& path, uint64_t bs,
                                                         uint32_t qd, uint64_t bytes, Memory memory,
                                                         uint32_t dst_buffers) {
    std::filesystem::remove(path);
    auto r = std::unique_ptr<TierRun>(new TierRun(path, bs, qd, bytes, memory));
    r->dst_buffers_ = dst_buffers;
    STRATA_ASSIGN_OR_RETURN(r->tier_, NvmeTier::Open(r->Options(true)));
    return r;
  }
  NvmeTierOptions Options(bool taskrun_flags) const {
    NvmeTierOptions o;
    o.files = {{path_, bytes_}};
    o.queue_depth = qd_;
    o.staging_buffers = std::max<uint32_t>(qd_, 4);
    o.staging_buffer_bytes = std::min<uint64_t>(bs_, 4 << 20);
    o.sync_after_write = false;
    o.io_uring_taskrun_flags = taskrun_flags;
    return o;
  }
  // A second tier on the same (already written) file with plain rings, for --ab-ring.
  absl::Status OpenPlain() {
    STRATA_ASSIGN_OR_RETURN(plain_, NvmeTier::Open(Options(false)));
    return absl::OkStatus();
  }
  ~TierRun() {
    plain_.reset();
    tier_.reset();
    std::filesystem::remove(path_);
  }
  std::string Backend() const {
    uint32_t f = tier_->io_uring_setup_flags();
    return absl::StrFormat("%s%s%s+fixedfiles%s%s", NvmeIoBackendName(tier_->io_backend()),
                           tier_->direct_io() ? "+O_DIRECT" : "+buffered",
                           tier_->registered_buffers() ? "+fixedbufs(staging)" : "",
                           f & IORING_SETUP_COOP_TASKRUN ? "+coop_taskrun" : "",
                           f & IORING_SETUP_DEFER_TASKRUN ? "+single_issuer+defer_taskrun" : "");
  }

  absl::StatusOr<Sample> Write() {
    size_t nblocks = bytes_ / bs_;
    writes_.assign(nblocks, {});
    for (size_t i = 0; i < nblocks; ++i) writes_[i].data = {pool_.at(i), bs_};
    double c0 = ThreadCpuSeconds();
    absl::Time t0 = absl::Now();
    auto ws = tier_->Write(writes_);
    double secs = absl::ToDoubleSeconds(absl::Now() - t0);
    double cpu = ThreadCpuSeconds() - c0;
    for (const auto& s : ws) STRATA_RETURN_IF_ERROR(s);
    return Sample{double(nblocks * bs_) / secs / (1 << 20), cpu * 1e6 / double(nblocks)};
  }

  absl::StatusOr<Sample> Read(uint64_t seed, bool plain = false) {
    NvmeTier& tier = plain ? *plain_ : *tier_;
    size_t nblocks = writes_.size();
    std::vector<size_t> order(nblocks);
    for (size_t i = 0; i < nblocks; ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), std::mt19937_64(seed));
    // Fresh destination memory per run, as each fio run allocates its own buffers.
    AlignedPool dst(dst_buffers_ ? dst_buffers_ : std::max<uint32_t>(qd_, 1), bs_, memory_);
    std::vector<NvmeReadReq> reads(nblocks);
    for (size_t i = 0; i < nblocks; ++i) reads[i] = {writes_[order[i]].extent, {dst.at(i), bs_}};
    double c0 = ThreadCpuSeconds();
    absl::Time t0 = absl::Now();
    auto rs = tier.Read(reads);
    double secs = absl::ToDoubleSeconds(absl::Now() - t0);
    double cpu = ThreadCpuSeconds() - c0;
    for (const auto& s : rs) STRATA_RETURN_IF_ERROR(s);
    return Sample{double(nblocks * bs_) / secs / (1 << 20), cpu * 1e6 / double(nblocks),
                  dst.SegmentsPerBuffer()};
  }

 private:
  TierRun(std::string path, uint64_t bs, uint32_t qd, uint64_t bytes, Memory memory)
      : path_(std::move(path)),
        bs_(bs),
        bytes_(bytes),
        qd_(qd),
        memory_(memory),
        pool_(std::max<uint32_t>(qd, 1) * 2, bs, memory) {}
  std::string path_;
  uint64_t bs_, bytes_;
  uint32_t qd_;
  Memory memory_;
  uint32_t dst_buffers_ = 0;
  AlignedPool pool_;
  std::unique_ptr<NvmeTier> tier_, plain_;
  std::vector<NvmeWriteReq> writes_;
};

struct CatalogTiming {
  uint64_t entries = 0;
  double first_open_s = 0;   // WAL replay (right after the writes)
  double second_open_s = 0;  // from SST files (RocksDB flushed the recovered WAL)
  uint64_t kept = 0;
};

absl::StatusOr<CatalogTiming> TimeCatalogReopen(const std::string& dir, uint64_t entries) {
  CatalogTiming t;
  t.entries = entries;
  NvmeBlockStoreOptions o;
  o.tier.files = {{dir + "/cat_tier.dat", entries * kNvmeAlignment}};
  o.catalog_path = dir + "/catalog";
  {
    auto tier = NvmeTier::Open(o.tier);  // preallocates the file the entries point into
    if (!tier.ok()) return tier.status();
    CatalogOptions co;
    co.sync_writes = false;
    auto cat = Catalog::Open(o.catalog_path, co);
    if (!cat.ok()) return cat.status();
    std::vector<std::pair<BlockId, CatalogEntry>> batch;
    for (uint64_t i = 0; i < entries; ++i) {
      Sha256 h;
      h.U64(i);
      CatalogEntry e;
      e.ns = h.Finish();
      e.file_index = 0;
      e.offset = i * kNvmeAlignment;
      e.size = kNvmeAlignment;
      e.crc32c = static_cast<uint32_t>(i);
      e.parent = e.ns;
      Sha256 k;
      k.U64(i + (uint64_t{1} << 40));
      batch.emplace_back(k.Finish(), e);
      if (batch.size() == 10000 || i + 1 == entries) {
        STRATA_RETURN_IF_ERROR((*cat)->PutBatch(batch));
        batch.clear();
      }
    }
  }
  for (int pass = 0; pass < 2; ++pass) {
    absl::Time t0 = absl::Now();
    auto store = NvmeBlockStore::Open(o);
    double secs = absl::ToDoubleSeconds(absl::Now() - t0);
    if (!store.ok()) return store.status();
    (pass == 0 ? t.first_open_s : t.second_open_s) = secs;
    t.kept = (*store)->recovery().entries_kept;
  }
  std::filesystem::remove_all(o.catalog_path);
  std::filesystem::remove(o.tier.files[0].path);
  return t;
}

// One round of a point: writes (alternating order), then reads of the tier's file.
absl::Status RunRound(const std::string& work, uint64_t bs, uint32_t qd, uint64_t bytes, int round,
                      int reads, Memory memory, uint32_t dst_buffers, bool ab_ring, bool fio,
                      const std::string& fio_flags, Row& row, std::string* backend) {
  std::string tier_path = work + "/tier.dat", fio_path = work + "/fio.dat";
  STRATA_ASSIGN_OR_RETURN(auto tier,
                          TierRun::Create(tier_path, bs, qd, bytes, memory, dst_buffers));
  *backend = tier->Backend();
  bool tier_first = round % 2 == 0;
  auto fio_write = [&] {
    std::filesystem::remove(fio_path);
    row.fio_write.runs.push_back(RunFio(fio_path, "write", bs, qd, bytes, fio_flags));
    std::filesystem::remove(fio_path);
  };
  if (fio && !tier_first) fio_write();
  STRATA_ASSIGN_OR_RETURN(Sample w, tier->Write());
  row.tier_write.runs.push_back(w);
  if (fio && tier_first) fio_write();
  auto fio_read = [&] {
    row.fio_read.runs.push_back(RunFio(tier_path, "randread", bs, qd, bytes, fio_flags));
  };
  if (ab_ring) STRATA_RETURN_IF_ERROR(tier->OpenPlain());
  for (int k = 0; k < reads; ++k) {
    bool tier_reads_first = (round + k) % 2 == 0;
    uint64_t seed = 1000 + round * 100 + k;
    auto plain_read = [&]() -> absl::Status {
      STRATA_ASSIGN_OR_RETURN(Sample p, tier->Read(seed, /*plain=*/true));
      row.plain_read.runs.push_back(p);
      return absl::OkStatus();
    };
    if (fio && !tier_reads_first) fio_read();
    if (ab_ring && !tier_reads_first) STRATA_RETURN_IF_ERROR(plain_read());
    STRATA_ASSIGN_OR_RETURN(Sample r, tier->Read(seed));
    row.tier_read.runs.push_back(r);
    if (ab_ring && tier_reads_first) STRATA_RETURN_IF_ERROR(plain_read());
    if (fio && tier_reads_first) fio_read();
  }
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  CLI::App app{"nvme_bench: NVMe tier vs fio (io_uring, O_DIRECT), catalog reopen time"};
  std::string dir = "/tmp";
  std::vector<uint64_t> sizes = {128 << 10, 256 << 10, 512 << 10, 1 << 20, 2 << 20, 4 << 20};
  std::vector<uint32_t> qds = {1, 4, 16};
  uint64_t bytes = uint64_t{512} << 20;
  uint64_t catalog_entries = 100000;
  int repeat = 5;
  int reads = 1;
  std::string fio_flags;
  bool json = false, smoke = false, no_fio = false, huge = false, ab_ring = false;
  bool reserve_huge = false;
  uint32_t dst_buffers = 0;
  std::string memory_name = "4k";
  app.add_option("--dir", dir, "directory (filesystem) for the tier file and fio's file");
  app.add_option("--sizes", sizes, "block sizes in bytes")->delimiter(',');
  app.add_option("--qd", qds, "queue depths")->delimiter(',');
  app.add_option("--bytes", bytes, "bytes written and read per run");
  app.add_option("--repeat", repeat,
                 "rounds per point, tier and fio alternating; medians are compared")
      ->check(CLI::Range(1, 99));
  app.add_option("--reads", reads,
                 "read pairs (tier, fio; alternating) per round, on the round's file")
      ->check(CLI::Range(1, 99));
  app.add_option("--fio-flags", fio_flags,
                 "extra fio options for both jobs (e.g. \"--fixedbufs --registerfiles\")");
  app.add_option("--catalog-entries", catalog_entries, "catalog size for the reopen timing");
  app.add_flag("--json", json, "print JSON instead of a table");
  app.add_flag("--smoke", smoke, "128 KiB and 1 MiB at QD 1 and 16, 32 MiB, one round");
  app.add_flag("--no-fio", no_fio, "tier only");
  app.add_flag("--ab-ring", ab_ring,
               "also read with plain io_uring rings (no setup flags): the engine before");
  app.add_option("--memory", memory_name,
                 "memory reads land in: 4k (vs fio malloc), hugetlb (vs fio --iomem=shmhuge), "
                 "thp (tier only)")
      ->check(CLI::IsMember({"4k", "thp", "hugetlb"}));
  app.add_option("--dst-buffers", dst_buffers,
                 "read destinations cycle over this many block buffers (0: qd of them, as fio's "
                 "iodepth buffers; a large number spreads reads over memory like the arena)");
  app.add_flag("--huge-pages", huge, "same as --memory thp (kept for old command lines)");
  app.add_flag("--reserve-huge-pages", reserve_huge,
               "with --memory hugetlb: raise vm.nr_hugepages for the run (root), restore after");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  Memory memory = memory_name == "hugetlb"         ? Memory::kHugetlb
                  : (memory_name == "thp" || huge) ? Memory::kThp
                                                   : Memory::k4k;
  bool fio = !no_fio && fio::Available();
  if (memory == Memory::kThp && fio) {
    std::fprintf(stderr,
                 "nvme_bench: --memory thp has no fio counterpart; fio reads into malloc'ed "
                 "4 KiB pages (not like for like)\n");
  }
  if (memory == Memory::kHugetlb) {
    if (fio_flags.find("--iomem") == std::string::npos) {
      fio_flags += std::string(fio_flags.empty() ? "" : " ") + "--iomem=shmhuge";
    }
  }
  if (smoke) {
    if (!fio && !no_fio) {
      std::fprintf(stderr, "nvme_bench: fio not found; smoke skipped\n");
      return 77;
    }
    sizes = {128 << 10, 1 << 20};
    qds = {1, 16};
    bytes = 32 << 20;
    repeat = 1;
    catalog_entries = std::min<uint64_t>(catalog_entries, 20000);
  }
  std::string fio_version = fio ? fio::Version() : "";
  // Huge pages needed at once: the tier's write pool and read destination (2 x qd buffers each)
  // plus fio's qd buffers, at the largest point.
  std::string saved_nr_hugepages;
  auto restore_huge_pages = [&] {
    if (saved_nr_hugepages.empty()) return;
    if (FILE* f = std::fopen("/proc/sys/vm/nr_hugepages", "w")) {
      std::fputs(saved_nr_hugepages.c_str(), f);
      std::fclose(f);
    }
    saved_nr_hugepages.clear();
  };
  if (memory == Memory::kHugetlb) {
    uint64_t need = 0;
    for (uint64_t bs : sizes) {
      for (uint32_t qd : qds) {
        uint64_t per = (2 * 2 * std::max<uint32_t>(qd, 1) + qd) * bs;
        need = std::max<uint64_t>(need, per / (2 << 20) + 4 * 3);
      }
    }
    if (reserve_huge && FreeHugePages() < need) {
      FILE* f = std::fopen("/proc/sys/vm/nr_hugepages", "r");
      char buf[32] = {0};
      if (f && std::fgets(buf, sizeof(buf), f)) saved_nr_hugepages = buf;
      if (f) std::fclose(f);
      uint64_t total = std::strtoull(buf, nullptr, 10) + need - FreeHugePages();
      f = std::fopen("/proc/sys/vm/nr_hugepages", "w");
      if (f) std::fprintf(f, "%llu\n", (unsigned long long)total), std::fclose(f);
    }
    if (FreeHugePages() < need) {
      std::fprintf(stderr,
                   "nvme_bench: --memory hugetlb needs %llu free 2 MiB huge pages, %llu are free "
                   "(echo N > /proc/sys/vm/nr_hugepages, or --reserve-huge-pages as root)\n",
                   (unsigned long long)need, (unsigned long long)FreeHugePages());
      restore_huge_pages();
      return 2;
    }
  }
  std::string tmpl = dir + "/strata_nvme_bench.XXXXXX";
  if (!mkdtemp(tmpl.data())) {
    std::perror("mkdtemp");
    restore_huge_pages();
    return 1;
  }
  std::string work = tmpl;
  std::vector<Row> rows;
  std::string backend;
  int rc = 0;
  for (uint64_t bs : sizes) {
    for (uint32_t qd : qds) {
      uint64_t run_bytes = std::max<uint64_t>(bytes / bs, 8) * bs;
      Row row;
      row.block = bs;
      row.qd = qd;
      absl::Status st;
      for (int round = 0; round < repeat && st.ok(); ++round) {
        st = RunRound(work, bs, qd, run_bytes, round, reads, memory, dst_buffers, ab_ring, fio,
                      fio_flags, row, &backend);
      }
      if (!st.ok()) {
        std::fprintf(stderr, "nvme_bench: tier run failed: %s\n",
                     std::string(st.message()).c_str());
        rc = 1;
        break;
      }
      rows.push_back(row);
      if (!json) {
        std::fprintf(stderr, "  %7llu KiB QD %2u  read tier [%s]  fio [%s]\n",
                     (unsigned long long)(bs >> 10), qd, row.tier_read.List().c_str(),
                     row.fio_read.List().c_str());
      }
    }
    if (rc) break;
  }
  restore_huge_pages();
  auto cat = TimeCatalogReopen(work, catalog_entries);
  std::filesystem::remove_all(work);
  if (!cat.ok()) {
    std::fprintf(stderr, "nvme_bench: catalog timing failed: %s\n",
                 std::string(cat.status().message()).c_str());
    rc = 1;
  }
  int passed = 0, compared = 0;
  std::vector<std::string> failed;
  for (const Row& r : rows) {
    double q = Ratio(r.tier_read.Median(), r.fio_read.Median());
    if (q < 0) continue;
    ++compared;
    if (q >= kReadTarget) {
      ++passed;
    } else {
      failed.push_back(absl::StrFormat("%lluKiB/QD%u", (unsigned long long)(r.block >> 10), r.qd));
    }
  }
  if (json) {
    std::printf(
        "{\"dir\": \"%s\", \"backend\": \"%s\", \"fio\": %s, \"fio_version\": \"%s\", "
        "\"fio_flags\": \"%s\", \"repeat\": %d, \"reads\": %d, \"memory\": \"%s\", "
        "\"read_target\": %.2f, \"rows\": [",
        dir.c_str(), backend.c_str(), fio ? "true" : "false", fio_version.c_str(),
        fio_flags.c_str(), repeat, reads, MemoryName(memory), kReadTarget);
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      double rq = Ratio(r.tier_read.Median(), r.fio_read.Median());
      std::printf(
          "%s{\"block_bytes\": %llu, \"qd\": %u, \"tier_write_mibps\": %.1f, "
          "\"fio_write_mibps\": %.1f, \"write_ratio\": %.3f, \"tier_read_mibps\": %.1f, "
          "\"fio_read_mibps\": %.1f, \"read_ratio\": %.3f, \"read_best_ratio\": %.3f, "
          "\"read_pass\": %s, \"tier_read_runs\": [%s], \"fio_read_runs\": [%s], "
          "\"tier_write_runs\": [%s], \"fio_write_runs\": [%s], \"tier_read_segments\": [%s], "
          "\"tier_read_cpu_us_per_op\": %.1f, \"fio_read_cpu_us_per_op\": %.1f, "
          "\"plain_ring_read_mibps\": %.1f, \"plain_ring_read_cpu_us_per_op\": %.1f}",
          i ? ", " : "", (unsigned long long)r.block, r.qd, r.tier_write.Median(),
          r.fio_write.Median(), Ratio(r.tier_write.Median(), r.fio_write.Median()),
          r.tier_read.Median(), r.fio_read.Median(), rq,
          Ratio(r.tier_read.Best(), r.fio_read.Best()),
          rq < 0 ? "null" : (rq >= kReadTarget ? "true" : "false"), r.tier_read.Numbers().c_str(),
          r.fio_read.Numbers().c_str(), r.tier_write.Numbers().c_str(),
          r.fio_write.Numbers().c_str(), r.tier_read.Numbers(true).c_str(), r.tier_read.MedianCpu(),
          r.fio_read.MedianCpu(), r.plain_read.Median(), r.plain_read.MedianCpu());
    }
    std::printf("], \"read_points_passed\": %d, \"read_points_compared\": %d", passed, compared);
    if (cat.ok()) {
      std::printf(
          ", \"catalog\": {\"entries\": %llu, \"kept\": %llu, \"reopen_wal_s\": %.3f, "
          "\"reopen_sst_s\": %.3f}",
          (unsigned long long)cat->entries, (unsigned long long)cat->kept, cat->first_open_s,
          cat->second_open_s);
    }
    std::printf("}\n");
  } else {
    std::printf(
        "NVMe tier (%s) vs %s (io_uring, direct=1%s%s) in %s; same file for reads; "
        "memory %s;\n"
        "MiB/s, median of %d samples (%d rounds x %d reads; best in the read columns); "
        "cpu = CPU us per op (median)\n",
        backend.c_str(), fio ? fio_version.c_str() : "no fio", fio_flags.empty() ? "" : ", ",
        fio_flags.c_str(), dir.c_str(), MemoryName(memory), repeat * reads, repeat, reads);
    std::printf("%9s %3s | %8s %8s %5s | %8s %8s %5s %5s %9s %9s %4s\n", "block", "qd", "tier wr",
                "fio wr", "ratio", "tier rd", "fio rd", "ratio", "best", "tier cpu", "fio cpu", "");
    for (const Row& r : rows) {
      double rq = Ratio(r.tier_read.Median(), r.fio_read.Median());
      std::printf("%6lluKiB %3u | %8.1f %8.1f %5.2f | %8.1f %8.1f %5.2f %5.2f %9.1f %9.1f %4s\n",
                  (unsigned long long)(r.block >> 10), r.qd, r.tier_write.Median(),
                  r.fio_write.Median(), Ratio(r.tier_write.Median(), r.fio_write.Median()),
                  r.tier_read.Median(), r.fio_read.Median(), rq,
                  Ratio(r.tier_read.Best(), r.fio_read.Best()), r.tier_read.MedianCpu(),
                  r.fio_read.MedianCpu(), rq < 0 ? "" : (rq >= kReadTarget ? "ok" : "FAIL"));
      if (ab_ring) {
        std::printf("%13s | plain-ring tier read %8.1f MiB/s (%.2f of fio), %.1f cpu us/op\n", "",
                    r.plain_read.Median(), Ratio(r.plain_read.Median(), r.fio_read.Median()),
                    r.plain_read.MedianCpu());
      }
    }
    if (compared > 0) {
      std::printf("reads: %d of %d points at >= %.0f%% of fio (medians of %d samples)%s%s\n",
                  passed, compared, kReadTarget * 100, repeat * reads,
                  failed.empty() ? "" : "; below: ", absl::StrJoin(failed, " ").c_str());
    }
    if (cat.ok()) {
      std::printf(
          "catalog reopen with %llu entries: %.3f s (WAL replay), %.3f s (from SST); "
          "%llu kept (target <= 2 s)\n",
          (unsigned long long)cat->entries, cat->first_open_s, cat->second_open_s,
          (unsigned long long)cat->kept);
    }
  }
  if (cat.ok() && cat->kept != cat->entries) rc = 1;
  return rc;
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) { return strata::Main(argc, argv); }
