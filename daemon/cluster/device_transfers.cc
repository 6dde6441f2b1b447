#include "daemon/cluster/device_transfers.h"

#include <grpcpp/grpcpp.h>
#include <openssl/rand.h>
#include <spdlog/spdlog.h>

#include <future>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/packed_ids.h"
#include "daemon/logging.h"
#include "proto/convert.h"

namespace strata::daemon {
namespace {

constexpr size_t kMaxIdsPerTransfer = 16384;
// How long a peer that cannot have a device link with this node (none there, another kind) is
// not asked again.
constexpr absl::Duration kBackoff = absl::Seconds(30);
// How long after a failed attempt to make a link with a peer that has links.
constexpr absl::Duration kShortBackoff = absl::Seconds(5);

absl::Status FromGrpc(const grpc::Status& s, const std::string& what) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat(what, ": ", s.error_message()));
}

uint64_t RandomNonZero() {
  uint64_t v = 0;
  while (v == 0)
    if (RAND_bytes(reinterpret_cast<unsigned char*>(&v), sizeof v) != 1) v = 0;
  return v;
}

}  // namespace

DeviceTransfers::DeviceTransfers(ClusterContext& ctx, GpuTieredStore& gpu,
                                 NamespaceRegistry& namespaces,
                                 std::unique_ptr<transport::DeviceLinkFactory> factory)
    : ctx_(ctx), gpu_(gpu), namespaces_(namespaces), factory_(std::move(factory)) {}

DeviceTransfers::~DeviceTransfers() { Stop(); }

void DeviceTransfers::TearDown(Slot& slot) {
  std::shared_ptr<transport::DeviceLink> link;
  {
    std::lock_guard<std::mutex> lock(slot.state_mu);
    slot.dropped = true;
    link = std::move(slot.link);
  }
  if (link) link->Abort();
}

void DeviceTransfers::Stop() {
  absl::flat_hash_map<std::string, std::shared_ptr<Slot>> slots;
  std::vector<uint64_t> leases;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
    slots.swap(slots_);
    for (auto it = parts_.begin(); it != parts_.end();) {
      if (it->second.send && !it->second.running) {
        leases.push_back(it->second.lease);
        parts_.erase(it++);
      } else {
        ++it;
      }
    }
  }
  for (auto& [peer, slot] : slots) TearDown(*slot);
  for (uint64_t l : leases) (void)gpu_.ReleaseOnDevice(l);
  // Joins in progress end by their deadline; the slots wait for them as they go.
}

bool DeviceTransfers::InView(const std::string& node, std::string* address) const {
  auto r = ctx_.ring.Get();
  const placement::NodeRecord* rec = r ? r->view.Find(node) : nullptr;
  if (rec == nullptr || rec->id == ctx_.self.id) return false;
  if (address) *address = rec->address;
  return true;
}

std::shared_ptr<DeviceTransfers::Slot> DeviceTransfers::SlotFor(const std::string& peer) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_) return nullptr;
  auto& slot = slots_[peer];
  if (!slot) slot = std::make_shared<Slot>();
  return slot;
}

void DeviceTransfers::DropSlot(const std::string& peer, const std::shared_ptr<Slot>& slot) {
  std::shared_ptr<Slot> gone;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = slots_.find(peer);
    if (it != slots_.end() && it->second == slot) {
      gone = std::move(it->second);
      slots_.erase(it);
    }
  }
  if (gone) TearDown(*gone);
}

void DeviceTransfers::Retain(const placement::MembershipView& view) {
  std::vector<std::shared_ptr<Slot>> gone;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = slots_.begin(); it != slots_.end();) {
      if (view.Find(it->first) == nullptr) {
        spdlog::info("device link to '{}' torn down: the node left the view", LogSafe(it->first));
        gone.push_back(std::move(it->second));
        slots_.erase(it++);
      } else {
        ++it;
      }
    }
  }
  for (auto& s : gone) TearDown(*s);
}

bool DeviceTransfers::BackingOff(const std::string& peer) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = backoff_.find(peer);
  if (it == backoff_.end()) return false;
  if (it->second > absl::Now()) return true;
  backoff_.erase(it);
  return false;
}

