// nvme_fetch_bench: fetches of blocks that live on the NVMe tier, through a real stratad and the
// client library, against fio randread of the same block size and depth in the same directory,
// measured in the same run.
//
//   nvme_fetch_bench [--dir /work] [--block-sizes 131072,1048576] [--set 256MiB] [--qd 1,4,16]
//                    [--repeat 3] [--memory hugetlb|4k] [--json] [--smoke]
//
// Per block size: one stratad (host tier `set` + 64 MiB, NVMe tier 4 x `set`, write-back
// without fdatasync as fio does none, admission always). A round: publish the measured set S,
// publish a filler as large as the host tier (LRU demotes S to NVMe), wait until the daemon's
// demotion counter says every block of S is down, evict the filler (so promotions need no
// demotion), then fetch S in a random order, `qd` blocks per Fetch: each Fetch promotes its
// NVMe blocks in one batched read (up to `qd` in flight) into host memory, verifies their CRCs,
// and the client copies them out over shared memory. The figure is S / wall time. Then the same
// blocks are fetched again from host memory (the ceiling of the client path), and fio reads a
// file of |S| bytes with --rw=randread --bs --iodepth=qd --direct=1 --ioengine=io_uring.
// --memory hugetlb: the daemon's arena is UCX's SysV allocation on reserved 2 MiB pages and fio
// uses --iomem=shmhuge; 4k: neither gets huge pages (UCX_*_HUGETLB_MODE=n, fio malloc).
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "bench/common/bench_util.h"
#include "bench/nvme/fio.h"
#include "strata/client.h"

