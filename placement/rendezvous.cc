#include "placement/rendezvous.h"

#include <algorithm>
#include <cstring>

#include "strata/digest.h"

// GCC instruments the ifunc resolver that target_clones generates when building with
// -fsanitize=thread, and that resolver runs while the dynamic loader relocates the program, before
// TSan's runtime exists: every TSan-built process that links this file died with SIGSEGV at
// startup. The TSan build (scripts/test-sanitizers.sh tsan) keeps only the baseline version.
#if defined(__SANITIZE_THREAD__)
#define STRATA_SCORE_CLONES
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define STRATA_SCORE_CLONES
#endif
#endif
#ifndef STRATA_SCORE_CLONES
#define STRATA_SCORE_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#endif

namespace strata::placement {
namespace {
constexpr size_t kChunk = 64;  // nodes scored per kernel call
}  // namespace

uint64_t NodeHash(std::string_view node_id) {
  static constexpr char kDomain[] = "strata-node-v1";  // + its NUL terminator
  Digest d = Sha256().Bytes(kDomain, sizeof kDomain).Bytes(node_id.data(), node_id.size()).Finish();
  uint64_t h = 0;
  for (int i = 7; i >= 0; --i) h = (h << 8) | d.bytes[i];
  return h;
}

uint64_t KeyOf(const BlockId& id) {
  uint64_t k = 0;
  for (int i = 7; i >= 0; --i) k = (k << 8) | id.bytes[i];
  return k;
}

Rendezvous::Rendezvous(std::vector<std::string> node_ids) : ids_(std::move(node_ids)) {
  std::sort(ids_.begin(), ids_.end());
  ids_.erase(std::unique(ids_.begin(), ids_.end()), ids_.end());
  hashes_.reserve(ids_.size());
  for (const auto& id : ids_) hashes_.push_back(NodeHash(id));
  // Whole chunks for the scoring kernel (the padding is never a candidate).
  hashes_.resize((ids_.size() + kChunk - 1) / kChunk * kChunk, 0);
}

int Rendezvous::IndexOf(std::string_view node_id) const {
  auto it = std::lower_bound(ids_.begin(), ids_.end(), node_id,
                             [](const std::string& a, std::string_view b) { return a < b; });
  if (it == ids_.end() || *it != node_id) return -1;
  return static_cast<int>(it - ids_.begin());
}

// ids_ is sorted, so a lower index is the smaller node id: ties go to it.
bool Rendezvous::Better(uint64_t score_a, uint32_t a, uint64_t score_b, uint32_t b) const {
  return score_a != score_b ? score_a > score_b : a < b;
}

namespace {

// Scores of kChunk nodes for one key, and their maximum. A fixed trip count, straight-line and
// branch-free, so that it vectorizes at -O2; cloned per ISA (AVX-512 has the 64-bit multiply
// Mix64 wants).
STRATA_SCORE_CLONES uint64_t ScoreChunk(
    uint64_t key, const uint64_t* __restrict hashes, uint64_t* __restrict out) {
  uint64_t mx = 0;
  for (size_t i = 0; i < kChunk; ++i) {
    uint64_t s = Score(key, hashes[i]);
    out[i] = s;
    mx = s > mx ? s : mx;
  }
  return mx;
}

}  // namespace

void Rendezvous::TopR(uint64_t key, size_t r, std::vector<uint32_t>* out) const {
  out->clear();
  r = std::min(r, ids_.size());
  if (r == 0) return;
  // R is small (1-3): keep the best R in a sorted array, insertion style. Nodes are scored a
  // chunk at a time; a chunk whose best score cannot enter the top R is skipped whole (after
  // the first chunks that is almost every chunk). Nodes are visited in index order, so a later
  // node with an equal score never displaces an earlier one: ties go to the smaller id.
  uint64_t best_score[8];
  uint32_t best[8];
  size_t n = 0;
  const size_t keep = std::min<size_t>(r, 8);
  uint64_t scores[kChunk];
  const size_t total = ids_.size();
  for (size_t base = 0; base < total; base += kChunk) {
    const size_t m = std::min(kChunk, total - base);
    // hashes_ is padded to whole chunks; scores past `m` count only towards `mx`.
    uint64_t mx = ScoreChunk(key, hashes_.data() + base, scores);
    if (n == keep && mx <= best_score[n - 1]) continue;
    for (size_t j = 0; j < m; ++j) {
      const uint64_t s = scores[j];
      if (n == keep && s <= best_score[n - 1]) continue;
      const uint32_t i = static_cast<uint32_t>(base + j);
      size_t pos = n < keep ? n++ : keep - 1;
      while (pos > 0 && s > best_score[pos - 1]) {
        best_score[pos] = best_score[pos - 1];
        best[pos] = best[pos - 1];
        --pos;
      }
      best_score[pos] = s;
      best[pos] = i;
    }
  }
  out->assign(best, best + n);
  if (r > keep) {  // more than 8 owners asked for: rank everything
    std::vector<std::pair<uint64_t, uint32_t>> all;
    all.reserve(ids_.size());
    for (uint32_t i = 0; i < ids_.size(); ++i) all.emplace_back(Score(key, hashes_[i]), i);
    std::sort(all.begin(), all.end(), [this](const auto& x, const auto& y) {
      return Better(x.first, x.second, y.first, y.second);
    });
    out->clear();
    for (size_t i = 0; i < r; ++i) out->push_back(all[i].second);
  }
}

std::vector<uint32_t> Rendezvous::TopR(const BlockId& id, size_t r) const {
  std::vector<uint32_t> out;
  TopR(KeyOf(id), r, &out);
  return out;
}

std::vector<uint32_t> Rendezvous::Rank(const BlockId& id) const {
  std::vector<uint32_t> out;
  TopR(KeyOf(id), ids_.size(), &out);
  return out;
}

}  // namespace strata::placement