void DeviceTransfers::BackOff(const std::string& peer, std::string_view why,
                              absl::Duration how_long) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    backoff_[peer] = absl::Now() + how_long;
  }
  spdlog::info("no device link with '{}' for {} ({}); its blocks come over UCX",
               LogSafe(peer), absl::FormatDuration(how_long), LogSafe(std::string(why), 512));
}

// ---------------------------------------------------------------------------------------------
// Parts

uint64_t DeviceTransfers::AddPart(Part part) {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t id = RandomNonZero();
  while (parts_.contains(id)) id = RandomNonZero();
  parts_.emplace(id, std::move(part));
  return id;
}

std::optional<DeviceTransfers::Part> DeviceTransfers::TakePart(uint64_t id,
                                                               const std::string& peer) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = parts_.find(id);
  while (it != parts_.end() && it->second.running) {
    part_done_.wait(lock);
    it = parts_.find(id);
  }
  if (it == parts_.end() || it->second.peer != peer) return std::nullopt;
  Part p = std::move(it->second);
  parts_.erase(it);
  return p;
}

void DeviceTransfers::ReleaseExpiredParts() {
  std::vector<uint64_t> leases;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const absl::Time now = absl::Now();
    for (auto it = parts_.begin(); it != parts_.end();) {
      // Receiving parts belong to a Pull in progress, which takes them itself.
      if (it->second.send && !it->second.running && it->second.expires < now) {
        leases.push_back(it->second.lease);
        parts_.erase(it++);
      } else {
        ++it;
      }
    }
  }
  for (uint64_t l : leases) (void)gpu_.ReleaseOnDevice(l);
}

absl::StatusOr<uint64_t> DeviceTransfers::RunPart(uint64_t id, const std::string& peer,
                                                  transport::DeviceLink& link,
                                                  std::span<const uint32_t> take,
                                                  absl::Time deadline) {
  std::vector<transport::DeviceRange> ranges;
  bool send = false;
  uint64_t send_lease = 0;
  std::vector<ArenaExtent> extents;  // send: what the lease must keep while the link reads it
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = parts_.find(id);
    if (it == parts_.end() || it->second.peer != peer || it->second.running || it->second.ran)
      return absl::NotFoundError("no such device transfer here (expired, or another node's)");
    Part& p = it->second;
    send = p.send;
    if (send) {
      for (uint32_t k : take) {
        if (k >= p.ranges.size() || p.ranges[k].size == 0)
          return absl::InvalidArgumentError("device transfer: take names an id not prepared");
        ranges.push_back(p.ranges[k]);
        extents.push_back({p.ranges[k].address - p.device_address, p.ranges[k].size});
      }
      send_lease = p.lease;
    } else {
      ranges = p.ranges;
    }
    p.running = true;
  }
  absl::Status st = absl::OkStatus();
  uint64_t bytes = 0;
  for (const auto& r : ranges) bytes += r.size;
  if (send && !ranges.empty()) {
    // The lease could expire during a long send: its extents stay allocated while read.
    if (gpu_.BeginDeviceRead(send_lease, extents)) {
      st = link.Send(ranges, deadline);
      gpu_.EndDeviceRead(send_lease);
    } else {
      st = absl::FailedPreconditionError("device transfer: the source's lease expired");
    }
  } else if (!ranges.empty()) {
    st = link.Recv(ranges, deadline);
  }
  uint64_t lease = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = parts_.find(id);
    it->second.running = false;
    it->second.ran = true;
    it->second.result = st;
    if (send) {  // the sender is done with its blocks either way
      lease = it->second.lease;
      parts_.erase(it);
    }
  }
  part_done_.notify_all();
  if (lease != 0) (void)gpu_.ReleaseOnDevice(lease);
  if (!st.ok()) return st;
  if (send) {
    n_.blocks_out.fetch_add(ranges.size());
    n_.bytes_out.fetch_add(bytes);
  }
  return bytes;
}

// ---------------------------------------------------------------------------------------------
// Links

