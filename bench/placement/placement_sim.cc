// placement_sim: rendezvous placement at cluster scale, with the daemon's own code.
//
// For N nodes and B blocks (random 64-bit block keys from a fixed-seed generator; KeyOf takes the
// first 8 bytes of a BlockId, which is already a uniform hash) it reports:
//  - ownership balance: directory entries per node (all R owners counted), max/mean, min/mean;
//  - entries moved when one node joins and when one leaves, against the ideal. A join moves a
//    key's entry iff the new node's score beats the key's R-th best (one of R entries moves: the
//    ideal is 1/(N+1) of all entries); a leave moves it iff the leaving node is among its top R
//    (the ideal is 1/N of all entries). Both are counted in the same pass, and a sample of keys
//    is checked against Rendezvous built on the N+1 and N-1 node sets;
//  - directory memory per node: a real Directory filled with one node's share of entries;
//  - the owner computation per 512-block lookup at N nodes.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "placement/directory.h"
#include "placement/rendezvous.h"

namespace strata::placement {
namespace {

// SplitMix64: the block key generator (constants differ from Mix64's, so keys and scores are
// not the same function).
uint64_t BlockKey(uint64_t seed, uint64_t i) {
  uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

BlockId IdFromKey(uint64_t key, uint64_t salt) {
  BlockId id;
  for (int j = 0; j < 8; ++j) id.bytes[j] = static_cast<uint8_t>(key >> (8 * j));
  uint64_t rest = BlockKey(salt, key);
  for (int j = 8; j < 32; ++j) id.bytes[j] = static_cast<uint8_t>(rest >> (8 * (j % 8)));
  return id;
}

struct Options {
  int nodes = 1000;
  uint64_t blocks = 100'000'000;
  int replicas = 2;
  int threads = 2;
  uint64_t seed = 20240601;
  bool json = false;
  bool smoke = false;
};

struct PassResult {
  std::vector<uint64_t> entries;  // per node
  uint64_t join_moved = 0;        // entries
  uint64_t leave_moved = 0;
};

std::string NodeName(int i) { return absl::StrFormat("node-%05d", i); }

int Run(const Options& o) {
  const size_t n = static_cast<size_t>(o.nodes);
  const size_t r = static_cast<size_t>(o.replicas);
  std::vector<std::string> names;
  for (int i = 0; i < o.nodes; ++i) names.push_back(NodeName(i));
  const Rendezvous base(names);
  std::vector<uint64_t> hashes(n);
  for (size_t i = 0; i < n; ++i) hashes[i] = NodeHash(base.node(i));
  const std::string joiner = "node-joining";
  const uint64_t join_hash = NodeHash(joiner);
  const uint32_t leaver = static_cast<uint32_t>(n / 2);
  const std::string leaver_name = base.node(leaver);

  // ---- One pass over every block: ownership, join moves, leave moves.
  absl::Time t0 = absl::Now();
  std::vector<PassResult> parts(o.threads);
  std::vector<std::thread> threads;
  for (int t = 0; t < o.threads; ++t) {
    threads.emplace_back([&, t] {
      PassResult& p = parts[t];
      p.entries.assign(n, 0);
      uint64_t begin = o.blocks * t / o.threads, end = o.blocks * (t + 1) / o.threads;
      std::vector<uint32_t> top;
      top.reserve(8);
      uint64_t join_moved = 0, leave_moved = 0;
      for (uint64_t b = begin; b < end; ++b) {
        const uint64_t key = BlockKey(o.seed, b);
        base.TopR(key, r, &top);
        bool has_leaver = false;
        for (uint32_t owner : top) {
          ++p.entries[owner];
          has_leaver |= owner == leaver;
        }
        leave_moved += has_leaver;
        if (top.size() < r) {
          ++join_moved;  // fewer nodes than R: the newcomer becomes an extra owner
        } else {
          const uint32_t last = top.back();
          const uint64_t s_last = Score(key, hashes[last]);
          const uint64_t s_join = Score(key, join_hash);
          join_moved += s_join > s_last || (s_join == s_last && joiner < base.node(last));
        }
      }
      p.join_moved = join_moved;
      p.leave_moved = leave_moved;
    });
  }
  for (auto& t : threads) t.join();
  const double pass_s = absl::ToDoubleSeconds(absl::Now() - t0);

  std::vector<uint64_t> entries(n, 0);
  uint64_t join_moved = 0, leave_moved = 0;
  for (const auto& p : parts) {
    for (size_t i = 0; i < n; ++i) entries[i] += p.entries[i];
    join_moved += p.join_moved;
    leave_moved += p.leave_moved;
  }
  uint64_t total = 0, mx = 0, mn = UINT64_MAX;
  for (uint64_t e : entries) {
    total += e;
    mx = std::max(mx, e);
    mn = std::min(mn, e);
  }
  const double mean = static_cast<double>(total) / n;
  double var = 0;
  for (uint64_t e : entries) var += (e - mean) * (e - mean);
  const double cv = std::sqrt(var / n) / mean;

  // ---- Check the incremental join/leave rule on a sample against the real node sets.
  std::vector<std::string> joined = names, left = names;
  joined.push_back(joiner);
  left.erase(std::find(left.begin(), left.end(), leaver_name));
  const Rendezvous after_join(joined), after_leave(left);
  auto owner_set = [&](const Rendezvous& rv, uint64_t key) {
    std::vector<uint32_t> idx;
    rv.TopR(key, r, &idx);
    std::vector<std::string> ids;
    for (uint32_t i : idx) ids.push_back(rv.node(i));
    std::sort(ids.begin(), ids.end());
    return ids;
  };
  const uint64_t sample = std::min<uint64_t>(o.blocks, 5000);
  uint64_t mismatches = 0, sample_join = 0, sample_leave = 0;
  for (uint64_t b = 0; b < sample; ++b) {
    const uint64_t key = BlockKey(o.seed, b);
    auto before = owner_set(base, key);
    bool join_moves = owner_set(after_join, key) != before;
    bool leave_moves = owner_set(after_leave, key) != before;
    // The incremental rule, exactly as in the pass above.
    std::vector<uint32_t> top;
    base.TopR(key, r, &top);
    bool rule_join = top.size() < r || Score(key, join_hash) > Score(key, hashes[top.back()]);
    bool rule_leave = std::find(top.begin(), top.end(), leaver) != top.end();
    mismatches += (join_moves != rule_join) + (leave_moves != rule_leave);
    sample_join += join_moves;
    sample_leave += leave_moves;
  }

  // ---- Directory memory: one node's share of entries in a real Directory.
  const uint64_t share = static_cast<uint64_t>(std::llround(mean));
  const uint64_t fill = std::min<uint64_t>(share, 20'000'000);
  auto measure_dir = [&](int holders) {
    Directory dir;
    const absl::Time expires = absl::Now() + absl::Hours(1);
    const LocationTier tier[] = {LocationTier::kHost};
    std::vector<BlockId> batch;
    batch.reserve(4096);
    for (int h = 0; h < holders; ++h) {
      const std::string holder = NodeName(h * 7 + 1);
      for (uint64_t b = 0; b < fill;) {
        batch.clear();
        for (; b < fill && batch.size() < 4096; ++b)
          batch.push_back(IdFromKey(BlockKey(o.seed ^ 1, b), 5));
        dir.Announce(holder, batch, tier, expires);
      }
    }
    return static_cast<double>(dir.memory_bytes()) /
           static_cast<double>(std::max<uint64_t>(fill, 1));
  };
  const double bytes_per_entry_1 = measure_dir(1);
  const double bytes_per_entry_2 = measure_dir(2);

  // ---- Owner computation per 512-block lookup (one thread).
  std::vector<uint64_t> lookup_keys(512);
  for (size_t i = 0; i < 512; ++i) lookup_keys[i] = BlockKey(o.seed ^ 2, i);
  std::vector<uint32_t> top;
  uint64_t sink = 0, lookups = 0;
  absl::Time l0 = absl::Now();
  const absl::Duration budget = o.smoke ? absl::Milliseconds(100) : absl::Milliseconds(500);
  do {
    for (uint64_t k : lookup_keys) {
      base.TopR(k + lookups, r, &top);  // vary keys per round so nothing is hoisted
      sink += top[0];
    }
    ++lookups;
  } while (absl::Now() - l0 < budget);
  const double lookup_us = absl::ToDoubleMicroseconds(absl::Now() - l0) / lookups;
  const double ns_per_score = lookup_us * 1000.0 / (512.0 * n);

  const double join_frac = static_cast<double>(join_moved) / total;
  const double leave_frac = static_cast<double>(leave_moved) / total;
  const double join_ideal = 1.0 / (n + 1);
  const double leave_ideal = 1.0 / n;
  const double max_mean = mx / mean, min_mean = mn / mean;
  const bool balance_ok = max_mean <= 1.1;
  const double pass_scores = static_cast<double>(o.blocks) * n;

  if (o.json) {
    std::printf(
        "{\"nodes\":%d,\"blocks\":%llu,\"replicas\":%d,\"threads\":%d,\"seed\":%llu,"
        "\"entries_total\":%llu,\"entries_mean\":%.1f,\"entries_max\":%llu,\"entries_min\":%llu,"
        "\"max_over_mean\":%.5f,\"min_over_mean\":%.5f,\"cv\":%.5f,\"balance_target_met\":%s,"
        "\"join_moved_entries\":%llu,\"join_moved_fraction\":%.6g,\"join_ideal_fraction\":%.6g,"
        "\"leave_moved_entries\":%llu,\"leave_moved_fraction\":%.6g,\"leave_ideal_fraction\":%.6g,"
        "\"sample_checked\":%llu,\"sample_mismatches\":%llu,"
        "\"directory_entries_per_node\":%llu,\"directory_bytes_per_entry_1_holder\":%.2f,"
        "\"directory_bytes_per_entry_2_holders\":%.2f,\"directory_mib_per_node\":%.2f,"
        "\"lookup_512_us\":%.2f,\"ns_per_score\":%.3f,\"pass_seconds\":%.2f,"
        "\"pass_scores_per_second\":%.4g}\n",
        o.nodes, (unsigned long long)o.blocks, o.replicas, o.threads, (unsigned long long)o.seed,
        (unsigned long long)total, mean, (unsigned long long)mx, (unsigned long long)mn, max_mean,
        min_mean, cv, balance_ok ? "true" : "false", (unsigned long long)join_moved, join_frac,
        join_ideal, (unsigned long long)leave_moved, leave_frac, leave_ideal,
        (unsigned long long)sample, (unsigned long long)mismatches, (unsigned long long)share,
        bytes_per_entry_1, bytes_per_entry_2, share * bytes_per_entry_1 / (1 << 20), lookup_us,
        ns_per_score, pass_s, pass_scores / pass_s);
  } else {
    std::printf("placement_sim: %d nodes, %llu blocks, R=%d, %d threads (seed %llu)\n", o.nodes,
                (unsigned long long)o.blocks, o.replicas, o.threads, (unsigned long long)o.seed);
    std::printf("  pass: %.1f s, %.3g scores/s\n", pass_s, pass_scores / pass_s);
    std::printf(
        "  entries per node: mean %.1f, max %llu (%.4f x mean), min %llu (%.4f x mean), "
        "cv %.4f  [target max/mean <= 1.1: %s]\n",
        mean, (unsigned long long)mx, max_mean, (unsigned long long)mn, min_mean, cv,
        balance_ok ? "met" : "MISSED");
    std::printf(
        "  join  (+%s): %llu entries moved = %.5f%% of entries (ideal 1/(N+1) = %.5f%%, "
        "ratio %.3f)\n",
        joiner.c_str(), (unsigned long long)join_moved, 100 * join_frac, 100 * join_ideal,
        join_frac / join_ideal);
    std::printf(
        "  leave (-%s): %llu entries moved = %.5f%% of entries (ideal 1/N = %.5f%%, "
        "ratio %.3f)\n",
        leaver_name.c_str(), (unsigned long long)leave_moved, 100 * leave_frac, 100 * leave_ideal,
        leave_frac / leave_ideal);
    std::printf(
        "  rule check on %llu keys against Rendezvous(N+1) / Rendezvous(N-1): %llu "
        "mismatches (sample moves: join %llu, leave %llu)\n",
        (unsigned long long)sample, (unsigned long long)mismatches, (unsigned long long)sample_join,
        (unsigned long long)sample_leave);
    std::printf(
        "  directory: %llu entries per node; %.1f bytes/entry (1 holder), %.1f "
        "(2 holders); %.1f MiB per node (1 holder)%s\n",
        (unsigned long long)share, bytes_per_entry_1, bytes_per_entry_2,
        share * bytes_per_entry_1 / (1 << 20),
        fill < share ? " [extrapolated from 20M entries]" : "");
    std::printf("  owners of a 512-block lookup at %d nodes: %.1f us (%.3f ns per score)\n",
                o.nodes, lookup_us, ns_per_score);
  }
  if (sink == 42) std::fprintf(stderr, " ");
  if (mismatches) {
    std::fprintf(stderr,
                 "placement_sim: the incremental join/leave rule disagrees with "
                 "Rendezvous on %llu sampled keys\n",
                 (unsigned long long)mismatches);
    return 1;
  }
  if (o.smoke && !balance_ok) {
    std::fprintf(stderr, "placement_sim: balance max/mean %.4f misses the 1.1 target\n", max_mean);
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace strata::placement

int main(int argc, char** argv) {
  strata::placement::Options o;
  CLI::App app{"placement_sim: rendezvous placement balance, movement, directory memory, cost"};
  app.add_option("--nodes", o.nodes, "cluster size N")->check(CLI::Range(1, 65535));
  app.add_option("--blocks", o.blocks, "blocks B");
  app.add_option("--replicas", o.replicas, "directory owners per block R")->check(CLI::Range(1, 8));
  app.add_option("--threads", o.threads, "threads for the main pass")->check(CLI::Range(1, 256));
  app.add_option("--seed", o.seed, "block key generator seed");
  app.add_flag("--json", o.json, "one JSON object on stdout");
  app.add_flag("--smoke", o.smoke, "small run (100 nodes, 200k blocks) for ctest");
  CLI11_PARSE(app, argc, argv);
  if (o.smoke) {
    o.nodes = 100;
    o.blocks = 200'000;
  }
  if (o.blocks == 0) {
    std::fprintf(stderr, "placement_sim: --blocks must be > 0\n");
    return 2;
  }
  return strata::placement::Run(o);
}
