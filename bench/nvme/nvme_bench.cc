// nvme_bench: NVMe-tier write and read throughput against fio (ioengine=io_uring, direct=1)
// with the same block size, queue depth, bytes and filesystem, measured back to back in the same
// run; plus the time to reopen a store whose catalog holds 100k blocks.
//
//   nvme_bench [--dir /tmp] [--sizes 131072,...] [--qd 1,4,16] [--bytes N] [--repeat 3]
//              [--json] [--smoke]
//
// Write: the tier allocates extents in a fresh preallocated file and writes each block with
// O_DIRECT (no fdatasync per batch, as fio does none); fio writes sequentially to a fresh file
// (rw=write). Read: the tier reads the blocks it wrote in a random order; fio does rw=randread
// over the file it wrote. Ratios are tier / fio.
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "storage/nvme_tier.h"

namespace strata {
namespace {

struct Row {
  uint64_t block = 0;
  uint32_t qd = 0;
  double tier_write = 0, fio_write = -1, tier_read = 0, fio_read = -1;  // MiB/s; -1: not run
};

double Median(std::vector<double> v) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

bool HaveFio() { return std::system("fio --version > /dev/null 2>&1") == 0; }

// Bandwidth (bytes/s) of the "read" or "write" section of fio's JSON output, or -1.
double FioBandwidth(const std::string& json, const std::string& dir) {
  size_t sec = json.find("\"" + dir + "\" : {");
  if (sec == std::string::npos) return -1;
  size_t bw = json.find("\"bw_bytes\" : ", sec);
  if (bw == std::string::npos) return -1;
  return std::strtod(json.c_str() + bw + 13, nullptr);
}

double RunFio(const std::string& file, const std::string& rw, uint64_t bs, uint32_t qd,
              uint64_t bytes) {
  std::string cmd = absl::StrFormat(
      "fio --name=strata_cmp --filename=%s --ioengine=io_uring --direct=1 --rw=%s --bs=%d "
      "--iodepth=%d --size=%d --numjobs=1 --thread --output-format=json 2>/dev/null",
      file, rw, bs, qd, bytes);
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return -1;
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  if (pclose(p) != 0) return -1;
  return FioBandwidth(out, rw == "write" ? "write" : "read");
}

struct AlignedPool {
  AlignedPool(size_t n, size_t bytes) : n(n), bytes(bytes) {
    base = static_cast<std::byte*>(std::aligned_alloc(4096, n * bytes));
    for (size_t i = 0; i < n * bytes; ++i) base[i] = static_cast<std::byte>(i * 131 + 7);
  }
  ~AlignedPool() { std::free(base); }
  std::byte* at(size_t i) const { return base + (i % n) * bytes; }
  size_t n, bytes;
  std::byte* base;
};

absl::StatusOr<Row> RunTier(const std::string& dir, uint64_t bs, uint32_t qd, uint64_t bytes,
                            std::string* backend) {
  Row row{bs, qd};
  std::string path = dir + "/tier.dat";
  std::filesystem::remove(path);
  NvmeTierOptions o;
  o.files = {{path, bytes}};
  o.queue_depth = qd;
  o.staging_buffers = std::max<uint32_t>(qd, 4);
  o.staging_buffer_bytes = std::min<uint64_t>(bs, 4 << 20);
  o.sync_after_write = false;
  auto tier = NvmeTier::Open(o);
  if (!tier.ok()) return tier.status();
  *backend = absl::StrFormat("%s%s%s", NvmeIoBackendName((*tier)->io_backend()),
                             (*tier)->direct_io() ? "+O_DIRECT" : "+buffered",
                             (*tier)->registered_buffers() ? "+fixedbufs" : "");
  size_t nblocks = bytes / bs;
  AlignedPool pool(std::max<uint32_t>(qd, 1) * 2, bs);
  std::vector<NvmeWriteReq> writes(nblocks);
  for (size_t i = 0; i < nblocks; ++i) writes[i].data = {pool.at(i), bs};
  absl::Time t0 = absl::Now();
  auto ws = (*tier)->Write(writes);
  double secs = absl::ToDoubleSeconds(absl::Now() - t0);
  for (const auto& s : ws) if (!s.ok()) return s;
  row.tier_write = double(nblocks * bs) / secs / (1 << 20);

  std::vector<NvmeReadReq> reads(nblocks);
  std::vector<size_t> order(nblocks);
  for (size_t i = 0; i < nblocks; ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), std::mt19937_64(42));
  for (size_t i = 0; i < nblocks; ++i) {
    reads[i] = {writes[order[i]].extent, {pool.at(i), bs}};
  }
  t0 = absl::Now();
  auto rs = (*tier)->Read(reads);
  secs = absl::ToDoubleSeconds(absl::Now() - t0);
  for (const auto& s : rs) if (!s.ok()) return s;
  row.tier_read = double(nblocks * bs) / secs / (1 << 20);
  tier->reset();
  std::filesystem::remove(path);
  return row;
}

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
        RETURN_IF_ERROR((*cat)->PutBatch(batch));
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

int Main(int argc, char** argv) {
  CLI::App app{"nvme_bench: NVMe tier vs fio (io_uring, O_DIRECT), catalog reopen time"};
  std::string dir = "/tmp";
  std::vector<uint64_t> sizes = {128 << 10, 256 << 10, 512 << 10, 1 << 20, 2 << 20, 4 << 20};
  std::vector<uint32_t> qds = {1, 4, 16};
  uint64_t bytes = uint64_t{512} << 20;
  uint64_t catalog_entries = 100000;
  int repeat = 3;
  bool json = false, smoke = false, no_fio = false;
  app.add_option("--dir", dir, "directory (filesystem) for the tier file and fio's file");
  app.add_option("--sizes", sizes, "block sizes in bytes")->delimiter(',');
  app.add_option("--qd", qds, "queue depths")->delimiter(',');
  app.add_option("--bytes", bytes, "bytes written and read per run");
  app.add_option("--repeat", repeat,
                 "runs per point, tier and fio alternating; the median of each is reported")
      ->check(CLI::Range(1, 99));
  app.add_option("--catalog-entries", catalog_entries, "catalog size for the reopen timing");
  app.add_flag("--json", json, "print JSON instead of a table");
  app.add_flag("--smoke", smoke, "128 KiB and 1 MiB at QD 1 and 16, 32 MiB per run");
  app.add_flag("--no-fio", no_fio, "tier only");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  bool fio = !no_fio && HaveFio();
  if (smoke) {
    if (!fio && !no_fio) {
      std::fprintf(stderr, "nvme_bench: fio not found; smoke skipped\n");
      return 77;
    }
    sizes = {128 << 10, 1 << 20};
    qds = {1, 16};
    bytes = 32 << 20;
    repeat = 1;
  }
  std::string tmpl = dir + "/strata_nvme_bench.XXXXXX";
  if (!mkdtemp(tmpl.data())) {
    std::perror("mkdtemp");
    return 1;
  }
  std::string work = tmpl;
  std::vector<Row> rows;
  std::string backend;
  int rc = 0;
  for (uint64_t bs : sizes) {
    for (uint32_t qd : qds) {
      uint64_t run_bytes = std::max<uint64_t>(bytes / bs, 8) * bs;
      std::vector<double> tw, tr, fw, fr;
      absl::StatusOr<Row> row;
      for (int rep = 0; rep < repeat; ++rep) {
        row = RunTier(work, bs, qd, run_bytes, &backend);
        if (!row.ok()) break;
        tw.push_back(row->tier_write);
        tr.push_back(row->tier_read);
        if (fio) {
          std::string f = work + "/fio.dat";
          std::filesystem::remove(f);
          fw.push_back(RunFio(f, "write", bs, qd, run_bytes) / (1 << 20));
          fr.push_back(RunFio(f, "randread", bs, qd, run_bytes) / (1 << 20));
          std::filesystem::remove(f);
        }
      }
      if (!row.ok()) {
        std::fprintf(stderr, "nvme_bench: tier run failed: %s\n",
                     std::string(row.status().message()).c_str());
        rc = 1;
        break;
      }
      row->tier_write = Median(tw);
      row->tier_read = Median(tr);
      if (fio) {
        row->fio_write = Median(fw);
        row->fio_read = Median(fr);
      }
      rows.push_back(*row);
      if (!json) {
        std::fprintf(stderr, "  done %7llu KiB QD %2u\n", (unsigned long long)(bs >> 10), qd);
      }
    }
  }
  auto cat = TimeCatalogReopen(work, catalog_entries);
  std::filesystem::remove_all(work);
  if (!cat.ok()) {
    std::fprintf(stderr, "nvme_bench: catalog timing failed: %s\n",
                 std::string(cat.status().message()).c_str());
    rc = 1;
  }
  auto ratio = [](double a, double b) { return b > 0 ? a / b : -1.0; };
  if (json) {
    std::printf("{\"dir\": \"%s\", \"backend\": \"%s\", \"fio\": %s, \"repeat\": %d, "
                "\"rows\": [", dir.c_str(), backend.c_str(), fio ? "true" : "false", repeat);
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      std::printf(
          "%s{\"block_bytes\": %llu, \"qd\": %u, \"tier_write_mibps\": %.1f, "
          "\"fio_write_mibps\": %.1f, \"write_ratio\": %.3f, \"tier_read_mibps\": %.1f, "
          "\"fio_read_mibps\": %.1f, \"read_ratio\": %.3f}",
          i ? ", " : "", (unsigned long long)r.block, r.qd, r.tier_write, r.fio_write,
          ratio(r.tier_write, r.fio_write), r.tier_read, r.fio_read,
          ratio(r.tier_read, r.fio_read));
    }
    std::printf("]");
    if (cat.ok()) {
      std::printf(", \"catalog\": {\"entries\": %llu, \"kept\": %llu, \"reopen_wal_s\": %.3f, "
                  "\"reopen_sst_s\": %.3f}",
                  (unsigned long long)cat->entries, (unsigned long long)cat->kept,
                  cat->first_open_s, cat->second_open_s);
    }
    std::printf("}\n");
  } else {
    std::printf("NVMe tier (%s) vs fio (io_uring, direct=1) in %s; MiB/s, median of %d\n",
                backend.c_str(), dir.c_str(), repeat);
    std::printf("%9s %3s | %10s %10s %6s | %10s %10s %6s\n", "block", "qd", "tier wr",
                "fio wr", "ratio", "tier rd", "fio rd", "ratio");
    for (const Row& r : rows) {
      std::printf("%6lluKiB %3u | %10.1f %10.1f %6.2f | %10.1f %10.1f %6.2f\n",
                  (unsigned long long)(r.block >> 10), r.qd, r.tier_write, r.fio_write,
                  ratio(r.tier_write, r.fio_write), r.tier_read, r.fio_read,
                  ratio(r.tier_read, r.fio_read));
    }
    if (cat.ok()) {
      std::printf("catalog reopen with %llu entries: %.3f s (WAL replay), %.3f s (from SST); "
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