absl::Status DeviceTransfers::OpenLink(const std::string& peer, const std::string& address,
                                       Slot& slot, absl::Time deadline) {
  auto id = factory_->NewLinkId();
  if (!id.ok()) return id.status();
  const uint64_t epoch = RandomNonZero();
  v1::JoinDeviceLinkRequest req;
  req.set_node_id(ctx_.self.id);
  req.set_link_id(*id);
  req.set_epoch(epoch);
  req.set_kind(std::string(factory_->kind()));
  v1::JoinDeviceLinkResponse resp;
  grpc::ClientContext cctx;
  cctx.set_deadline(
      absl::ToChronoTime(std::min(deadline, absl::Now() + ctx_.config.peer_timeout)));
  if (grpc::Status s = ctx_.peers.Get(address)->JoinDeviceLink(&cctx, req, &resp); !s.ok()) {
    // Not now, or not at all (no links there, another kind): either way not at every pull.
    BackOff(peer, s.error_message(),
            s.error_code() == grpc::StatusCode::FAILED_PRECONDITION ? kBackoff : kShortBackoff);
    return FromGrpc(s, absl::StrCat("device link to '", peer, "'"));
  }
  auto link = factory_->Connect(*id, 0, std::min(deadline, absl::Now() + LinkSetupTimeout()));
  if (!link.ok()) return link.status();
  std::shared_ptr<transport::DeviceLink> made = std::move(*link);
  {
    std::lock_guard<std::mutex> lock(slot.state_mu);
    if (!slot.dropped) {
      slot.link = made;
      slot.epoch = epoch;
      made = nullptr;
    }
  }
  if (made) {  // torn down meanwhile (the peer left the view, or this node stops)
    made->Abort();
    return absl::UnavailableError(absl::StrCat("device link to '", peer, "' torn down"));
  }
  n_.links_opened.fetch_add(1);
  spdlog::info("device link ({}) to '{}' open", factory_->kind(), LogSafe(peer));
  return absl::OkStatus();
}

absl::Status DeviceTransfers::Join(const v1::JoinDeviceLinkRequest& req) {
  if (!InView(req.node_id()) || IsRankZeroWith(req.node_id()))
    return absl::PermissionDeniedError(
        "JoinDeviceLink: only another node of this view with a lower node id makes a link");
  if (req.kind() != factory_->kind())
    return absl::FailedPreconditionError(absl::StrCat("JoinDeviceLink: this node's device links are ",
                                                      std::string(factory_->kind()), ", not ",
                                                      req.kind()));
  if (req.epoch() == 0 || req.link_id().empty())
    return absl::InvalidArgumentError("JoinDeviceLink needs a link_id and a non-zero epoch");
  auto fresh = std::make_shared<Slot>();
  fresh->epoch = req.epoch();
  auto done = std::make_shared<std::promise<void>>();
  fresh->joined = done->get_future().share();
  std::shared_ptr<Slot> old;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return absl::UnavailableError("stratad is shutting down");
    old = std::exchange(slots_[req.node_id()], fresh);
  }
  if (old) TearDown(*old);
  // Joining blocks until rank 0 joins too (or the set-up deadline): on a thread of its own that
  // holds only what it needs, so nothing here ever waits for it.
  std::thread([factory = factory_, slot = fresh, done, id = req.link_id(),
               deadline = absl::Now() + LinkSetupTimeout()] {
    auto l = factory->Connect(id, 1, deadline);
    std::shared_ptr<transport::DeviceLink> late;
    {
      std::lock_guard<std::mutex> lock(slot->state_mu);
      if (!l.ok()) {
        slot->join_error = l.status();
      } else if (slot->dropped) {
        late = std::move(*l);
      } else {
        slot->link = std::move(*l);
      }
    }
    if (late) late->Abort();
    done->set_value();
  }).detach();
  n_.links_opened.fetch_add(1);
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> DeviceTransfers::Conduct(const std::string& peer, uint64_t mine,
                                                  uint64_t theirs, std::span<const uint32_t> take,
                                                  absl::Time deadline) {
  std::string address;
  if (!InView(peer, &address))
    return absl::FailedPreconditionError(absl::StrCat("node '", peer, "' is not in the view"));
  std::shared_ptr<Slot> slot = SlotFor(peer);
  if (!slot) return absl::UnavailableError("stratad is shutting down");
  std::unique_lock<std::timed_mutex> run(slot->run_mu, std::defer_lock);
  if (!run.try_lock_until(absl::ToChronoTime(deadline)))
    return absl::DeadlineExceededError("device link busy until the deadline");
  std::shared_ptr<transport::DeviceLink> link;
  uint64_t epoch = 0;
  {
    std::lock_guard<std::mutex> lock(slot->state_mu);
    link = slot->link;
    epoch = slot->epoch;
  }
  if (!link) {
    if (absl::Status s = OpenLink(peer, address, *slot, deadline); !s.ok()) {
      DropSlot(peer, slot);
      return s;
    }
    std::lock_guard<std::mutex> lock(slot->state_mu);
    link = slot->link;
    epoch = slot->epoch;
  }
  if (!link) return absl::UnavailableError(absl::StrCat("device link to '", peer, "' torn down"));
  auto stub = ctx_.peers.Get(address);
  v1::RunDeviceTransferRequest req;
  req.set_node_id(ctx_.self.id);
  req.set_epoch(epoch);
  req.set_transfer_id(theirs);
  for (uint32_t k : take) req.add_take(k);
  grpc::ClientContext cctx;
  cctx.set_deadline(absl::ToChronoTime(deadline));
  v1::RunDeviceTransferResponse resp;
  // Either part failing breaks the link, which ends the other part at once instead of at the
  // deadline.
  auto theirs_done = std::async(std::launch::async, [&] {
    grpc::Status s = stub->RunDeviceTransfer(&cctx, req, &resp);
    if (!s.ok()) link->Abort();
    return s;
  });
  absl::StatusOr<uint64_t> ours = RunPart(mine, peer, *link, take, deadline);
  if (!ours.ok()) link->Abort();
  const grpc::Status t = theirs_done.get();
  absl::Status st = ours.status();
  if (!t.ok()) st = FromGrpc(t, absl::StrCat("device transfer part at '", peer, "'"));
  if (!st.ok()) {
    DropSlot(peer, slot);
    return st;
  }
  return *ours;
}

