#include "placement/directory.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace strata::placement {
namespace {

constexpr uint16_t kNoNode = 0xFFFF;
constexpr size_t kMaxNodes = kNoNode;  // indexes 0..65534

// One (node, tier, expiry) triple: 8 bytes.
struct Holder {
  uint16_t node = kNoNode;
  uint8_t tier = 0;
  uint8_t unused = 0;
  uint32_t expiry = 0;  // seconds since the directory's epoch, rounded up
};
static_assert(sizeof(Holder) == 8);

// malloc rounds requests up to 16-byte chunks including an 8-byte header (glibc).
size_t MallocFootprint(size_t bytes) { return std::max<size_t>(32, (bytes + 8 + 15) / 16 * 16); }

// Holders beyond the first live in one heap array; one holder (the block's producer, the common
// case) costs no allocation.
struct Overflow {
  uint32_t size;
  uint32_t cap;
  Holder items[1];  // really `cap` of them

  static size_t Bytes(uint32_t cap) { return sizeof(Overflow) + (cap - 1) * sizeof(Holder); }
};

// The value of one directory entry: 16 bytes, the first holder inline.
class HolderList {
 public:
  HolderList() = default;
  ~HolderList() { std::free(rest_); }
  HolderList(HolderList&& o) noexcept : first_(o.first_), rest_(std::exchange(o.rest_, nullptr)) {
    o.first_ = Holder{};
  }
  HolderList& operator=(HolderList&& o) noexcept {
    if (this != &o) {
      std::free(rest_);
      first_ = o.first_;
      rest_ = std::exchange(o.rest_, nullptr);
      o.first_ = Holder{};
    }
    return *this;
  }
  HolderList(const HolderList&) = delete;
  HolderList& operator=(const HolderList&) = delete;

  size_t size() const { return (first_.node != kNoNode ? 1 : 0) + (rest_ ? rest_->size : 0); }
  bool empty() const { return first_.node == kNoNode; }
  Holder& at(size_t i) { return i == 0 ? first_ : rest_->items[i - 1]; }
  const Holder& at(size_t i) const { return i == 0 ? first_ : rest_->items[i - 1]; }

  Holder* Find(uint16_t node) {
    if (first_.node == node) return &first_;
    if (rest_) {
      for (uint32_t i = 0; i < rest_->size; ++i)
        if (rest_->items[i].node == node) return &rest_->items[i];
    }
    return nullptr;
  }

  // Appends; `*heap_delta` gets the change in out-of-line bytes.
  void Add(const Holder& h, int64_t* heap_delta) {
    if (first_.node == kNoNode) {
      first_ = h;
      return;
    }
    if (!rest_ || rest_->size == rest_->cap) {
      uint32_t old_cap = rest_ ? rest_->cap : 0;
      uint32_t cap = old_cap == 0 ? 1 : old_cap * 2;
      auto* grown = static_cast<Overflow*>(std::realloc(rest_, Overflow::Bytes(cap)));
      if (!grown) std::abort();
      if (!rest_) grown->size = 0;
      grown->cap = cap;
      rest_ = grown;
      *heap_delta +=
          static_cast<int64_t>(MallocFootprint(Overflow::Bytes(cap))) -
          (old_cap ? static_cast<int64_t>(MallocFootprint(Overflow::Bytes(old_cap))) : 0);
    }
    rest_->items[rest_->size++] = h;
  }

  // Removes holders for which pred is true, keeping the order of the rest. Returns how many.
  template <typename Pred>
  size_t RemoveIf(Pred pred, int64_t* heap_delta) {
    size_t n = size();
    size_t out = 0;
    for (size_t i = 0; i < n; ++i) {
      Holder h = at(i);
      if (pred(h)) continue;
      at(out++) = h;
    }
    size_t removed = n - out;
    if (removed == 0) return 0;
    if (out == 0) first_ = Holder{};
    if (out <= 1) {
      if (rest_) {
        *heap_delta -= static_cast<int64_t>(MallocFootprint(Overflow::Bytes(rest_->cap)));
        std::free(rest_);
        rest_ = nullptr;
      }
    } else {
      rest_->size = static_cast<uint32_t>(out - 1);
    }
    return removed;
  }

 private:
  Holder first_;
  Overflow* rest_ = nullptr;
};
static_assert(sizeof(HolderList) == 16);

}  // namespace

