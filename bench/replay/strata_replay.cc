// strata_replay: drives the real TierManager (host DRAM over NVMe, metadata only) with a
// Mooncake request trace and reports, per eviction policy and capacity, hit rates per tier,
// bytes written and read per tier, and evictions. Belady's offline optimum is the upper bound,
// LRU the floor.
//
//   strata_replay --trace FILE [--json] [--smoke] [--transcode-ratio R]
//
// With --transcode-ratio, each online policy runs a second time ("+tc" rows) with transcoding:
// a host victim is re-encoded once at a lower rate (R x its bytes, e.g. the size of a 1.7-bit
// blob over a 3.8-bit one) and stays instead of leaving (storage/host_tier.h). The same bytes
// then hold more blocks; `tc%` is the share of accesses that hit a transcoded block (served at
// the lower fidelity).
//
// Model: each request looks its blocks up in order (TierManager::Access); a miss is computed
// by the engine and published into the host tier (TierManager::Insert, parent = the previous
// block of the request). A hit counts per block. Bytes per block default to Llama-3-8B in fp16:
// 32 layers x 8 KV heads x 128 dims x 2 (K,V) x 2 bytes = 128 KiB per token, x 512 tokens per
// block = 64 MiB per block. Capacities are in blocks, split host:NVMe = 1:4 by default.
//
// Exit codes: 0 ok, 1 error, 77 trace file absent (ctest treats it as skipped).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "bench/replay/tier_manager.h"
#include "bench/replay/trace_reader.h"
#include "storage/eviction/admission_policy.h"
#include "storage/eviction/belady_policy.h"
#include "storage/eviction/eviction_policy.h"
#include "storage/eviction/prefix_aware_policy.h"