absl::StatusOr<uint64_t> DeviceTransfers::RunAsked(const std::string& peer, uint64_t epoch,
                                                   uint64_t part, std::span<const uint32_t> take,
                                                   absl::Time deadline) {
  if (IsRankZeroWith(peer))
    return absl::PermissionDeniedError("RunDeviceTransfer: this node runs this pair's transfers");
  std::shared_ptr<Slot> slot;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = slots_.find(peer);
    if (it != slots_.end()) slot = it->second;
  }
  if (!slot || slot->epoch != epoch || !slot->joined.valid())
    return absl::FailedPreconditionError("no device link of that epoch with the caller");
  if (slot->joined.wait_until(absl::ToChronoTime(deadline)) != std::future_status::ready)
    return absl::DeadlineExceededError("the device link was still being made at the deadline");
  std::shared_ptr<transport::DeviceLink> link;
  absl::Status join_error;
  {
    std::lock_guard<std::mutex> lock(slot->state_mu);
    link = slot->link;
    join_error = slot->join_error;
  }
  if (!link) {
    DropSlot(peer, slot);
    return join_error.ok() ? absl::UnavailableError("the device link was torn down") : join_error;
  }
  std::unique_lock<std::timed_mutex> run(slot->run_mu, std::defer_lock);
  if (!run.try_lock_until(absl::ToChronoTime(deadline)))
    return absl::DeadlineExceededError("device link busy until the deadline");
  auto bytes = RunPart(part, peer, *link, take, deadline);
  if (!bytes.ok()) {
    link->Abort();
    DropSlot(peer, slot);
  }
  return bytes;
}

absl::StatusOr<uint64_t> DeviceTransfers::Run(const v1::RunDeviceTransferRequest& req,
                                              absl::Time deadline) {
  ReleaseExpiredParts();
  if (!InView(req.node_id()))
    return absl::PermissionDeniedError("RunDeviceTransfer: the caller is not a node of this view");
  std::vector<uint32_t> take(req.take().begin(), req.take().end());
  if (take.size() > kMaxIdsPerTransfer)
    return absl::InvalidArgumentError("RunDeviceTransfer: too many ids");
  if (!req.conduct())
    return RunAsked(req.node_id(), req.epoch(), req.transfer_id(), take, deadline);
  if (!IsRankZeroWith(req.node_id()))
    return absl::PermissionDeniedError("RunDeviceTransfer: the caller is rank 0 of this pair");
  auto r = Conduct(req.node_id(), req.transfer_id(), req.peer_transfer_id(), take, deadline);
  if (!r.ok()) {
    n_.failures.fetch_add(1);
    // A send part that never ran gives its lease back now.
    if (auto p = TakePart(req.transfer_id(), req.node_id()); p && p->send && p->lease != 0)
      (void)gpu_.ReleaseOnDevice(p->lease);
  }
  return r;
}