struct Directory::Impl {
  mutable absl::Mutex mu;
  absl::flat_hash_map<BlockId, HolderList> entries ABSL_GUARDED_BY(mu);
  size_t holders ABSL_GUARDED_BY(mu) = 0;
  int64_t heap_bytes ABSL_GUARDED_BY(mu) = 0;  // overflow arrays, with malloc's rounding
  // Node interning: index <-> id, with a live-holder count per index so a node with no entries
  // frees its index for reuse.
  std::vector<std::string> names ABSL_GUARDED_BY(mu);
  std::vector<size_t> counts ABSL_GUARDED_BY(mu);
  std::vector<uint16_t> free_indexes ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<std::string, uint16_t> index ABSL_GUARDED_BY(mu);
  // Expiries are seconds relative to this; set from the first announcement so that any clock
  // (real or a test's) has about 68 years either side.
  std::optional<absl::Time> epoch ABSL_GUARDED_BY(mu);

  uint32_t ExpirySeconds(absl::Time t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (!epoch) epoch = t - absl::Seconds(int64_t{1} << 31);
    double s = std::ceil(absl::ToDoubleSeconds(t - *epoch));
    if (!(s > 0)) return 0;
    if (s >= std::numeric_limits<uint32_t>::max()) return std::numeric_limits<uint32_t>::max();
    return static_cast<uint32_t>(s);
  }
  // Holders with expiry <= NowSeconds(now) are expired.
  int64_t NowSeconds(absl::Time now) const ABSL_SHARED_LOCKS_REQUIRED(mu) {
    if (!epoch) return -1;
    return static_cast<int64_t>(std::floor(absl::ToDoubleSeconds(now - *epoch)));
  }

  std::optional<uint16_t> Lookup(std::string_view node) const ABSL_SHARED_LOCKS_REQUIRED(mu) {
    auto it = index.find(absl::string_view(node.data(), node.size()));
    if (it == index.end()) return std::nullopt;
    return it->second;
  }
  std::optional<uint16_t> Intern(std::string_view node) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (auto i = Lookup(node)) return i;
    uint16_t i;
    if (!free_indexes.empty()) {
      i = free_indexes.back();
      free_indexes.pop_back();
      names[i] = std::string(node);
    } else {
      if (names.size() >= kMaxNodes) return std::nullopt;
      i = static_cast<uint16_t>(names.size());
      names.emplace_back(node);
      counts.push_back(0);
    }
    index.emplace(std::string(node), i);
    return i;
  }
  void Dropped(uint16_t node, size_t n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    holders -= n;
    counts[node] -= n;
    if (counts[node] == 0) {
      index.erase(names[node]);
      names[node].clear();
      names[node].shrink_to_fit();
      free_indexes.push_back(node);
    }
  }

  // Removes holders matching pred from every entry (erasing emptied ones); returns pairs dropped.
  template <typename Pred>
  size_t RemoveAll(Pred pred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    size_t total = 0;
    for (auto it = entries.begin(); it != entries.end();) {
      int64_t delta = 0;
      HolderList& list = it->second;
      size_t n = list.RemoveIf(
          [&](const Holder& h) {
            if (!pred(h)) return false;
            Dropped(h.node, 1);
            return true;
          },
          &delta);
      heap_bytes += delta;
      total += n;
      if (list.empty()) {
        entries.erase(it++);
      } else {
        ++it;
      }
    }
    return total;
  }
};

Directory::Directory() : impl_(new Impl) {}
Directory::~Directory() { delete impl_; }

size_t Directory::Announce(std::string_view node, std::span<const BlockId> ids,
                           std::span<const LocationTier> tiers, absl::Time expires,
                           size_t max_per_node) {
  absl::MutexLock lock(&impl_->mu);
  auto idx = impl_->Intern(node);
  if (!idx) return ids.size();  // more than 65,535 distinct holders: refuse rather than alias
  uint32_t expiry = impl_->ExpirySeconds(expires);
  size_t refused = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    LocationTier tier = tiers.size() == 1  ? tiers[0]
                        : i < tiers.size() ? tiers[i]
                                           : LocationTier::kUnknown;
    auto it = impl_->entries.find(ids[i]);
    if (it != impl_->entries.end()) {
      if (Holder* h = it->second.Find(*idx)) {
        h->tier = static_cast<uint8_t>(tier);
        h->expiry = expiry;
        continue;
      }
    }
    if (impl_->counts[*idx] >= max_per_node) {
      ++refused;
      continue;
    }
    HolderList& list = it != impl_->entries.end() ? it->second : impl_->entries[ids[i]];
    int64_t delta = 0;
    list.Add(Holder{*idx, static_cast<uint8_t>(tier), 0, expiry}, &delta);
    impl_->heap_bytes += delta;
    ++impl_->holders;
    ++impl_->counts[*idx];
  }
  if (impl_->counts[*idx] == 0) impl_->Dropped(*idx, 0);  // empty announcement: don't keep it
  return refused;
}