namespace {

using strata::bench::Clock;
using strata::bench::ReadFile;
using strata::bench::Seconds;

struct Point {
  size_t block = 0;
  uint32_t qd = 0;
  std::vector<double> nvme_mibps, host_mibps, fio_mibps;
};

double Median(std::vector<double> v) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::string List(const std::vector<double>& v) {
  std::vector<std::string> p;
  for (double x : v) p.push_back(absl::StrFormat("%.1f", x));
  return absl::StrJoin(p, ", ");
}

double RunFio(const std::string& file, size_t bs, uint32_t qd, uint64_t bytes, bool huge) {
  return strata::bench::fio::Run(file, "randread", bs, qd, bytes, huge ? "--iomem=shmhuge" : "")
      .mibps;
}

uint64_t Counter(strata::Client& c, const std::string& name) {
  auto s = c.Stats();
  if (!s.ok()) return 0;
  for (const auto& [k, v] : s->counters)
    if (k == name) return v;
  return 0;
}

// Publishes `count` blocks of `bs` as prompts of up to 16 blocks; returns their ids.
bool PublishMany(strata::Client& c, const strata::NamespaceId& ns,
                 strata::bench::TokenSource& tokens, size_t bs, size_t count,
                 const std::vector<char>& src, std::vector<strata::BlockId>* ids) {
  for (size_t done = 0; done < count;) {
    size_t n = std::min<size_t>(16, count - done);
    std::vector<strata::ConstBuffer> in(n);
    for (size_t i = 0; i < n; ++i) in[i] = {src.data() + ((done + i) % 16) * bs, bs};
    auto t = tokens.Next(n);
    auto r = c.Publish(ns, t, in);
    if (!r.ok() || r->stored + r->deduplicated != n) {
      std::fprintf(stderr, "publish: %s\n", r.ok() ? "partial" : r.status().ToString().c_str());
      return false;
    }
    ids->insert(ids->end(), r->ids.begin(), r->ids.end());
    done += n;
  }
  return true;
}

int Main(int argc, char** argv) {
  CLI::App app{"nvme_fetch_bench: fetches of NVMe-resident blocks through stratad vs fio"};
  std::string dir = "/tmp", memory = "hugetlb", stratad = STRATAD_BIN;
  std::vector<size_t> sizes = {128 << 10, 1 << 20};
  std::vector<uint32_t> qds = {1, 4, 16};
  uint64_t set_bytes = uint64_t{256} << 20;
  int repeat = 3;
  bool json = false, smoke = false;
  app.add_option("--dir", dir, "directory (filesystem) for the NVMe tier file and fio's file");
  app.add_option("--block-sizes", sizes, "block sizes in bytes")->delimiter(',');
  app.add_option("--qd", qds, "blocks per Fetch (= NVMe reads in flight)")->delimiter(',');
  app.add_option("--set", set_bytes, "bytes fetched per sample");
  app.add_option("--repeat", repeat, "rounds per point")->check(CLI::Range(1, 50));
  app.add_option("--memory", memory, "hugetlb (arena and fio on 2 MiB pages) or 4k")
      ->check(CLI::IsMember({"hugetlb", "4k"}));
  app.add_option("--stratad", stratad, "stratad binary");
  app.add_flag("--json", json, "print JSON");
  app.add_flag("--smoke", smoke, "one small point, one round (CI)");
  CLI11_PARSE(app, argc, argv);
  signal(SIGPIPE, SIG_IGN);
  if (!strata::bench::fio::Available()) {
    std::fprintf(stderr, "nvme_fetch_bench: fio not found; skipped\n");
    return 77;
  }
  if (smoke) {
    sizes = {256 << 10};
    qds = {8};
    set_bytes = 16 << 20;
    repeat = 1;
    memory = "4k";
  }
  const bool huge = memory == "hugetlb";
  std::string tmpl = dir + "/strata_fetch_bench.XXXXXX";
  if (!mkdtemp(tmpl.data())) {
    std::perror("mkdtemp");
    return 1;
  }
  const std::string work = tmpl;
  std::vector<Point> points;
  int rc = 0;
  for (size_t bs : sizes) {
    const size_t set_blocks = std::max<size_t>(set_bytes / bs, 16);
    const uint64_t set = set_blocks * bs;
    const uint64_t host = set + (64 << 20);
    const uint64_t filler_blocks = (host + bs - 1) / bs;
    const std::string config = work + "/stratad.yaml";
    {
      std::ofstream y(config);
      y << "host_tier:\n  capacity: " << host << "\n  policy: lru\n"
        << "nvme:\n  files:\n    - {path: " << work << "/tier0, capacity: " << 4 * set + host
        << "}\n  catalog_dir: " << work << "/catalog\n  admission: always\n"
        << "  queue_depth: 32\n  sync_after_write: false\n";
    }
    std::filesystem::remove_all(work + "/catalog");
    std::filesystem::remove(work + "/tier0");
    // The arena is UCX's SysV/posix allocation: on reserved huge pages unless told not to.
    const std::string hugetlb_mode = huge ? "try" : "n";
    auto daemon = std::make_unique<strata::bench::StratadProcess>(
        stratad,
        std::vector<std::string>{"--config", config, "--http-listen", "off", "--data-dir",
                                 work + "/data", "--log-level", "warn"},
        work, "shm,self",
        std::vector<std::pair<std::string, std::string>>{{"UCX_SYSV_HUGETLB_MODE", hugetlb_mode},
                                                         {"UCX_POSIX_HUGETLB_MODE", hugetlb_mode}});
    if (daemon->endpoint().empty()) {
      std::fprintf(stderr, "stratad did not start:\n%s\n", daemon->log().c_str());
      rc = 1;
      break;
    }
    setenv("UCX_TLS", "shm,self", 1);
    strata::ClientOptions o;
    o.endpoint = daemon->endpoint();
    o.client_name = "nvme_fetch_bench";
    o.verify_crc = false;  // the daemon verifies every promoted block's CRC on its host commit
    auto client = strata::Client::Connect(o);
    if (!client.ok()) {
      std::fprintf(stderr, "connect: %s\n", client.status().ToString().c_str());
      rc = 1;
      break;
    }
    strata::NamespaceSpec spec;
    spec.model_id = "nvme-fetch-bench";
    spec.codec_policy = std::string(strata::kOpaqueCodecPolicy);
    spec.layout =
        strata::KvLayout{32, 8, 128, strata::DType::kFloat16, 16, strata::KvKind::kSeparateKV};
    auto ns = (*client)->OpenNamespace(spec, "bench");
    if (!ns.ok()) {
      std::fprintf(stderr, "namespace: %s\n", ns.status().ToString().c_str());
      rc = 1;
      break;
    }
    strata::bench::TokenSource tokens(16, 4242);
    std::vector<char> src(16 * bs);
    std::mt19937_64 rng(bs);
    for (size_t i = 0; i + 8 <= src.size(); i += 8) {
      uint64_t v = rng();
      std::memcpy(&src[i], &v, 8);
    }
    (void)(*client)->RegisterBuffer(src.data(), src.size());
    const uint32_t max_qd = *std::max_element(qds.begin(), qds.end());
    std::vector<char> dst(max_qd * bs);
    (void)(*client)->RegisterBuffer(dst.data(), dst.size());
    // fio's file: as large as the set, written once.
    const std::string fio_file = work + "/fio.dat";
    std::string prep = absl::StrFormat(
        "fio --name=prep --filename=%s --ioengine=io_uring --direct=1 --rw=write --bs=1M "
        "--size=%d --numjobs=1 --thread > /dev/null 2>&1",
        fio_file, set);
    if (std::system(prep.c_str()) != 0) {
      std::fprintf(stderr, "fio could not write %s\n", fio_file.c_str());
      rc = 1;
      break;
    }
    for (uint32_t qd : qds) {
      Point pt;
      pt.block = bs;
      pt.qd = qd;
      for (int round = 0; round < repeat && rc == 0; ++round) {
        std::vector<strata::BlockId> ids, filler;
        const uint64_t demoted0 = Counter(**client, "demotions_total");
        if (!PublishMany(**client, *ns, tokens, bs, set_blocks, src, &ids) ||
            !PublishMany(**client, *ns, tokens, bs, filler_blocks, src, &filler)) {
          rc = 1;
          break;
        }
        // The set is the least recently used: it goes down first. Wait for all of it.
        bool down = false;
        for (int i = 0; i < 3000 && !down; ++i) {
          const uint64_t now_demoted = Counter(**client, "demotions_total");
          down = now_demoted >= demoted0 && now_demoted - demoted0 >= set_blocks;
          if (!down) std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        auto ev = (*client)->Evict(*ns, filler);
        if (!down || !ev.ok()) {
          std::fprintf(stderr, "set not demoted (%d) or filler not evicted (%s)\n", down,
                       ev.ok() ? "ok" : ev.status().ToString().c_str());
          rc = 1;
          break;
        }
        std::vector<size_t> order(ids.size());
        for (size_t i = 0; i < order.size(); ++i) order[i] = i;
        std::shuffle(order.begin(), order.end(), std::mt19937_64(round * 7 + qd));
        auto fetch_all = [&](double* mibps) -> bool {
          std::vector<strata::BlockId> batch;
          std::vector<strata::MutableBuffer> out;
          auto t0 = Clock::now();
          for (size_t i = 0; i < order.size(); i += qd) {
            batch.clear();
            out.clear();
            for (size_t k = i; k < std::min(order.size(), i + qd); ++k) {
              batch.push_back(ids[order[k]]);
              out.push_back({dst.data() + (k - i) * bs, bs});
            }
            auto f = (*client)->Fetch(*ns, batch, out);
            if (!f.ok() || f->fetched != batch.size()) {
              std::fprintf(stderr, "fetch: %s\n",
                           f.ok() ? "partial" : f.status().ToString().c_str());
              return false;
            }
          }
          *mibps = double(set) / Seconds(Clock::now() - t0) / (1 << 20);
          return true;
        };
        const uint64_t promoted0 = Counter(**client, "promotions_total");
        double nvme = 0, hostv = 0;
        if (!fetch_all(&nvme)) {
          rc = 1;
          break;
        }
        const uint64_t promoted = Counter(**client, "promotions_total") - promoted0;
        if (promoted != set_blocks) {
          std::fprintf(stderr, "expected %zu promotions, saw %llu\n", set_blocks,
                       (unsigned long long)promoted);
          rc = 1;
          break;
        }
        if (!fetch_all(&hostv)) {
          rc = 1;
          break;
        }
        pt.nvme_mibps.push_back(nvme);
        pt.host_mibps.push_back(hostv);
        pt.fio_mibps.push_back(RunFio(fio_file, bs, qd, set, huge));
        (void)(*client)->Evict(*ns, ids);
      }
      if (!json) {
        std::fprintf(stderr, "  %6zu KiB x %2u  nvme fetch [%s]  fio [%s]  host fetch [%s]\n",
                     bs >> 10, qd, List(pt.nvme_mibps).c_str(), List(pt.fio_mibps).c_str(),
                     List(pt.host_mibps).c_str());
      }
      points.push_back(pt);
      if (rc) break;
    }
    client->reset();
    daemon.reset();
    std::filesystem::remove(fio_file);
    if (rc) break;
  }
  std::filesystem::remove_all(work);
  if (json) {
    std::printf("{\"memory\": \"%s\", \"rows\": [", memory.c_str());
    for (size_t i = 0; i < points.size(); ++i) {
      const Point& p = points[i];
      double n = Median(p.nvme_mibps), f = Median(p.fio_mibps);
      std::printf(
          "%s{\"block_bytes\": %zu, \"qd\": %u, \"nvme_fetch_mibps\": %.1f, "
          "\"fio_read_mibps\": %.1f, \"ratio\": %.3f, \"host_fetch_mibps\": %.1f, "
          "\"nvme_fetch_runs\": [%s], \"fio_runs\": [%s]}",
          i ? ", " : "", p.block, p.qd, n, f, f > 0 ? n / f : -1.0, Median(p.host_mibps),
          List(p.nvme_mibps).c_str(), List(p.fio_mibps).c_str());
    }
    std::printf("]}\n");
  } else {
    std::printf(
        "Fetch of NVMe-resident blocks through stratad (promotion + shm copy, client CRC "
        "off) vs fio randread (io_uring, direct, same bs and depth, %s memory); MiB/s, "
        "medians of %d\n",
        memory.c_str(), repeat);
    std::printf("%9s %3s | %10s %8s %6s | %10s\n", "block", "qd", "nvme fetch", "fio", "ratio",
                "host fetch");
    for (const Point& p : points) {
      double n = Median(p.nvme_mibps), f = Median(p.fio_mibps);
      std::printf("%6zuKiB %3u | %10.1f %8.1f %6.2f | %10.1f\n", p.block >> 10, p.qd, n, f,
                  f > 0 ? n / f : -1.0, Median(p.host_mibps));
    }
  }
  return rc;
}

}  // namespace

int main(int argc, char** argv) { return Main(argc, argv); }