// ---------------------------------------------------------------------------------------------
// The two sides of a transfer

absl::Status DeviceTransfers::PrepareSend(const v1::PrepareDeviceSendRequest& req,
                                          v1::PrepareDeviceSendResponse* resp) {
  ReleaseExpiredParts();
  if (!InView(req.node_id()))
    return absl::PermissionDeniedError("PrepareDeviceSend: the caller is not a node of this view");
  auto ids = UnpackIds(req.ids(), "ids", kMaxIdsPerTransfer);
  if (!ids.ok()) return ids.status();
  const NamespaceSpec spec = FromProto(req.spec());
  if (absl::Status s = spec.Validate(); !s.ok())
    return absl::InvalidArgumentError(absl::StrCat("spec: ", s.message()));
  auto ns = namespaces_.Open(spec, req.tenant());
  if (!ns.ok()) return ns.status();
  AcquireResult lease = gpu_.AcquireOnDevice(*ns, *ids, /*promote=*/false);
  absl::flat_hash_map<BlockId, BlockId> parents;
  if (lease.lease_id != 0)
    for (const BlockInfo& b : gpu_.InspectOnDevice(*ids))
      if (b.ns == *ns) parents[b.id] = b.parent;
  Part part;
  part.peer = req.node_id();
  part.send = true;
  part.lease = lease.lease_id;
  // Long enough for rank 0 to make a link and queue behind another transfer first.
  part.expires = absl::Now() + LinkSetupTimeout() + ctx_.config.peer_timeout;
  part.device_address = gpu_.memory().device_address();
  part.ranges.resize(ids->size());
  std::vector<BlockId> parent_ids(ids->size());
  for (size_t i = 0; i < ids->size(); ++i) {
    const bool ok = lease.status[i] == BlockStatus::kOk;
    resp->add_status(static_cast<v1::BlockStatus>(ok ? BlockStatus::kOk : BlockStatus::kNotFound));
    resp->add_sizes(ok ? lease.sizes[i] : 0);
    resp->add_crcs(ok ? lease.crcs[i] : 0);
    if (ok) {
      part.ranges[i] = {gpu_.memory().device_address() + lease.offsets[i], lease.sizes[i]};
      parent_ids[i] = parents[(*ids)[i]];
    }
  }
  resp->set_parent_ids(PackIds(parent_ids));
  if (lease.lease_id != 0) resp->set_transfer_id(AddPart(std::move(part)));
  return absl::OkStatus();
}

