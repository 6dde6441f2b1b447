// HostTier: tenants (quota accounting, per-tenant LRU lists) and zones (where a namespace's
// blocks go in a zoned arena, and which victims free space there). Split from host_tier.cc.
#include "storage/host_tier.h"

namespace strata {

void HostTier::SetNamespaceTenant(const NamespaceId& ns_id, std::string_view name) {
  absl::MutexLock lock(&mu_);
  const bool known = namespaces_.contains(ns_id);
  const uint32_t ns = InternNamespace(ns_id);
  if (namespace_tenant_[ns] != kNil) return;
  auto [it, inserted] =
      tenant_index_.try_emplace(std::string(name), static_cast<uint32_t>(tenants_.size()));
  const uint32_t t = it->second;
  if (inserted) {
    tenants_.push_back(Tenant{std::string(name)});
    tenants_[t].zone = common_zone_;
    for (size_t z = 0; z < options_.zones.size(); ++z)
      if (!name.empty() && options_.zones[z].tenant == name) {
        tenants_[t].zone = static_cast<uint32_t>(z);
        zones_[z].tenant = t;
      }
  }
  namespace_tenant_[ns] = t;
  if (!known) return;
  // An internal writer (a promotion after a restart, a replica) put blocks here before any
  // client opened the namespace: charge them now. Once per namespace, so the scan is rare.
  Tenant& tn = tenants_[t];
  for (uint32_t slot = 0; slot < entries_.size(); ++slot) {
    const Entry& e = entries_[slot];
    if (e.ns != ns) continue;
    if (e.state == State::kReserved) {
      tn.reserved += e.size;
    } else if (e.state == State::kCommitted) {
      tn.committed += e.size;
      if (e.demoting) {
        tn.demoting += e.size;
      } else {
        LinkTenantLru(slot);
      }
    }
  }
}

absl::flat_hash_map<std::string, HostTier::TenantUsage> HostTier::UsageByTenant() const {
  absl::MutexLock lock(&mu_);
  absl::flat_hash_map<std::string, TenantUsage> out;
  for (const Tenant& t : tenants_) out[t.name] = {t.committed - t.demoting, t.reserved};
  return out;
}

void HostTier::LinkTenantLru(uint32_t slot) {
  Entry& e = entries_[slot];
  const uint32_t t = TenantOf(e);
  if (t == kNil || e.in_tenant_lru) return;
  Tenant& tn = tenants_[t];
  e.tprev = tn.tail;
  e.tnext = kNil;
  if (tn.tail != kNil) {
    entries_[tn.tail].tnext = slot;
  } else {
    tn.head = slot;
  }
  tn.tail = slot;
  e.in_tenant_lru = true;
}

void HostTier::UnlinkTenantLru(uint32_t slot) {
  Entry& e = entries_[slot];
  if (!e.in_tenant_lru) return;
  Tenant& tn = tenants_[TenantOf(e)];
  if (e.tprev != kNil) {
    entries_[e.tprev].tnext = e.tnext;
  } else {
    tn.head = e.tnext;
  }
  if (e.tnext != kNil) {
    entries_[e.tnext].tprev = e.tprev;
  } else {
    tn.tail = e.tprev;
  }
  e.tprev = e.tnext = kNil;
  e.in_tenant_lru = false;
}

bool HostTier::MakeTenantRoom(uint32_t t, uint64_t size, absl::Time now) {
  const Tenant& tn = tenants_[t];
  // Evicting committed blocks cannot free reservation quota.
  if (options_.tenant_max_reserved_bytes > 0 &&
      tn.reserved + size > options_.tenant_max_reserved_bytes)
    return false;
  if (options_.tenant_max_share >= 1.0) return true;
  const auto limit =
      static_cast<uint64_t>(options_.tenant_max_share * static_cast<double>(capacity_));
  auto fits = [&] { return tn.committed - tn.demoting + tn.reserved + size <= limit; };
  // Only this tenant's own blocks, oldest first: within its share a tenant is its own LRU cache,
  // and other tenants never pay for it. Leased and pinned blocks are passed over.
  for (uint32_t slot = tn.head; slot != kNil && !fits();) {
    const uint32_t next = entries_[slot].tnext;
    if (Evictable(entries_[slot], now)) {
      policy_->OnRemove(entries_[slot].id);  // chosen here, not by the policy
      EvictVictim(slot);
      ++stats_.quota_evictions;
    }
    slot = next;
  }
  return fits();
}

uint32_t HostTier::ZoneAt(uint64_t offset) const {
  uint32_t z = 0;
  while (z + 1 < zones_.size() && zones_[z + 1].begin <= offset) ++z;
  return z;
}

uint32_t HostTier::ZoneOf(uint32_t ns) const {
  const uint32_t t = namespace_tenant_[ns];
  return t == kNil ? common_zone_ : tenants_[t].zone;
}

std::optional<uint64_t> HostTier::AllocateIn(uint32_t zone, uint64_t size) {
  Zone& z = zones_[zone];
  if (auto off = z.allocator.Allocate(size)) return z.begin + *off;
  return std::nullopt;
}

uint64_t HostTier::AllocatedBytes() const {
  uint64_t n = 0;
  for (const Zone& z : zones_) n += z.allocator.allocated_bytes();
  return n;
}

uint32_t HostTier::NextVictimIn(uint32_t zone, absl::Time now, std::vector<uint32_t>& skipped) {
  if (zones_.size() == 1) return NextVictim(now, skipped);
  // Another zone's free space is of no use here. A tenant's zone holds only its blocks (its
  // list may also hold some in the common zone): its own least recently used one goes first.
  if (const uint32_t t = zones_[zone].tenant; zone != common_zone_) {
    if (t == kNil) return kNil;
    for (uint32_t slot = tenants_[t].head; slot != kNil; slot = entries_[slot].tnext) {
      const Entry& e = entries_[slot];
      if (Evictable(e, now) && !e.demoting && ZoneAt(e.offset) == zone) {
        policy_->OnRemove(e.id);  // chosen here, not by the policy
        return slot;
      }
    }
    return kNil;
  }
  for (uint32_t v; (v = NextVictim(now, skipped)) != kNil;) {
    if (ZoneAt(entries_[v].offset) == zone) return v;
    skipped.push_back(v);
  }
  return kNil;
}

}  // namespace strata