size_t Directory::entries_of(std::string_view node) const {
  absl::MutexLock lock(&impl_->mu);
  auto idx = impl_->Lookup(node);
  return idx ? impl_->counts[*idx] : 0;
}

void Directory::Withdraw(std::string_view node, std::span<const BlockId> ids) {
  absl::MutexLock lock(&impl_->mu);
  auto idx = impl_->Lookup(node);
  if (!idx) return;
  uint16_t n = *idx;
  size_t dropped = 0;
  for (const BlockId& id : ids) {
    auto it = impl_->entries.find(id);
    if (it == impl_->entries.end()) continue;
    int64_t delta = 0;
    dropped += it->second.RemoveIf([n](const Holder& h) { return h.node == n; }, &delta);
    impl_->heap_bytes += delta;
    if (it->second.empty()) impl_->entries.erase(it);
  }
  if (dropped) impl_->Dropped(n, dropped);
}

size_t Directory::RemoveNode(std::string_view node) {
  absl::MutexLock lock(&impl_->mu);
  auto idx = impl_->Lookup(node);
  if (!idx) return 0;
  uint16_t n = *idx;
  return impl_->RemoveAll([n](const Holder& h) { return h.node == n; });
}

std::vector<std::vector<Location>> Directory::Locate(std::span<const BlockId> ids,
                                                     absl::Time now) const {
  std::vector<std::vector<Location>> out(ids.size());
  absl::ReaderMutexLock lock(&impl_->mu);
  int64_t now_s = impl_->NowSeconds(now);
  for (size_t i = 0; i < ids.size(); ++i) {
    auto it = impl_->entries.find(ids[i]);
    if (it == impl_->entries.end()) continue;
    const HolderList& list = it->second;
    size_t n = list.size();
    for (size_t j = 0; j < n; ++j) {
      const Holder& h = list.at(j);
      if (static_cast<int64_t>(h.expiry) <= now_s) continue;
      out[i].push_back(Location{impl_->names[h.node], static_cast<LocationTier>(h.tier)});
    }
  }
  return out;
}

size_t Directory::Expire(absl::Time now) {
  absl::MutexLock lock(&impl_->mu);
  int64_t now_s = impl_->NowSeconds(now);
  if (now_s < 0) return 0;
  return impl_->RemoveAll(
      [now_s](const Holder& h) { return static_cast<int64_t>(h.expiry) <= now_s; });
}

size_t Directory::Retain(const std::function<bool(const BlockId&)>& keep) {
  absl::MutexLock lock(&impl_->mu);
  size_t gone = 0;
  for (auto it = impl_->entries.begin(); it != impl_->entries.end();) {
    if (keep(it->first)) {
      ++it;
      continue;
    }
    int64_t delta = 0;
    it->second.RemoveIf(
        [&](const Holder& h) {
          impl_->Dropped(h.node, 1);
          return true;
        },
        &delta);
    impl_->heap_bytes += delta;
    impl_->entries.erase(it++);
    ++gone;
  }
  return gone;
}

size_t Directory::ids() const {
  absl::ReaderMutexLock lock(&impl_->mu);
  return impl_->entries.size();
}

size_t Directory::holders() const {
  absl::ReaderMutexLock lock(&impl_->mu);
  return impl_->holders;
}

size_t Directory::memory_bytes() const {
  absl::ReaderMutexLock lock(&impl_->mu);
  using Slot = std::pair<const BlockId, HolderList>;
  // Swiss table: one slot and one control byte per bucket, plus a group's worth of cloned
  // control bytes; a single allocation.
  auto table = [](size_t capacity, size_t slot) {
    return capacity == 0 ? 0 : MallocFootprint(capacity * (slot + 1) + 16);
  };
  size_t bytes = sizeof(Impl);
  bytes += table(impl_->entries.capacity(), sizeof(Slot));
  // Out-of-line holders (second and later holders of an id), each array its own malloc.
  bytes += static_cast<size_t>(impl_->heap_bytes);
  // Intern table.
  bytes += table(impl_->index.capacity(), sizeof(std::pair<const std::string, uint16_t>));
  bytes += impl_->names.capacity() * sizeof(std::string) +
           impl_->counts.capacity() * sizeof(size_t) +
           impl_->free_indexes.capacity() * sizeof(uint16_t);
  for (const auto& name : impl_->names) {
    if (name.capacity() > 15) bytes += 2 * MallocFootprint(name.capacity() + 1);  // + index key
  }
  return bytes;
}

}  // namespace strata::placement