std::vector<BlockStatus> DeviceTransfers::Pull(const NamespaceSpec& spec, const std::string& tenant,
                                               const NamespaceId& ns, std::span<const BlockId> ids,
                                               const std::string& source_node,
                                               const std::string& source_address,
                                               absl::Time deadline) {
  std::vector<BlockStatus> status(ids.size(), BlockStatus::kNotFound);
  if (ids.empty() || ids.size() > kMaxIdsPerTransfer || !InView(source_node) ||
      BackingOff(source_node))
    return status;
  // 1. The source holds what its device has.
  v1::PrepareDeviceSendRequest preq;
  *preq.mutable_spec() = ToProto(spec);
  preq.set_tenant(tenant);
  preq.set_ids(PackIds(ids));
  preq.set_node_id(ctx_.self.id);
  v1::PrepareDeviceSendResponse prep;
  {
    grpc::ClientContext cctx;
    cctx.set_deadline(absl::ToChronoTime(std::min(deadline, absl::Now() + ctx_.config.peer_timeout)));
    grpc::Status s = ctx_.peers.Get(source_address)->PrepareDeviceSend(&cctx, preq, &prep);
    if (s.error_code() == grpc::StatusCode::FAILED_PRECONDITION ||
        s.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
      // No device links there (or an older stratad).
      BackOff(source_node, s.error_message(), kBackoff);
      return status;
    }
    if (!s.ok()) {
      ctx_.counters.peer_failures.fetch_add(1);
      spdlog::warn("device pull from '{}': {}", LogSafe(source_node),
                   LogSafe(s.error_message(), 512));
      return status;
    }
  }
  auto parents = UnpackIds(prep.parent_ids(), "parent_ids", kMaxIdsPerTransfer);
  if (prep.transfer_id() == 0 || prep.status_size() != static_cast<int>(ids.size()) ||
      prep.sizes_size() != prep.status_size() || prep.crcs_size() != prep.status_size() ||
      !parents.ok() || parents->size() != ids.size())
    return status;
  // 2. Room here.
  std::vector<ReserveItem> items;
  std::vector<uint32_t> item_idx;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (prep.status(i) != v1::BLOCK_OK) continue;
    items.push_back(ReserveItem{ids[i], (*parents)[i], prep.sizes(i)});
    item_idx.push_back(static_cast<uint32_t>(i));
  }
  ReserveResult rr = gpu_.ReserveOnDevice(ns, items);
  Part mine;
  mine.peer = source_node;
  std::vector<uint32_t> take;
  std::vector<BlockId> taken_ids;
  std::vector<uint32_t> taken_crcs;
  std::vector<uint64_t> taken_sizes;
  for (size_t k = 0; k < items.size(); ++k) {
    if (rr.status[k] == BlockStatus::kExists) status[item_idx[k]] = BlockStatus::kExists;
    if (rr.status[k] != BlockStatus::kOk) continue;
    take.push_back(item_idx[k]);
    taken_ids.push_back(items[k].id);
    taken_crcs.push_back(prep.crcs(item_idx[k]));
    taken_sizes.push_back(items[k].size);
    mine.ranges.push_back({gpu_.memory().device_address() + rr.offsets[k], items[k].size});
  }
  // Nothing to move: the source's part gives its lease back when it expires.
  if (take.empty()) {
    if (rr.reservation_id != 0) (void)gpu_.AbortOnDevice(rr.reservation_id);
    return status;
  }
  // 3. Rank 0 runs it.
  const uint64_t my_part = AddPart(std::move(mine));
  absl::Status st;
  if (IsRankZeroWith(source_node)) {
    st = Conduct(source_node, my_part, prep.transfer_id(), take, deadline).status();
  } else {
    v1::RunDeviceTransferRequest run;
    run.set_node_id(ctx_.self.id);
    run.set_transfer_id(prep.transfer_id());
    run.set_peer_transfer_id(my_part);
    run.set_conduct(true);
    for (uint32_t k : take) run.add_take(k);
    v1::RunDeviceTransferResponse resp;
    grpc::ClientContext cctx;
    cctx.set_deadline(absl::ToChronoTime(deadline));
    grpc::Status s = ctx_.peers.Get(source_address)->RunDeviceTransfer(&cctx, run, &resp);
    if (!s.ok()) st = FromGrpc(s, absl::StrCat("device transfer from '", source_node, "'"));
  }
  // 4. Our part wrote the extents (or stopped writing) before they are kept or given back.
  std::optional<Part> done = TakePart(my_part, source_node);
  if (st.ok() && !(done && done->ran && done->result.ok()))
    st = done && !done->result.ok() ? done->result
                                    : absl::InternalError("device transfer: our part did not run");
  if (!st.ok()) {
    (void)gpu_.AbortOnDevice(rr.reservation_id);
    n_.failures.fetch_add(1);
    spdlog::warn("device pull of {} blocks from '{}' failed (they go over UCX): {}", take.size(),
                 LogSafe(source_node), LogSafe(st.ToString(), 512));
    return status;
  }
  auto committed = gpu_.CommitOnDevice(rr.reservation_id, taken_ids, taken_crcs);
  if (!committed.ok()) (void)gpu_.AbortOnDevice(rr.reservation_id);  // held: it never expires
  for (size_t c = 0; c < take.size(); ++c) {
    const BlockStatus b = committed.ok() && c < committed->size() ? (*committed)[c]
                                                                   : BlockStatus::kNotFound;
    status[take[c]] = b == BlockStatus::kOk || b == BlockStatus::kExists ? b
                                                                        : BlockStatus::kNotFound;
    if (b == BlockStatus::kOk) {
      n_.blocks_in.fetch_add(1);
      n_.bytes_in.fetch_add(taken_sizes[c]);
    }
  }
  return status;
}

}  // namespace strata::daemon