namespace strata::replay {
namespace {

constexpr int kSkipExit = 77;

struct Access {
  BlockId id;
  BlockId parent;
  uint32_t request;
};

struct Workload {
  std::vector<Access> accesses;
  std::vector<uint64_t> next_use;  // index of the next access of the same block, or kNever
  size_t requests = 0;
  size_t unique_blocks = 0;
};

// Trace hash ids are small integers; spread them over the id space the way real SHA-256 ids
// are (splitmix64 is a bijection, so distinct ids stay distinct).
BlockId IdFor(uint64_t hash_id) {
  uint64_t z = hash_id + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  BlockId id;
  for (int i = 0; i < 8; ++i) id.bytes[i] = static_cast<uint8_t>(z >> (8 * i));
  for (int i = 0; i < 8; ++i) id.bytes[8 + i] = static_cast<uint8_t>(hash_id >> (8 * i));
  id.bytes[31] = 1;  // never the zero id
  return id;
}

Workload BuildWorkload(const std::vector<TraceRequest>& trace) {
  Workload w;
  w.requests = trace.size();
  for (size_t r = 0; r < trace.size(); ++r) {
    BlockId parent;
    for (uint64_t h : trace[r].hash_ids) {
      BlockId id = IdFor(h);
      w.accesses.push_back({id, parent, static_cast<uint32_t>(r)});
      parent = id;
    }
  }
  w.next_use.assign(w.accesses.size(), NextUseOracle::kNever);
  absl::flat_hash_map<BlockId, uint64_t> later;
  for (size_t i = w.accesses.size(); i-- > 0;) {
    auto [it, inserted] = later.try_emplace(w.accesses[i].id, i);
    if (!inserted) {
      w.next_use[i] = it->second;
      it->second = i;
    }
  }
  w.unique_blocks = later.size();
  return w;
}

struct PolicySpec {
  std::string name;       // row label
  std::string policy;     // eviction policy of both tiers
  std::string admission;  // admission to NVMe
  double transcode_ratio = 0;
};

struct Row {
  std::string policy;
  std::string admission;
  uint64_t capacity_blocks = 0;
  uint64_t host_blocks = 0;
  uint64_t nvme_blocks = 0;
  uint64_t accesses = 0;
  double hit_rate = 0, host_hit_rate = 0, nvme_hit_rate = 0, prefix_hit_rate = 0;
  double transcode_ratio = 0, transcoded_hit_rate = 0;
  TierManagerStats stats;
  double seconds = 0;
};

struct Knobs {
  double prefix_freq_bonus = 0.5;
  uint32_t prefix_freq_max_accesses = 2;
  double adapt_step = 0.5;
};

absl::StatusOr<Row> RunOne(const Workload& w, const PolicySpec& spec, uint64_t capacity_blocks,
                           double host_fraction, uint64_t block_bytes, const Knobs& knobs) {
  Row row;
  row.policy = spec.name;
  row.admission = spec.admission;
  row.capacity_blocks = capacity_blocks;
  row.host_blocks = std::max<uint64_t>(
      1, static_cast<uint64_t>(static_cast<double>(capacity_blocks) * host_fraction + 0.5));
  row.nvme_blocks = capacity_blocks > row.host_blocks ? capacity_blocks - row.host_blocks : 0;

  TierManagerOptions options;
  options.host.capacity_bytes = row.host_blocks * block_bytes;
  options.nvme.capacity_bytes = row.nvme_blocks * block_bytes;
  options.typical_block_bytes = block_bytes;
  options.transcode_ratio = spec.transcode_ratio;
  row.transcode_ratio = spec.transcode_ratio;

  NextUseOracle oracle;
  const bool offline = spec.policy == "belady";
  auto make_policy = [&]() -> absl::StatusOr<std::unique_ptr<EvictionPolicy>> {
    if (offline) return MakeBeladyPolicy(&oracle);
    if (spec.policy == "prefix-freq" || spec.policy == "prefix-adaptive") {
      return std::make_unique<PrefixAwarePolicy>(
          PrefixAwareOptions{.frequency_bonus = knobs.prefix_freq_bonus,
                             .max_counted_accesses = knobs.prefix_freq_max_accesses,
                             .adaptive = spec.policy == "prefix-adaptive",
                             .adapt_step = knobs.adapt_step},
          spec.policy);
    }
    return MakeEvictionPolicy(spec.policy);
  };
  auto host_policy = make_policy();
  if (!host_policy.ok()) return host_policy.status();
  std::unique_ptr<EvictionPolicy> nvme_policy;
  std::unique_ptr<AdmissionPolicy> admission;
  if (row.nvme_blocks > 0) {
    auto p = make_policy();
    if (!p.ok()) return p.status();
    nvme_policy = std::move(*p);
    auto a = MakeAdmissionPolicy(spec.admission, row.nvme_blocks);
    if (!a.ok()) return a.status();
    admission = std::move(*a);
  }
  auto made = TierManager::Create(options, std::move(*host_policy), std::move(nvme_policy),
                                  std::move(admission));
  if (!made.ok()) return made.status();
  std::unique_ptr<TierManager> tm = std::move(*made);

  const auto start = std::chrono::steady_clock::now();
  uint64_t prefix_hits = 0;
  uint32_t current_request = UINT32_MAX;
  bool in_prefix = false;
  for (size_t i = 0; i < w.accesses.size(); ++i) {
    const Access& a = w.accesses[i];
    if (a.request != current_request) {
      current_request = a.request;
      in_prefix = true;
    }
    if (offline) oracle.Set(a.id, w.next_use[i]);
    AccessResult r = tm->Access(a.id);
    if (r.found != Tier::kNone) {
      if (in_prefix) ++prefix_hits;
      continue;
    }
    in_prefix = false;
    auto moved = tm->Insert(a.id, a.parent, block_bytes);
    if (!moved.ok()) return moved.status();
  }
  row.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  row.stats = tm->Stats();
  row.accesses = row.stats.accesses;
  const double n = std::max<double>(1.0, static_cast<double>(row.accesses));
  row.host_hit_rate = static_cast<double>(row.stats.host.hits) / n;
  row.nvme_hit_rate = static_cast<double>(row.stats.nvme.hits) / n;
  row.hit_rate = row.host_hit_rate + row.nvme_hit_rate;
  row.prefix_hit_rate = static_cast<double>(prefix_hits) / n;
  row.transcoded_hit_rate = static_cast<double>(row.stats.transcoded_hits) / n;
  return row;
}

double GiB(uint64_t bytes) { return static_cast<double>(bytes) / static_cast<double>(1ull << 30); }

// Transcoding rows against the same policy without it, at the same bytes.
void PrintTranscodeSummary(const std::vector<Row>& rows) {
  bool any = false;
  for (const Row& tc : rows) {
    if (tc.transcode_ratio <= 0) continue;
    const std::string base = tc.policy.substr(0, tc.policy.size() - 3);  // without "+tc"
    for (const Row& r : rows) {
      if (r.transcode_ratio > 0 || r.policy != base || r.capacity_blocks != tc.capacity_blocks) {
        continue;
      }
      if (!any) {
        std::printf("\ntranscoding instead of evicting (same bytes; hit-rate points gained, "
                    "share of hits on transcoded blocks):\n");
        any = true;
      }
      const uint64_t hits = tc.stats.host.hits + tc.stats.nvme.hits;
      std::printf("  %-18s cap %7llu ratio %.3f: %6.2f%% -> %6.2f%% (%+.2f pts, x%.2f hits); "
                  "%.1f%% of hits transcoded; %llu transcoded\n",
                  base.c_str(), static_cast<unsigned long long>(tc.capacity_blocks),
                  tc.transcode_ratio, 100 * r.hit_rate, 100 * tc.hit_rate,
                  100 * (tc.hit_rate - r.hit_rate),
                  r.hit_rate > 0 ? tc.hit_rate / r.hit_rate : 0.0,
                  hits > 0 ? 100.0 * static_cast<double>(tc.stats.transcoded_hits) /
                                 static_cast<double>(hits)
                           : 0.0,
                  static_cast<unsigned long long>(tc.stats.transcoded));
    }
  }
}

void PrintTable(const Workload& w, const std::vector<Row>& rows, uint64_t block_bytes,
                double host_fraction) {
  std::printf(
      "trace: %zu requests, %zu block accesses, %zu unique blocks; %.0f MiB per block; "
      "host:nvme = %.0f%%:%.0f%%\n",
      w.requests, w.accesses.size(), w.unique_blocks, static_cast<double>(block_bytes) / (1 << 20),
      host_fraction * 100, (1 - host_fraction) * 100);
  std::printf(
      "hit = block hits / block accesses; prefix = hits within the leading run of hits of each "
      "request; wr/rd in GiB; evict = host victims (demoted or dropped) / nvme victims; "
      "dropped = left the cache\n\n");
  std::printf("%-18s %-13s %9s %7s %7s %7s %7s %7s %7s %6s %9s %9s %9s %9s %8s %8s %8s %6s\n",
              "policy", "admission", "cap_blk", "host", "hit%", "host%", "nvme%", "prefix%",
              "vsBel%", "tc%", "host_wr", "host_rd", "nvme_wr", "nvme_rd", "ev_host", "ev_nvme",
              "dropped", "sec");
  uint64_t last_cap = 0;
  double belady = 0;
  for (const Row& r : rows) {
    if (r.capacity_blocks != last_cap) {
      last_cap = r.capacity_blocks;
      belady = 0;
      for (const Row& b : rows) {
        if (b.capacity_blocks == last_cap && b.policy == "belady") belady = b.hit_rate;
      }
      std::printf("\n");
    }
    std::printf(
        "%-18s %-13s %9llu %7llu %7.2f %7.2f %7.2f %7.2f %7.1f %6.2f %9.0f %9.0f %9.0f %9.0f "
        "%8llu %8llu %8llu %6.2f\n",
        r.policy.c_str(), r.admission.c_str(), static_cast<unsigned long long>(r.capacity_blocks),
        static_cast<unsigned long long>(r.host_blocks), 100 * r.hit_rate, 100 * r.host_hit_rate,
        100 * r.nvme_hit_rate, 100 * r.prefix_hit_rate,
        belady > 0 ? 100 * r.hit_rate / belady : 0.0, 100 * r.transcoded_hit_rate,
        GiB(r.stats.host.bytes_written),
        GiB(r.stats.host.bytes_read), GiB(r.stats.nvme.bytes_written), GiB(r.stats.nvme.bytes_read),
        static_cast<unsigned long long>(r.stats.host.evictions),
        static_cast<unsigned long long>(r.stats.nvme.evictions),
        static_cast<unsigned long long>(r.stats.dropped), r.seconds);
  }
  // Per capacity: the best online policy against LRU and Belady.
  std::printf("\nsummary (best online policy per capacity):\n");
  std::vector<uint64_t> caps;
  for (const Row& r : rows) {
    if (caps.empty() || caps.back() != r.capacity_blocks) caps.push_back(r.capacity_blocks);
  }
  for (uint64_t cap : caps) {
    const Row* best = nullptr;
    const Row* lru = nullptr;
    const Row* bel = nullptr;
    for (const Row& r : rows) {
      if (r.capacity_blocks != cap || r.transcode_ratio > 0) continue;
      if (r.policy == "belady") {
        bel = &r;
      } else {
        if (r.policy == "lru") lru = &r;
        if (best == nullptr || r.hit_rate > best->hit_rate) best = &r;
      }
    }
    if (best == nullptr) continue;
    std::printf("  cap %7llu: best %-18s %6.2f%%", static_cast<unsigned long long>(cap),
                best->policy.c_str(), 100 * best->hit_rate);
    if (lru)
      std::printf("  lru %6.2f%% (%+.2f pts)", 100 * lru->hit_rate,
                  100 * (best->hit_rate - lru->hit_rate));
    if (bel)
      std::printf("  belady %6.2f%% (%.2f pts short, %.1f%% of it)", 100 * bel->hit_rate,
                  100 * (bel->hit_rate - best->hit_rate),
                  bel->hit_rate > 0 ? 100 * best->hit_rate / bel->hit_rate : 0.0);
    std::printf("\n");
  }
  // Per online policy: does it beat LRU at every capacity, and by how little at worst.
  std::printf("\nper policy against lru (hit-rate points; min over capacities):\n");
  std::vector<std::string> names;
  for (const Row& r : rows) {
    if (r.transcode_ratio > 0) continue;
    if (std::find(names.begin(), names.end(), r.policy) == names.end()) names.push_back(r.policy);
  }
  for (const std::string& name : names) {
    if (name == "lru" || name == "belady") continue;
    double min_margin = 1e9;
    double min_share = 1e9;
    int wins = 0;
    int n = 0;
    int64_t min_hits = INT64_MAX;
    for (uint64_t cap : caps) {
      const Row* me = nullptr;
      const Row* lru = nullptr;
      const Row* bel = nullptr;
      for (const Row& r : rows) {
        if (r.capacity_blocks != cap) continue;
        if (r.policy == name) me = &r;
        if (r.policy == "lru") lru = &r;
        if (r.policy == "belady") bel = &r;
      }
      if (me == nullptr || lru == nullptr) continue;
      ++n;
      const double margin = me->hit_rate - lru->hit_rate;
      const int64_t more = static_cast<int64_t>(me->stats.host.hits + me->stats.nvme.hits) -
                           static_cast<int64_t>(lru->stats.host.hits + lru->stats.nvme.hits);
      wins += more > 0;
      min_hits = std::min(min_hits, more);
      min_margin = std::min(min_margin, margin);
      if (bel != nullptr && bel->hit_rate > 0) {
        min_share = std::min(min_share, me->hit_rate / bel->hit_rate);
      }
    }
    std::printf("  %-18s beats lru at %d/%d capacities; worst margin %+.3f pts (%+lld hits)",
                name.c_str(), wins, n, 100 * min_margin, static_cast<long long>(min_hits));
    if (min_share < 1e9) std::printf("; at worst %.1f%% of belady", 100 * min_share);
    std::printf("\n");
  }
  PrintTranscodeSummary(rows);
}

void PrintJson(const std::vector<Row>& rows) {
  // bytes_written / bytes_read: the NVMe tier's (device writes and reads); evictions: blocks
  // that left the cache. The table has both tiers.
  std::printf("{\"rows\": [");
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    std::printf(
        "%s\n  {\"policy\": \"%s\", \"capacity_blocks\": %llu, \"hit_rate\": %.6f, "
        "\"host_hit_rate\": %.6f, \"nvme_hit_rate\": %.6f, \"bytes_written\": %llu, "
        "\"bytes_read\": %llu, \"evictions\": %llu, \"transcode_ratio\": %.4f, "
        "\"transcoded_hit_rate\": %.6f}",
        i == 0 ? "" : ",", r.policy.c_str(), static_cast<unsigned long long>(r.capacity_blocks),
        r.hit_rate, r.host_hit_rate, r.nvme_hit_rate,
        static_cast<unsigned long long>(r.stats.nvme.bytes_written),
        static_cast<unsigned long long>(r.stats.nvme.bytes_read),
        static_cast<unsigned long long>(r.stats.dropped), r.transcode_ratio,
        r.transcoded_hit_rate);
  }
  std::printf("\n]}\n");
}

int Main(int argc, char** argv) {
  CLI::App app{"strata_replay: eviction policies and tier movement on a request trace"};
  std::string trace_path;
  bool json = false;
  bool smoke = false;
  uint64_t block_bytes = uint64_t{64} << 20;
  double host_fraction = 0.2;
  std::vector<uint64_t> capacities;
  size_t max_requests = 0;
  Knobs knobs;
  app.add_option("--trace", trace_path, "JSON-lines trace with hash_ids (512-token blocks)")
      ->required();
  app.add_flag("--json", json, "print {\"rows\": [...]} instead of a table");
  app.add_flag("--smoke", smoke, "first 1000 requests, small capacities (a quick check)");
  app.add_option("--block-bytes", block_bytes,
                 "bytes per block (default: Llama-3-8B fp16, 512 tokens = 64 MiB)");
  app.add_option("--host-fraction", host_fraction, "share of each capacity that is host DRAM")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--capacities", capacities, "total capacities in blocks (host + nvme)");
  app.add_option("--max-requests", max_requests, "replay only the first N requests (0: all)");
  app.add_option("--prefix-freq-bonus", knobs.prefix_freq_bonus,
                 "prefix-freq: bonus per extra access, as a fraction of the tier's blocks");
  app.add_option("--prefix-freq-max-accesses", knobs.prefix_freq_max_accesses,
                 "prefix-freq: accesses counted at most")
      ->check(CLI::Range(1u, 1000u));
  app.add_option("--adapt-step", knobs.adapt_step, "prefix-adaptive: step per ghost hit");
  double transcode_ratio = 0;
  app.add_option("--transcode-ratio", transcode_ratio,
                 "also run each online policy with host victims transcoded once to this "
                 "fraction of their bytes (0: not)")
      ->check(CLI::Range(0.0, 0.999));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (block_bytes == 0) {
    std::fprintf(stderr, "strata_replay: --block-bytes must be > 0\n");
    return 1;
  }
  std::error_code ec;
  if (!std::filesystem::exists(trace_path, ec)) {
    std::fprintf(stderr, "strata_replay: trace %s not found; skipping\n", trace_path.c_str());
    return kSkipExit;
  }
  if (smoke && max_requests == 0) max_requests = 1000;
  if (capacities.empty()) {
    capacities = smoke ? std::vector<uint64_t>{250, 1000, 4000}
                       : std::vector<uint64_t>{1000, 4000, 16000, 64000};
  }
  auto trace = ReadTrace(trace_path, max_requests);
  if (!trace.ok()) {
    std::fprintf(stderr, "strata_replay: %s\n", std::string(trace.status().message()).c_str());
    return 1;
  }
  const Workload w = BuildWorkload(*trace);

  std::vector<PolicySpec> specs = {
      {"lru", "lru", "always"},
      {"lru+2nd", "lru", "second-access"},
      {"s3fifo", "s3fifo", "always"},
      {"prefix-lru", "prefix-lru", "always"},
      {"prefix-freq", "prefix-freq", "always"},
      {"prefix-freq+2nd", "prefix-freq", "second-access"},
      {"prefix-adaptive", "prefix-adaptive", "always"},
      {"belady", "belady", "always"},
  };
  if (transcode_ratio > 0) {
    const size_t online = specs.size() - 1;
    for (size_t i = 0; i < online; ++i) {
      PolicySpec tc = specs[i];
      tc.name += "+tc";
      tc.transcode_ratio = transcode_ratio;
      specs.push_back(tc);
    }
  }
  std::vector<Row> rows;
  for (uint64_t cap : capacities) {
    for (const PolicySpec& spec : specs) {
      auto row = RunOne(w, spec, cap, host_fraction, block_bytes, knobs);
      if (!row.ok()) {
        std::fprintf(stderr, "strata_replay: %s at %llu blocks: %s\n", spec.name.c_str(),
                     static_cast<unsigned long long>(cap),
                     std::string(row.status().message()).c_str());
        return 1;
      }
      rows.push_back(std::move(*row));
    }
  }
  // The offline optimum bounds every online policy; a violation is a bug in the replay.
  for (const Row& r : rows) {
    for (const Row& b : rows) {
      // (Transcoding rows hold more blocks in the same bytes: not bounded by this Belady.)
      if (b.policy == "belady" && b.capacity_blocks == r.capacity_blocks &&
          r.transcode_ratio == 0 && r.hit_rate > b.hit_rate + 1e-12) {
        std::fprintf(stderr, "strata_replay: %s beats belady at %llu blocks: bug\n",
                     r.policy.c_str(), static_cast<unsigned long long>(r.capacity_blocks));
        return 1;
      }
    }
  }
  if (json) {
    PrintJson(rows);
  } else {
    PrintTable(w, rows, block_bytes, host_fraction);
  }
  return 0;
}

}  // namespace
}  // namespace strata::replay

int main(int argc, char** argv) { return strata::replay::Main(argc, argv); }
