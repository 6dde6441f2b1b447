#include "strata/client.h"

#include <grpcpp/grpcpp.h>
#include <sys/mman.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "codec/codec.h"
#include "common/am_wire.h"
#include "common/crc32c.h"
#include "common/packed_ids.h"
#include "common/status_macros.h"
#include "proto/convert.h"
#include "strata/v1/cache.grpc.pb.h"
#include "transport/ucx.h"

namespace strata {
namespace {

template <typename Repeated>
std::vector<BlockStatus> Statuses(const Repeated& r) {
  std::vector<BlockStatus> out;
  out.reserve(r.size());
  for (int s : r) out.push_back(static_cast<BlockStatus>(s));
  return out;
}

}  // namespace

// UCX reaches peers by RDMA only through an HCA; without one it emulates RMA in software.
static bool HostHasRdmaDevice() {
  std::error_code ec;
  std::filesystem::directory_iterator it("/sys/class/infiniband", ec);
  return !ec && it != std::filesystem::directory_iterator();
}

struct Client::Impl {
  ClientOptions options;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Cache::Stub> stub;
  std::string node_id;

  // Data plane. One worker per client; transfers are serialized on it.
  std::mutex ucx_mu;
  std::shared_ptr<transport::Context> ucx;
  std::unique_ptr<transport::Worker> worker;
  std::unique_ptr<transport::Endpoint> ep;
  uint64_t arena_base = 0;
  uint64_t arena_bytes = 0;
  // The daemon's arena mapped into this process when UCX reaches it over shared memory: blocks
  // are then copied with plain loads and stores, checksummed in the same pass. Readers hold
  // map_mu shared; reconnecting replaces the mapping under it exclusively.
  std::shared_mutex map_mu;
  uint8_t* mapped_arena = nullptr;

  std::mutex reg_mu;
  std::map<uintptr_t, std::unique_ptr<transport::MemoryRegion>> registered;  // by start

  struct OpenNs {
    NamespaceSpec spec;
    std::string tenant;
    std::optional<codec::CodecParams> codec;  // nullopt: the "opaque" policy
    uint32_t replicas = 0;
  };

  // Clients of other nodes' daemons, for blocks the local daemon does not hold; by node id.
  std::mutex peers_mu;
  std::map<std::string, std::shared_ptr<Client>> peers;
  bool clustered = false;  // the local daemon has other nodes in its view

  absl::StatusOr<std::shared_ptr<Client>> Peer(const std::string& node, const std::string& address,
                                               const NamespaceId& ns) {
    std::shared_ptr<Client> peer;
    {
      std::lock_guard<std::mutex> lock(peers_mu);
      auto it = peers.find(node);
      if (it != peers.end() && it->second->impl_->options.endpoint == address) peer = it->second;
    }
    if (!peer) {
      ClientOptions o = options;
      o.endpoint = address;
      o.remote_fetch = false;
      o.same_node = false;
      o.client_name = absl::StrCat(options.client_name, "->", node);
      STRATA_ASSIGN_OR_RETURN(std::unique_ptr<Client> made, Client::Connect(o));
      peer = std::move(made);
      std::lock_guard<std::mutex> lock(peers_mu);
      peers[node] = peer;
    }
    if (peer->tokens_per_block(ns) == 0) {
      OpenNs open;
      {
        std::lock_guard<std::mutex> lock(ns_mu);
        auto it = namespaces.find(ns);
        if (it == namespaces.end())
          return absl::FailedPreconditionError(
              absl::StrCat("namespace ", ns.ShortHex(), " was not opened by this client"));
        open = it->second;
      }
      STRATA_ASSIGN_OR_RETURN(NamespaceId there, peer->OpenNamespace(open.spec, open.tenant));
      if (there != ns)
        return absl::FailedPreconditionError(absl::StrCat(
            "node ", node, " derives a different namespace id: its cluster secret differs"));
    }
    return peer;
  }

  KvLayout LayoutOf(const NamespaceId& ns) {
    std::lock_guard<std::mutex> lock(ns_mu);
    auto it = namespaces.find(ns);
    return it == namespaces.end() ? KvLayout{} : it->second.spec.layout;
  }

  // The codec of a namespace this client opened; nullopt when blobs are opaque.
  absl::StatusOr<std::optional<codec::CodecParams>> CodecOf(const NamespaceId& ns) {
    std::lock_guard<std::mutex> lock(ns_mu);
    auto it = namespaces.find(ns);
    if (it == namespaces.end())
      return absl::FailedPreconditionError(
          absl::StrCat("namespace ", ns.ShortHex(), " was not opened by this client"));
    return it->second.codec;
  }
  mutable std::mutex ns_mu;
  absl::flat_hash_map<NamespaceId, OpenNs> namespaces;

  // A second thread that checks CRCs of fetched blocks while later blocks are still moving, so
  // verification costs little extra time on top of the transfer.
  std::mutex verify_mu;
  std::condition_variable verify_cv;
  std::deque<std::function<void()>> verify_jobs;
  bool verify_stop = false;
  std::thread verifier;

  void RunVerifier() {
    std::unique_lock<std::mutex> lock(verify_mu);
    while (true) {
      verify_cv.wait(lock, [&] { return verify_stop || !verify_jobs.empty(); });
      if (verify_jobs.empty()) return;
      auto job = std::move(verify_jobs.front());
      verify_jobs.pop_front();
      lock.unlock();
      job();
      lock.lock();
    }
  }

  void PostVerifyJob(std::function<void()> job) {
    {
      std::lock_guard<std::mutex> lock(verify_mu);
      verify_jobs.push_back(std::move(job));
    }
    verify_cv.notify_one();
  }

  // Faults in this process's page tables for the mapped arena in the background, so the first
  // publish or fetch touching a page does not pay a page fault per 4 KiB inside the copy.
  std::thread prefault;
  std::atomic<bool> prefault_stop{false};

  void StartPrefault() {
    prefault_stop = false;
    prefault = std::thread([this] {
      constexpr uint64_t kStep = 64 << 20;
      for (uint64_t off = 0; off < arena_bytes && !prefault_stop.load(); off += kStep) {
        std::shared_lock<std::shared_mutex> lock(map_mu);
        if (mapped_arena == nullptr) return;
        uint64_t len = std::min(kStep, arena_bytes - off);
        uintptr_t start = reinterpret_cast<uintptr_t>(mapped_arena + off) & ~uintptr_t{4095};
        uintptr_t end = reinterpret_cast<uintptr_t>(mapped_arena + off + len);
        // Only a hint: kernels before 5.14 refuse it and the copies fault pages in as before.
        if (madvise(reinterpret_cast<void*>(start), end - start, MADV_POPULATE_WRITE) != 0) return;
      }
    });
  }

  void StopPrefault() {
    prefault_stop = true;
    if (prefault.joinable()) prefault.join();
  }

  // Runs fn(i) for every i in [0, n) on this thread and the helper thread.
  void ParallelFor(size_t n, const std::function<void(size_t)>& fn) {
    if (n <= 1) {
      if (n == 1) fn(0);
      return;
    }
    std::atomic<size_t> next{0};
    std::atomic<bool> helper_done{false};
    auto work = [&] {
      for (size_t i; (i = next.fetch_add(1)) < n;) fn(i);
    };
    PostVerifyJob([&] {
      work();
      helper_done.store(true);
    });
    work();
    while (!helper_done.load()) std::this_thread::yield();  // it may still be using `fn`
  }

  // One copy job: `len` bytes at `offset` within block `block`.
  struct Piece {
    size_t block;
    uint64_t offset, len;
  };
  static std::vector<Piece> SplitIntoPieces(const std::vector<uint64_t>& sizes) {
    constexpr uint64_t kPiece = 2 << 20;  // big enough that combining CRCs is noise
    std::vector<Piece> pieces;
    for (size_t b = 0; b < sizes.size(); ++b)
      for (uint64_t off = 0; off < sizes[b]; off += kPiece)
        pieces.push_back({b, off, std::min(kPiece, sizes[b] - off)});
    return pieces;
  }
  // CRC of each block from the CRCs of its pieces (pieces are in block order).
  static std::vector<uint32_t> CombinePieces(const std::vector<Piece>& pieces,
                                             const std::vector<uint32_t>& crcs, size_t blocks) {
    std::vector<uint32_t> out(blocks, 0);
    std::vector<bool> started(blocks, false);
    for (size_t i = 0; i < pieces.size(); ++i) {
      size_t b = pieces[i].block;
      out[b] = started[b] ? Crc32cCombine(out[b], crcs[i], pieces[i].len) : crcs[i];
      started[b] = true;
    }
    return out;
  }

  // Moves `ops` by plain copies through the mapped arena (kPut: engine buffer -> arena, kGet:
  // arena -> engine buffer) on two threads. Returns nullopt when the arena is not mapped (RMA is
  // needed), else each op's CRC32C computed during the copy (empty when !checksum).
  std::optional<absl::StatusOr<std::vector<uint32_t>>> CopyThroughMapping(
      const std::vector<transport::RmaOp>& ops, bool checksum) {
    std::shared_lock<std::shared_mutex> lock(map_mu);
    uint8_t* arena = mapped_arena;
    if (arena == nullptr) return std::nullopt;
    std::vector<uint64_t> sizes;
    for (const auto& op : ops) {
      if (op.remote_address + op.length > arena_bytes)
        return absl::StatusOr<std::vector<uint32_t>>(
            absl::InternalError("daemon returned an extent outside its arena"));
      sizes.push_back(op.length);
    }
    auto pieces = SplitIntoPieces(sizes);
    std::vector<uint32_t> piece_crcs(pieces.size());
    ParallelFor(pieces.size(), [&](size_t i) {
      const Piece& p = pieces[i];
      const transport::RmaOp& op = ops[p.block];
      uint8_t* local = static_cast<uint8_t*>(op.local) + p.offset;
      uint8_t* remote = arena + op.remote_address + p.offset;
      uint8_t* dst = op.kind == transport::RmaOp::kGet ? local : remote;
      const uint8_t* src = op.kind == transport::RmaOp::kGet ? remote : local;
      if (checksum)
        piece_crcs[i] = CopyWithCrc32c(dst, src, p.len);
      else
        std::memcpy(dst, src, p.len);
    });
    if (!checksum) return absl::StatusOr<std::vector<uint32_t>>(std::vector<uint32_t>{});
    return absl::StatusOr<std::vector<uint32_t>>(CombinePieces(pieces, piece_crcs, ops.size()));
  }

  // One long-lived LookupStream per client (see cache.proto). Used when free; a lookup that
  // finds it busy, broken or not yet open takes the unary call instead.
  struct LookupStreamState {
    grpc::ClientContext ctx;
    grpc::CompletionQueue cq;
    std::unique_ptr<grpc::ClientAsyncReaderWriter<v1::LookupRequest, v1::LookupResponse>> rw;
    bool usable = false;
  };
  std::mutex lookup_stream_mu;
  std::unique_ptr<LookupStreamState> lookup_stream;

  // Waits for `tag` on the stream's queue until `deadline`; false on timeout or failure.
  static bool AwaitTag(LookupStreamState& st, void* tag, absl::Time deadline) {
    void* got = nullptr;
    bool ok = false;
    switch (st.cq.AsyncNext(&got, &ok, absl::ToChronoTime(deadline))) {
      case grpc::CompletionQueue::GOT_EVENT:
        return got == tag && ok;
      default:
        return false;
    }
  }

  // Tears a stream down: cancel, then drain its queue so no operation refers to it any more.
  static void CloseLookupStream(std::unique_ptr<LookupStreamState> st) {
    if (!st) return;
    st->ctx.TryCancel();
    st->cq.Shutdown();
    void* tag;
    bool ok;
    while (st->cq.Next(&tag, &ok)) {
    }
  }

  // nullopt: the stream could not be used (the caller falls back to the unary call).
  std::optional<absl::StatusOr<v1::LookupResponse>> LookupOnStream(const v1::LookupRequest& req) {
    std::unique_lock<std::mutex> lock(lookup_stream_mu, std::try_to_lock);
    if (!lock.owns_lock()) return std::nullopt;
    const absl::Time deadline = absl::Now() + options.rpc_timeout;
    if (!lookup_stream || !lookup_stream->usable) {
      CloseLookupStream(std::move(lookup_stream));
      auto st = std::make_unique<LookupStreamState>();
      st->rw = stub->AsyncLookupStream(&st->ctx, &st->cq, reinterpret_cast<void*>(1));
      if (!AwaitTag(*st, reinterpret_cast<void*>(1), deadline)) {
        CloseLookupStream(std::move(st));
        return std::nullopt;
      }
      st->usable = true;
      lookup_stream = std::move(st);
    }
    LookupStreamState& st = *lookup_stream;
    v1::LookupResponse resp;
    st.rw->Write(req, reinterpret_cast<void*>(2));
    bool written = AwaitTag(st, reinterpret_cast<void*>(2), deadline);
    if (written) st.rw->Read(&resp, reinterpret_cast<void*>(3));
    if (!written || !AwaitTag(st, reinterpret_cast<void*>(3), deadline)) {
      st.usable = false;
      CloseLookupStream(std::move(lookup_stream));
      if (absl::Now() >= deadline)
        return absl::StatusOr<v1::LookupResponse>(absl::DeadlineExceededError(
            absl::StrCat("stratad at ", options.endpoint, " did not answer Lookup within ",
                         absl::FormatDuration(options.rpc_timeout))));
      return std::nullopt;  // the stream broke (daemon restarted?): the unary call decides
    }
    if (resp.error_code() != 0)
      return absl::StatusOr<v1::LookupResponse>(
          absl::Status(static_cast<absl::StatusCode>(resp.error_code()),
                       absl::StrCat("Lookup: ", resp.error_message())));
    return absl::StatusOr<v1::LookupResponse>(std::move(resp));
  }

  // Lookup fast path (common/am_wire.h). The reply arrives through the worker, which only
  // the thread holding ucx_mu progresses, so `am_wait` needs no lock of its own.
  struct AmWait {
    uint64_t request_id = 0;
    bool done = false;
    am_wire::ReplyHeader header;
    std::string data;
  };
  AmWait* am_wait = nullptr;
  uint64_t am_next_id = 1;
  int am_timeouts = 0;     // consecutive; the fast path is switched off after a few
  bool am_enabled = true;  // options.lookup_fast_path, until the fast path keeps timing out

  void OnAmReply(const transport::AmMessage& m) {
    am_wire::ReplyHeader h;
    if (!am_wait || !am_wire::DecodeReplyHeader(m.header, &h) ||
        h.request_id != am_wait->request_id)
      return;  // a late reply to a lookup that already gave up
    am_wait->header = h;
    am_wait->data.assign(m.data);
    am_wait->done = true;
  }

  // nullopt: no definitive answer this way (disabled, too many ids, timeout, an error, or the
  // prompt continues on other nodes); the caller asks the gRPC Lookup.
  std::optional<v1::LookupResponse> AmLookup(const NamespaceId& ns, std::span<const BlockId> ids) {
    if (ids.empty() || ids.size() > am_wire::kMaxIds) return std::nullopt;
    std::lock_guard<std::mutex> lock(ucx_mu);
    if (!am_enabled || !ep || ep->failed()) return std::nullopt;
    AmWait wait;
    wait.request_id = am_next_id++;
    std::string header(am_wire::kRequestHeaderBytes, '\0');
    am_wire::PutU64(header.data(), wait.request_id);
    std::memcpy(header.data() + 8, ns.bytes.data(), 32);
    std::string data = PackIds(ids);
    // Short: a daemon that does not answer this way is asked through gRPC instead.
    const absl::Time deadline =
        absl::Now() + std::min(options.rpc_timeout, absl::Milliseconds(250));
    am_wait = &wait;
    absl::Status sent = ep->AmSend(am_wire::kLookupRequestAm, header, data, deadline);
    unsigned spins = 0;
    while (sent.ok() && !wait.done) {
      worker->Progress();
      if ((++spins & 63) == 0 && absl::Now() >= deadline) break;
    }
    am_wait = nullptr;
    if (!wait.done) {
      if (++am_timeouts >= 3) {
        am_enabled = false;  // e.g. a daemon without the fast path: stop paying the wait
        std::fprintf(stderr, "libstrata: lookup fast path disabled after %d timeouts (%s)\n",
                     am_timeouts, std::string(sent.message()).c_str());
      }
      return std::nullopt;
    }
    am_timeouts = 0;
    const auto& h = wait.header;
    if (h.code != 0 || !h.complete || h.prefix > ids.size() || wait.data.size() != h.prefix)
      return std::nullopt;
    v1::LookupResponse resp;
    resp.set_prefix_blocks(h.prefix);
    for (char t : wait.data) resp.add_tiers(static_cast<v1::Tier>(static_cast<uint8_t>(t)));
    resp.set_node_id(node_id);
    return resp;
  }

  // Fetch by push (common/am_wire.h); like am_wait, touched only by the ucx_mu holder.
  struct PushWait {
    uint64_t request_id = 0;
    std::vector<void*> dest;
    std::vector<size_t> length;
    std::vector<ucp_mem_h> memh;
    size_t done = 0;
    absl::Status error;
    std::vector<std::pair<size_t, void*>> kept;  // rendezvous payloads to receive
    std::function<void(size_t)> on_landed;       // block i is complete in its buffer
  };
  PushWait* push_wait = nullptr;
  uint64_t push_next_id = 1;
  bool push_fetch = false;  // decided at each (re)connect

  bool OnPushBlock(const transport::AmMessage& m) {
    if (!push_wait || m.header.size() != am_wire::kFetchBlockHeaderBytes ||
        am_wire::GetU64(m.header.data()) != push_wait->request_id)
      return false;  // a late block of a fetch that gave up: dropped
    PushWait& w = *push_wait;
    const uint32_t index = am_wire::GetU32(m.header.data() + 8);
    const uint32_t code = am_wire::GetU32(m.header.data() + 12);
    if (index == am_wire::kFetchRefused) {
      w.error = absl::Status(code == 0 ? absl::StatusCode::kInternal : static_cast<absl::StatusCode>(code),
                             absl::StrCat("daemon refused the fetch: ", std::string(m.data)));
      return false;
    }
    if (index >= w.dest.size() || m.length != w.length[index]) {
      w.error = absl::InternalError("daemon sent a block that does not match the request");
      return false;
    }
    if (m.rendezvous) {
      w.kept.emplace_back(index, m.desc);
      return true;
    }
    std::memcpy(w.dest[index], m.data.data(), m.data.size());
    ++w.done;
    if (w.on_landed) w.on_landed(index);
    return false;
  }

  // Moves `ops` (remote_address = arena offset) by asking the daemon to push them; caller
  // holds ucx_mu. On a timeout the endpoint is aborted, so no late byte lands in a buffer the
  // caller has taken back.
  absl::Status PushTransfer(uint64_t lease_id, const std::vector<transport::RmaOp>& ops,
                            absl::Time deadline, std::function<void(size_t)> on_landed = {}) {
    if (!ep || ep->failed()) STRATA_RETURN_IF_ERROR(ConnectDataPlane());
    PushWait w;
    w.on_landed = std::move(on_landed);
    w.request_id = push_next_id++;
    std::string header(am_wire::kFetchRequestHeaderBytes, '\0');
    am_wire::PutU64(header.data(), w.request_id);
    am_wire::PutU64(header.data() + 8, lease_id);
    am_wire::PutU32(header.data() + 16, static_cast<uint32_t>(ops.size()));
    std::string data(ops.size() * 16, '\0');
    for (size_t i = 0; i < ops.size(); ++i) {
      am_wire::PutU64(data.data() + 16 * i, ops[i].remote_address);
      am_wire::PutU64(data.data() + 16 * i + 8, ops[i].length);
      w.dest.push_back(ops[i].local);
      w.length.push_back(ops[i].length);
      w.memh.push_back(FindMemh(ops[i].local, ops[i].length));
    }
    push_wait = &w;
    absl::Status s = ep->AmPost(am_wire::kFetchRequestAm, std::move(header), std::move(data));
    std::vector<std::pair<size_t, void*>> receiving;
    unsigned spins = 0;
    while (s.ok() && w.error.ok() && w.done < ops.size()) {
      worker->Progress();
      for (auto [index, desc] : w.kept) {
        auto r = worker->AmRecvData(desc, w.dest[index], w.length[index], w.memh[index]);
        if (!r.ok()) {
          w.error = r.status();
        } else if (*r == nullptr) {
          ++w.done;
          if (w.on_landed) w.on_landed(index);
        } else {
          receiving.emplace_back(index, *r);
        }
      }
      w.kept.clear();
      for (size_t k = 0; k < receiving.size();) {
        int state = transport::Worker::RequestState(receiving[k].second);
        if (state == 0) {
          ++k;
          continue;
        }
        transport::Worker::RequestFree(receiving[k].second);
        if (state < 0) {
          w.error = absl::UnavailableError("receiving a pushed block failed");
        } else {
          ++w.done;
          if (w.on_landed) w.on_landed(receiving[k].first);
        }
        receiving[k] = receiving.back();
        receiving.pop_back();
      }
      if ((++spins & 63) == 0 && absl::Now() >= deadline) {
        w.error = absl::DeadlineExceededError("pushed blocks did not all arrive in time");
        break;
      }
    }
    if (!s.ok()) w.error = s;
    if (!w.error.ok() && (!receiving.empty() || w.done < ops.size())) {
      // Stop every transfer still aimed at the caller's buffers before returning.
      ep->Abort();
      for (auto [index, r] : receiving) worker->RequestCancel(r);
      const absl::Time stop = absl::Now() + absl::Milliseconds(500);
      for (auto [index, r] : receiving) {
        while (transport::Worker::RequestState(r) == 0 && absl::Now() < stop) worker->Progress();
        // Not finished even now: UCX owns it until it completes; it no longer targets a live
        // connection, so nothing more lands in the buffer.
        transport::Worker::RequestFree(r);
      }
    }
    for (auto [index, desc] : w.kept) worker->AmDiscard(desc);
    push_wait = nullptr;
    return w.error;
  }

  // Fire-and-forget lease releases still in flight.
  std::mutex release_mu;
  std::condition_variable release_cv;
  int releases_in_flight = 0;

  absl::Status Rpc(const char* name, const std::function<grpc::Status(grpc::ClientContext*)>& fn) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + options.rpc_timeout));
    grpc::Status s = fn(&ctx);
    if (s.ok()) return absl::OkStatus();
    auto code = static_cast<absl::StatusCode>(s.error_code());
    if (code == absl::StatusCode::kDeadlineExceeded || code == absl::StatusCode::kUnavailable)
      return absl::Status(
          code, absl::StrCat("stratad at ", options.endpoint, " did not answer ", name, " within ",
                             absl::FormatDuration(options.rpc_timeout), ": ", s.error_message()));
    return absl::Status(code, absl::StrCat(name, ": ", s.error_message()));
  }

  // Runs a namespace-scoped call; if the daemon forgot the namespace (it restarted), reopens it
  // once and retries.
  absl::Status NsRpc(const char* name, const NamespaceId& ns,
                     const std::function<grpc::Status(grpc::ClientContext*)>& fn) {
    absl::Status s = Rpc(name, fn);
    if (s.code() != absl::StatusCode::kFailedPrecondition) return s;
    OpenNs open;
    {
      std::lock_guard<std::mutex> lock(ns_mu);
      auto it = namespaces.find(ns);
      if (it == namespaces.end()) return s;
      open = it->second;
    }
    auto reopened = OpenRpc(open.spec, open.tenant, open.replicas);
    if (!reopened.ok() || *reopened != ns) return s;
    return Rpc(name, fn);
  }

  absl::StatusOr<NamespaceId> OpenRpc(const NamespaceSpec& spec, const std::string& tenant,
                                      uint32_t replicas = 0) {
    v1::OpenNamespaceRequest req;
    *req.mutable_spec() = ToProto(spec);
    req.set_tenant(tenant);
    req.set_replicas(replicas);
    v1::OpenNamespaceResponse resp;
    STRATA_RETURN_IF_ERROR(Rpc("OpenNamespace", [&](grpc::ClientContext* c) {
      return stub->OpenNamespace(c, req, &resp);
    }));
    return Digest::FromBytes(resp.namespace_id());
  }

  // (Re)builds the UCX endpoint from a fresh Connect; caller holds ucx_mu.
  absl::Status ConnectDataPlane() {
    v1::ConnectRequest req;
    req.set_client_name(options.client_name);
    v1::ConnectResponse resp;
    STRATA_RETURN_IF_ERROR(
        Rpc("Connect", [&](grpc::ClientContext* c) { return stub->Connect(c, req, &resp); }));
    ep.reset();
    // The daemon is on this node: keep shared-memory transports (see Worker::Connect); gRPC and
    // the transfer deadline detect a daemon that died.
    STRATA_ASSIGN_OR_RETURN(
        ep, worker->Connect(resp.worker_address(), options.same_node
                                                       ? transport::Worker::PeerFailure::kIgnore
                                                       : transport::Worker::PeerFailure::kDetect));
    STRATA_RETURN_IF_ERROR(ep->SetRemoteKey(resp.arena_rkey()));
    arena_base = resp.arena_base();
    arena_bytes = resp.arena_bytes();
    std::unique_lock<std::shared_mutex> map_lock(map_mu);
    mapped_arena = static_cast<uint8_t*>(ep->MapRemote(arena_base));
    map_lock.unlock();
    if (mapped_arena) StartPrefault();
    node_id = resp.node_id();
    clustered = resp.cluster_nodes() > 1;
    push_fetch =
        mapped_arena == nullptr && (options.fetch_transfer == "push" ||
                                    (options.fetch_transfer == "auto" && !HostHasRdmaDevice()));
    return absl::OkStatus();
  }

  ucp_mem_h FindMemh(const void* p, size_t n) {
    std::lock_guard<std::mutex> lock(reg_mu);
    auto it = registered.upper_bound(reinterpret_cast<uintptr_t>(p));
    if (it == registered.begin()) return nullptr;
    --it;
    return it->second->Contains(p, n) ? it->second->handle() : nullptr;
  }

  // ops' remote_address fields hold arena offsets; they are rebased here under the lock.
  absl::Status Transfer(std::vector<transport::RmaOp>& ops, absl::Time deadline) {
    std::lock_guard<std::mutex> lock(ucx_mu);
    if (!ep || ep->failed()) STRATA_RETURN_IF_ERROR(ConnectDataPlane());
    for (auto& op : ops) {
      if (op.remote_address + op.length > arena_bytes)
        return absl::InternalError("daemon returned an extent outside its arena");
      op.remote_address += arena_base;
      op.local_memh = FindMemh(op.local, op.length);
    }
    return ep->Transfer(ops, deadline);
  }

  void ReleaseAsync(uint64_t lease_id) {
    struct Call {
      grpc::ClientContext ctx;
      v1::ReleaseRequest req;
      v1::ReleaseResponse resp;
    };
    auto* call = new Call;
    call->ctx.set_deadline(absl::ToChronoTime(absl::Now() + options.rpc_timeout));
    call->req.set_lease_id(lease_id);
    {
      std::lock_guard<std::mutex> lock(release_mu);
      ++releases_in_flight;
    }
    // The lease also expires on the daemon, so a lost Release costs only delayed reclaim.
    stub->async()->Release(&call->ctx, &call->req, &call->resp, [this, call](grpc::Status) {
      delete call;
      std::lock_guard<std::mutex> lock(release_mu);
      if (--releases_in_flight == 0) release_cv.notify_all();
    });
  }
};

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Client::~Client() {
  impl_->StopPrefault();
  {
    std::lock_guard<std::mutex> lock(impl_->lookup_stream_mu);
    Impl::CloseLookupStream(std::move(impl_->lookup_stream));
  }
  {
    std::lock_guard<std::mutex> lock(impl_->verify_mu);
    impl_->verify_stop = true;
  }
  impl_->verify_cv.notify_all();
  if (impl_->verifier.joinable()) impl_->verifier.join();
  std::unique_lock<std::mutex> lock(impl_->release_mu);
  impl_->release_cv.wait(lock, [this] { return impl_->releases_in_flight == 0; });
  lock.unlock();
  std::lock_guard<std::mutex> ucx_lock(impl_->ucx_mu);
  impl_->ep.reset();
  std::lock_guard<std::mutex> reg_lock(impl_->reg_mu);
  impl_->registered.clear();
}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->am_enabled = options.lookup_fast_path;
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  impl->channel =
      grpc::CreateCustomChannel(options.endpoint, grpc::InsecureChannelCredentials(), args);
  impl->stub = v1::Cache::NewStub(impl->channel);
  STRATA_ASSIGN_OR_RETURN(impl->ucx, transport::Context::Create(/*wakeup=*/false));
  STRATA_ASSIGN_OR_RETURN(impl->worker, transport::Worker::Create(impl->ucx));
  {
    Impl* raw = impl.get();
    STRATA_RETURN_IF_ERROR(impl->worker->SetAmHandler(
        am_wire::kLookupReplyAm, [raw](const transport::AmMessage& m) { raw->OnAmReply(m); }));
    STRATA_RETURN_IF_ERROR(impl->worker->SetAmRendezvousHandler(
        am_wire::kFetchBlockAm,
        [raw](const transport::AmMessage& m) { return raw->OnPushBlock(m); }));
  }
  {
    std::lock_guard<std::mutex> lock(impl->ucx_mu);
    STRATA_RETURN_IF_ERROR(impl->ConnectDataPlane());
  }
  Impl* raw = impl.get();
  impl->verifier = std::thread([raw] { raw->RunVerifier(); });
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

const std::string& Client::node_id() const { return impl_->node_id; }

uint32_t Client::tokens_per_block(const NamespaceId& ns) const {
  std::lock_guard<std::mutex> lock(impl_->ns_mu);
  auto it = impl_->namespaces.find(ns);
  return it == impl_->namespaces.end() ? 0 : it->second.spec.layout.tokens_per_block;
}

absl::StatusOr<NamespaceId> Client::OpenNamespace(const NamespaceSpec& spec,
                                                  const std::string& tenant) {
  return OpenNamespace(spec, tenant, 0);
}

absl::StatusOr<NamespaceId> Client::OpenNamespace(const NamespaceSpec& spec,
                                                  const std::string& tenant, uint32_t replicas) {
  STRATA_RETURN_IF_ERROR(spec.Validate());
  std::optional<codec::CodecParams> params;
  if (spec.codec_policy != kOpaqueCodecPolicy) {
    auto parsed = codec::ParseCodecSpec(spec.codec_policy);
    if (!parsed.ok())
      return absl::InvalidArgumentError(
          absl::StrCat("namespace.codec_policy: ", parsed.status().message()));
    if (auto s = parsed->Validate(spec.layout); !s.ok())
      return absl::InvalidArgumentError(absl::StrCat("namespace.codec_policy: ", s.message()));
    params = *parsed;
  }
  STRATA_ASSIGN_OR_RETURN(NamespaceId id, impl_->OpenRpc(spec, tenant, replicas));
  std::lock_guard<std::mutex> lock(impl_->ns_mu);
  impl_->namespaces[id] = {spec, tenant, params, replicas};
  return id;
}

absl::Status Client::RegisterBuffer(void* data, size_t size) {
  STRATA_ASSIGN_OR_RETURN(auto region, impl_->ucx->Register(data, size));
  std::lock_guard<std::mutex> lock(impl_->reg_mu);
  impl_->registered[reinterpret_cast<uintptr_t>(data)] = std::move(region);
  return absl::OkStatus();
}

absl::Status Client::UnregisterBuffer(void* data) {
  std::lock_guard<std::mutex> lock(impl_->reg_mu);
  if (impl_->registered.erase(reinterpret_cast<uintptr_t>(data)) == 0)
    return absl::NotFoundError("buffer was not registered");
  return absl::OkStatus();
}

absl::StatusOr<PublishResult> Client::Publish(const NamespaceId& ns,
                                              std::span<const uint32_t> tokens,
                                              std::span<const ConstBuffer> blocks) {
  uint32_t tpb = tokens_per_block(ns);
  if (tpb == 0)
    return absl::FailedPreconditionError(
        absl::StrCat("namespace ", ns.ShortHex(), " was not opened by this client"));
  std::vector<BlockId> ids = ComputeBlockIds(ns, tpb, tokens);
  if (blocks.size() > ids.size())
    return absl::InvalidArgumentError(absl::StrCat(blocks.size(), " buffers for ", tokens.size(),
                                                   " tokens (", ids.size(), " full blocks)"));
  ids.resize(blocks.size());
  std::vector<BlockId> parents(ids.size());
  for (size_t i = 1; i < ids.size(); ++i) parents[i] = ids[i - 1];
  return PublishIds(ns, ids, parents, blocks);
}

absl::StatusOr<PublishResult> Client::PublishIds(const NamespaceId& ns,
                                                 std::span<const BlockId> ids,
                                                 std::span<const BlockId> parents,
                                                 std::span<const ConstBuffer> blocks) {
  if (ids.size() != blocks.size() || (!parents.empty() && parents.size() != ids.size()))
    return absl::InvalidArgumentError("ids, parents and blocks must have the same length");
  PublishResult result;
  result.ids.assign(ids.begin(), ids.end());
  if (ids.empty()) return result;
  for (const ConstBuffer& b : blocks)
    if (b.size == 0 || b.data == nullptr)
      return absl::InvalidArgumentError("every block buffer must be non-empty");
  STRATA_ASSIGN_OR_RETURN(auto codec_params, impl_->CodecOf(ns));
  // With a codec, what travels and is stored is each block's encoded blob.
  std::vector<std::vector<uint8_t>> blobs;
  std::vector<ConstBuffer> blob_views;
  if (codec_params) {
    const KvLayout layout = impl_->LayoutOf(ns);
    for (size_t i = 0; i < blocks.size(); ++i)
      if (blocks[i].size != layout.BlockBytes())
        return absl::InvalidArgumentError(
            absl::StrCat("block ", i, " has ", blocks[i].size, " bytes; namespace layout ",
                         layout.DebugString(), " needs ", layout.BlockBytes()));
    blobs.resize(blocks.size());
    std::vector<absl::Status> encoded(blocks.size());
    impl_->ParallelFor(blocks.size(), [&](size_t i) {
      thread_local codec::Encoder encoder;
      encoded[i] =
          encoder.Encode(layout, *codec_params,
                         {static_cast<const uint8_t*>(blocks[i].data), blocks[i].size}, &blobs[i]);
    });
    for (size_t i = 0; i < blocks.size(); ++i) {
      if (!encoded[i].ok())
        return absl::Status(encoded[i].code(),
                            absl::StrCat("encoding block ", i, ": ", encoded[i].message()));
      blob_views.push_back({blobs[i].data(), blobs[i].size()});
    }
    blocks = blob_views;
  }

  v1::ReserveRequest req;
  req.set_namespace_id(std::string(ns.AsBytes()));
  req.set_ids(PackIds(ids));
  if (!parents.empty()) req.set_parent_ids(PackIds(parents));
  for (const ConstBuffer& b : blocks) req.add_sizes(b.size);
  v1::ReserveResponse resp;
  STRATA_RETURN_IF_ERROR(impl_->NsRpc(
      "Reserve", ns, [&](grpc::ClientContext* c) { return impl_->stub->Reserve(c, req, &resp); }));
  if (resp.status_size() != static_cast<int>(ids.size()))
    return absl::InternalError("Reserve answered with the wrong number of statuses");
  result.status = Statuses(resp.status());

  std::vector<transport::RmaOp> ops;
  std::vector<size_t> reserved;  // indexes of kOk blocks, in reservation order
  for (size_t i = 0; i < ids.size(); ++i) {
    if (result.status[i] == BlockStatus::kExists) ++result.deduplicated;
    if (result.status[i] != BlockStatus::kOk) continue;
    reserved.push_back(i);
    ops.push_back({transport::RmaOp::kPut, const_cast<void*>(blocks[i].data), blocks[i].size,
                   resp.offsets(static_cast<int>(i))});
  }
  if (reserved.empty()) return result;

  // Same node with the arena mapped: copy and checksum in one pass. Otherwise RMA put, then CRC.
  std::vector<uint32_t> crcs;
  absl::Status moved = absl::OkStatus();
  if (auto copied = impl_->CopyThroughMapping(ops, /*checksum=*/true)) {
    if (!copied->ok()) return copied->status();
    crcs = std::move(**copied);
  }
  if (crcs.empty()) {
    absl::Duration budget =
        std::min(impl_->options.transfer_timeout, absl::Milliseconds(resp.expires_in_ms()) * 0.8);
    moved = impl_->Transfer(ops, absl::Now() + budget);
    if (moved.ok())
      for (size_t i : reserved) crcs.push_back(Crc32c(blocks[i].data, blocks[i].size));
  }
  if (!moved.ok()) {
    v1::AbortRequest abort;
    abort.set_reservation_id(resp.reservation_id());
    v1::AbortResponse ignored;
    (void)impl_->Rpc(
        "Abort", [&](grpc::ClientContext* c) { return impl_->stub->Abort(c, abort, &ignored); });
    return absl::Status(moved.code(), absl::StrCat("publish transfer failed: ", moved.message()));
  }

  v1::CommitRequest commit;
  commit.set_reservation_id(resp.reservation_id());
  for (uint32_t crc : crcs) commit.add_crc32c(crc);
  v1::CommitResponse committed;
  STRATA_RETURN_IF_ERROR(impl_->Rpc("Commit", [&](grpc::ClientContext* c) {
    return impl_->stub->Commit(c, commit, &committed);
  }));
  if (committed.status_size() != static_cast<int>(reserved.size()))
    return absl::InternalError("Commit answered with the wrong number of statuses");
  for (size_t k = 0; k < reserved.size(); ++k) {
    BlockStatus s = static_cast<BlockStatus>(committed.status(static_cast<int>(k)));
    result.status[reserved[k]] = s;
    if (s == BlockStatus::kOk) {
      ++result.stored;
      result.bytes_sent += blocks[reserved[k]].size;
    }
  }
  return result;
}

namespace {

absl::StatusOr<v1::LookupResponse> LookupCall(Client::Impl* impl, const NamespaceId& ns,
                                              std::span<const BlockId> ids) {
  if (auto fast = impl->AmLookup(ns, ids)) return std::move(*fast);
  v1::LookupRequest req;
  req.set_namespace_id(std::string(ns.AsBytes()));
  req.set_ids(PackIds(ids));
  if (auto streamed = impl->LookupOnStream(req)) {
    // A namespace the daemon forgot (it restarted) is reopened by the unary path below.
    if (streamed->ok()) return std::move(**streamed);
    if (streamed->status().code() != absl::StatusCode::kFailedPrecondition)
      return streamed->status();
  }
  v1::LookupResponse resp;
  STRATA_RETURN_IF_ERROR(impl->NsRpc(
      "Lookup", ns, [&](grpc::ClientContext* c) { return impl->stub->Lookup(c, req, &resp); }));
  return resp;
}

}  // namespace

absl::StatusOr<LookupResult> Client::Lookup(const NamespaceId& ns,
                                            std::span<const uint32_t> tokens) {
  uint32_t tpb = tokens_per_block(ns);
  if (tpb == 0)
    return absl::FailedPreconditionError(
        absl::StrCat("namespace ", ns.ShortHex(), " was not opened by this client"));
  LookupResult r;
  r.ids = ComputeBlockIds(ns, tpb, tokens);
  STRATA_ASSIGN_OR_RETURN(v1::LookupResponse resp, LookupCall(impl_.get(), ns, r.ids));
  r.prefix_blocks = std::min<size_t>(resp.prefix_blocks(), r.ids.size());
  if (resp.nodes_size() > 0 && resp.holder_size() >= static_cast<int>(r.prefix_blocks)) {
    for (size_t i = 0; i < r.prefix_blocks; ++i) {
      uint32_t h = resp.holder(static_cast<int>(i));
      r.nodes.push_back(h < static_cast<uint32_t>(resp.nodes_size())
                            ? resp.nodes(static_cast<int>(h)).id()
                            : std::string());
    }
  }
  r.prefix_tokens = r.prefix_blocks * tpb;
  r.node_id = impl_->node_id;
  return r;
}

absl::StatusOr<size_t> Client::LookupIds(const NamespaceId& ns, std::span<const BlockId> ids) {
  STRATA_ASSIGN_OR_RETURN(v1::LookupResponse resp, LookupCall(impl_.get(), ns, ids));
  return std::min<size_t>(resp.prefix_blocks(), ids.size());
}

namespace {

// One fetch from the daemon `impl` talks to. With `blobs` set, blocks land as stored (no
// decoding) in blobs[i], sized to fit, and `buffers` is ignored.
absl::StatusOr<FetchResult> FetchFromDaemon(Client::Impl* impl_, const NamespaceId& ns,
                                            std::span<const BlockId> ids,
                                            std::span<const MutableBuffer> buffers,
                                            std::vector<std::vector<uint8_t>>* blobs) {
  if (!blobs && ids.size() != buffers.size())
    return absl::InvalidArgumentError(
        absl::StrCat(ids.size(), " ids but ", buffers.size(), " buffers"));
  FetchResult r;
  r.status.assign(ids.size(), BlockStatus::kNotFound);
  r.sizes.assign(ids.size(), 0);
  if (ids.empty()) return r;
  v1::AcquireRequest req;
  req.set_namespace_id(std::string(ns.AsBytes()));
  req.set_ids(PackIds(ids));
  v1::AcquireResponse resp;
  STRATA_RETURN_IF_ERROR(impl_->NsRpc(
      "Acquire", ns, [&](grpc::ClientContext* c) { return impl_->stub->Acquire(c, req, &resp); }));
  const int n = static_cast<int>(ids.size());
  if (resp.status_size() != n || resp.offsets_size() != n || resp.sizes_size() != n ||
      resp.crc32c_size() != n) {
    if (resp.lease_id() != 0) impl_->ReleaseAsync(resp.lease_id());
    return absl::InternalError("Acquire answered with the wrong number of entries");
  }
  auto codec_params = impl_->CodecOf(ns);
  if (!codec_params.ok()) {
    if (resp.lease_id() != 0) impl_->ReleaseAsync(resp.lease_id());
    return codec_params.status();
  }
  const bool decode = codec_params->has_value() && !blobs;
  if (blobs) blobs->assign(ids.size(), {});
  const uint64_t decoded_bytes = decode ? impl_->LayoutOf(ns).BlockBytes() : 0;

  // Blobs land in the engine's buffers, or, with a codec, in staging buffers decoded from.
  std::vector<transport::RmaOp> ops;
  std::vector<size_t> moving;
  std::vector<std::vector<uint8_t>> staging;
  for (int i = 0; i < n; ++i) {
    auto s = static_cast<BlockStatus>(resp.status(i));
    if (s != BlockStatus::kOk) {
      r.status[i] = s;
      continue;
    }
    void* landing = nullptr;
    if (blobs) {
      (*blobs)[i].resize(resp.sizes(i));
      landing = (*blobs)[i].data();
    } else {
      if ((decode ? decoded_bytes : resp.sizes(i)) > buffers[i].size) {
        r.status[i] = BlockStatus::kInvalid;  // the engine's buffer is too small for the block
        continue;
      }
      landing = buffers[i].data;
      if (decode) landing = staging.emplace_back(resp.sizes(i)).data();
    }
    moving.push_back(i);
    ops.push_back({transport::RmaOp::kGet, landing, resp.sizes(i), resp.offsets(i)});
  }
  // A blob carries its own CRC32C, checked by the decoder; opaque blocks are checked here.
  const bool verify = impl_->options.verify_crc && !decode;
  auto finish = [&](std::vector<uint8_t> good) {
    if (decode) {
      impl_->ParallelFor(moving.size(), [&](size_t k) {
        if (!good[k]) return;
        thread_local codec::Decoder decoder;
        good[k] =
            decoder
                .Decode(staging[k], {static_cast<uint8_t*>(buffers[moving[k]].data), decoded_bytes})
                .ok();
      });
    }
    for (size_t k = 0; k < moving.size(); ++k) {
      size_t i = moving[k];
      if (!good[k]) {
        r.status[i] = BlockStatus::kCrcMismatch;
        continue;
      }
      r.status[i] = BlockStatus::kOk;
      r.sizes[i] = decode ? decoded_bytes : resp.sizes(static_cast<int>(i));
      ++r.fetched;
      r.bytes_received += resp.sizes(static_cast<int>(i));
    }
  };
  // Same node with the arena mapped: copy (and checksum in the same pass) under the lease.
  if (auto copied = impl_->CopyThroughMapping(ops, verify)) {
    if (resp.lease_id() != 0) impl_->ReleaseAsync(resp.lease_id());
    if (!copied->ok()) return copied->status();
    std::vector<uint8_t> good(ops.size(), 1);
    for (size_t k = 0; verify && k < ops.size(); ++k)
      good[k] = (**copied)[k] == resp.crc32c(static_cast<int>(moving[k]));
    finish(good);
    return r;
  }

  // No RDMA device: the daemon pushes the blocks (see ClientOptions::fetch_transfer).
  if (impl_->push_fetch && !ops.empty()) {
    absl::Duration budget =
        std::min(impl_->options.transfer_timeout, absl::Milliseconds(resp.expires_in_ms()) * 0.8);
    // Each block's CRC is checked on the verifier thread as soon as it lands, while later
    // blocks are still arriving.
    std::vector<uint8_t> good(ops.size(), verify ? 0 : 1);
    std::mutex checks_mu;
    std::condition_variable checks_cv;
    size_t checks_pending = 0;
    auto on_landed = [&](size_t k) {
      if (!verify) return;
      {
        std::lock_guard<std::mutex> lock(checks_mu);
        ++checks_pending;
      }
      impl_->PostVerifyJob([&, k] {
        uint8_t ok =
            Crc32c(ops[k].local, ops[k].length) == resp.crc32c(static_cast<int>(moving[k]));
        std::lock_guard<std::mutex> lock(checks_mu);
        good[k] = ok;
        if (--checks_pending == 0) checks_cv.notify_all();
      });
    };
    absl::Status moved;
    {
      std::lock_guard<std::mutex> lock(impl_->ucx_mu);
      moved = impl_->PushTransfer(resp.lease_id(), ops, absl::Now() + budget, on_landed);
    }
    {
      // The checks read the caller's buffers: they finish before this call returns.
      std::unique_lock<std::mutex> lock(checks_mu);
      checks_cv.wait(lock, [&] { return checks_pending == 0; });
    }
    if (resp.lease_id() != 0) impl_->ReleaseAsync(resp.lease_id());
    if (!moved.ok())
      return absl::Status(moved.code(), absl::StrCat("fetch transfer failed: ", moved.message()));
    finish(good);
    return r;
  }

  // Blocks move in chunks; a chunk's CRCs are checked (by the verifier thread, and by this thread
  // once it has no transfers left) while the next chunk moves.
  struct Pipeline {
    std::atomic<size_t> transferred{0};  // ops [0, transferred) have landed
    std::atomic<size_t> next{0};         // next op to claim for verification
    std::atomic<bool> aborted{false};
    std::vector<uint8_t> ok;
  };
  auto pipe = std::make_shared<Pipeline>();
  pipe->ok.assign(ops.size(), verify ? 0 : 1);
  auto verify_some = [pipe, &ops, &resp, &moving, n = ops.size()](bool wait_for_more) {
    while (true) {
      size_t i = pipe->next.load();
      if (i >= n || pipe->aborted.load()) return;
      size_t landed = pipe->transferred.load();
      if (i >= landed) {
        if (!wait_for_more) return;
        // Sleep, not spin: over TCP the daemon's progress thread needs this core.
        pipe->transferred.wait(landed);
        continue;
      }
      if (!pipe->next.compare_exchange_weak(i, i + 1)) continue;
      pipe->ok[i] = Crc32c(ops[i].local, ops[i].length) == resp.crc32c(static_cast<int>(moving[i]));
    }
  };
  uint64_t total_bytes = 0;
  for (const auto& op : ops) total_bytes += op.length;
  constexpr uint64_t kChunkBytes = 4 << 20;
  const bool pipelined = verify && ops.size() > 1 && total_bytes >= 2 * kChunkBytes;
  std::atomic<bool> helper_done{!pipelined};
  if (pipelined) {
    impl_->PostVerifyJob([verify_some, &helper_done] {
      verify_some(/*wait_for_more=*/true);
      helper_done.store(true);
    });
  }
  absl::Status moved = absl::OkStatus();
  if (!ops.empty()) {
    absl::Duration budget =
        std::min(impl_->options.transfer_timeout, absl::Milliseconds(resp.expires_in_ms()) * 0.8);
    const absl::Time deadline = absl::Now() + budget;
    size_t begin = 0;
    while (begin < ops.size() && moved.ok()) {
      size_t end = begin;
      uint64_t bytes = 0;
      while (end < ops.size() && (end == begin || !pipelined || bytes < kChunkBytes))
        bytes += ops[end++].length;
      std::vector<transport::RmaOp> chunk(ops.begin() + begin, ops.begin() + end);
      moved = impl_->Transfer(chunk, deadline);
      if (moved.ok()) {
        pipe->transferred.store(end);
        pipe->transferred.notify_all();
      }
      begin = end;
    }
  }
  if (!moved.ok()) {
    pipe->aborted.store(true);
    pipe->transferred.store(SIZE_MAX);  // wakes the helper, which then sees `aborted`
    pipe->transferred.notify_all();
  }
  if (verify && moved.ok()) verify_some(/*wait_for_more=*/false);
  while (!helper_done.load()) std::this_thread::yield();  // the helper reads our buffers
  if (resp.lease_id() != 0) impl_->ReleaseAsync(resp.lease_id());
  if (!moved.ok())
    return absl::Status(moved.code(), absl::StrCat("fetch transfer failed: ", moved.message()));
  finish(pipe->ok);
  return r;
}

}  // namespace

absl::StatusOr<FetchResult> Client::Fetch(const NamespaceId& ns, std::span<const BlockId> ids,
                                          std::span<const MutableBuffer> buffers) {
  STRATA_ASSIGN_OR_RETURN(FetchResult r, FetchFromDaemon(impl_.get(), ns, ids, buffers, nullptr));
  if (!impl_->options.remote_fetch || !impl_->clustered || r.fetched == ids.size()) return r;
  std::vector<size_t> missing;
  for (size_t i = 0; i < ids.size(); ++i)
    if (r.status[i] == BlockStatus::kNotFound) missing.push_back(i);
  if (missing.empty()) return r;
  std::vector<BlockId> missing_ids;
  for (size_t i : missing) missing_ids.push_back(ids[i]);
  auto located = Locate(ns, missing_ids);
  if (!located.ok()) return r;  // the local answer stands: those blocks are misses
  // Each missing block tries its holders in order; a node that fails (dead, timed out, lost the
  // block) passes the block on to the next holder.
  std::vector<size_t> attempt(missing.size(), 0);
  std::vector<size_t> pending(missing.size());
  for (size_t k = 0; k < missing.size(); ++k) pending[k] = k;
  auto holder_of = [&](size_t k) -> const BlockHolder* {
    const auto& hs = (*located)[k];
    while (attempt[k] < hs.size() && hs[attempt[k]].node == impl_->node_id) ++attempt[k];
    return attempt[k] < hs.size() ? &hs[attempt[k]] : nullptr;
  };
  while (!pending.empty()) {
    std::map<std::string, std::vector<size_t>> by_node;
    std::map<std::string, std::string> address;
    for (size_t k : pending)
      if (const BlockHolder* h = holder_of(k)) {
        by_node[h->node].push_back(k);
        address[h->node] = h->address;
      }
    if (by_node.empty()) break;
    pending.clear();
    for (auto& [node, ks] : by_node) {
      std::vector<BlockId> sub_ids;
      std::vector<MutableBuffer> sub_bufs;
      for (size_t k : ks) {
        sub_ids.push_back(ids[missing[k]]);
        sub_bufs.push_back(buffers[missing[k]]);
      }
      absl::StatusOr<FetchResult> got = absl::UnavailableError("not tried");
      auto peer = impl_->Peer(node, address[node], ns);
      if (peer.ok()) got = (*peer)->Fetch(ns, sub_ids, sub_bufs);
      for (size_t j = 0; j < ks.size(); ++j) {
        size_t k = ks[j], i = missing[k];
        if (got.ok() && got->status[j] == BlockStatus::kOk) {
          r.status[i] = BlockStatus::kOk;
          r.sizes[i] = got->sizes[j];
          ++r.fetched;
          r.bytes_received += got->sizes[j];
          ++r.remote;
          continue;
        }
        if (got.ok() && got->status[j] == BlockStatus::kCrcMismatch)
          r.status[i] = BlockStatus::kCrcMismatch;  // reported unless a replica serves it
        ++attempt[k];
        pending.push_back(k);
      }
    }
  }
  return r;
}

absl::StatusOr<FetchResult> Client::FetchBlobs(const NamespaceId& ns, std::span<const BlockId> ids,
                                               std::vector<std::vector<uint8_t>>* blobs) {
  return FetchFromDaemon(impl_.get(), ns, ids, {}, blobs);
}

absl::StatusOr<std::vector<std::vector<BlockHolder>>> Client::Locate(const NamespaceId& ns,
                                                                     std::span<const BlockId> ids) {
  v1::LocateRequest req;
  req.set_namespace_id(std::string(ns.AsBytes()));
  req.set_ids(PackIds(ids));
  v1::LocateResponse resp;
  STRATA_RETURN_IF_ERROR(impl_->NsRpc(
      "Locate", ns, [&](grpc::ClientContext* c) { return impl_->stub->Locate(c, req, &resp); }));
  if (resp.holders_per_id_size() != static_cast<int>(ids.size()))
    return absl::InternalError("Locate answered with the wrong number of entries");
  std::vector<std::vector<BlockHolder>> out(ids.size());
  int next = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    for (uint32_t h = 0; h < resp.holders_per_id(static_cast<int>(i)); ++h, ++next) {
      if (next >= resp.holder_node_size() || next >= resp.holder_tier_size() ||
          resp.holder_node(next) >= static_cast<uint32_t>(resp.nodes_size()))
        return absl::InternalError("Locate answered with inconsistent holder lists");
      const auto& n = resp.nodes(static_cast<int>(resp.holder_node(next)));
      out[i].push_back(
          {n.id(), n.address(), resp.holder_tier(next) == v1::TIER_NVME ? "nvme" : "host"});
    }
  }
  return out;
}

absl::StatusOr<RepositionOutcome> Client::Reposition(const NamespaceId& ns,
                                                     std::span<const BlockId> ids,
                                                     const std::string& target_node, bool move) {
  v1::RepositionRequest req;
  req.set_namespace_id(std::string(ns.AsBytes()));
  req.set_ids(PackIds(ids));
  req.set_target_node(target_node);
  req.set_target_tier(v1::TIER_HOST);
  req.set_move(move);
  v1::RepositionResponse resp;
  STRATA_RETURN_IF_ERROR(impl_->NsRpc("Reposition", ns, [&](grpc::ClientContext* c) {
    return impl_->stub->Reposition(c, req, &resp);
  }));
  if (resp.status_size() != static_cast<int>(ids.size()))
    return absl::InternalError("Reposition answered with the wrong number of statuses");
  return RepositionOutcome{Statuses(resp.status()), resp.copied(), resp.already_there(),
                           resp.removed_sources()};
}

absl::StatusOr<EvictOutcome> Client::Evict(const NamespaceId& ns, std::span<const BlockId> ids,
                                           bool cascade, bool force) {
  v1::EvictRequest req;
  req.set_namespace_id(std::string(ns.AsBytes()));
  req.set_ids(PackIds(ids));
  req.set_cascade(cascade);
  req.set_force(force);
  v1::EvictResponse resp;
  STRATA_RETURN_IF_ERROR(impl_->NsRpc(
      "Evict", ns, [&](grpc::ClientContext* c) { return impl_->stub->Evict(c, req, &resp); }));
  return EvictOutcome{Statuses(resp.status()), resp.removed_blocks()};
}

absl::StatusOr<std::vector<BlockStatus>> Client::Pin(const NamespaceId& ns,
                                                     std::span<const BlockId> ids,
                                                     absl::Duration ttl) {
  v1::PinRequest req;
  req.set_namespace_id(std::string(ns.AsBytes()));
  req.set_ids(PackIds(ids));
  req.set_ttl_ms(static_cast<uint64_t>(absl::ToInt64Milliseconds(ttl)));
  v1::PinResponse resp;
  STRATA_RETURN_IF_ERROR(impl_->NsRpc(
      "Pin", ns, [&](grpc::ClientContext* c) { return impl_->stub->Pin(c, req, &resp); }));
  return Statuses(resp.status());
}

absl::StatusOr<std::vector<BlockStatus>> Client::Unpin(const NamespaceId& ns,
                                                       std::span<const BlockId> ids) {
  v1::UnpinRequest req;
  req.set_namespace_id(std::string(ns.AsBytes()));
  req.set_ids(PackIds(ids));
  v1::UnpinResponse resp;
  STRATA_RETURN_IF_ERROR(impl_->NsRpc(
      "Unpin", ns, [&](grpc::ClientContext* c) { return impl_->stub->Unpin(c, req, &resp); }));
  return Statuses(resp.status());
}

absl::StatusOr<DaemonStats> Client::Stats() {
  v1::StatsRequest req;
  v1::StatsResponse resp;
  STRATA_RETURN_IF_ERROR(impl_->Rpc(
      "Stats", [&](grpc::ClientContext* c) { return impl_->stub->Stats(c, req, &resp); }));
  DaemonStats s;
  s.node_id = resp.node_id();
  s.version = resp.version();
  s.uptime_ms = resp.uptime_ms();
  for (const auto& t : resp.tiers()) {
    if (t.tier() != v1::TIER_HOST) continue;
    s.host_capacity_bytes = t.capacity_bytes();
    s.host_used_bytes = t.used_bytes();
    s.host_blocks = t.blocks();
    s.host_reserved_bytes = t.reserved_bytes();
  }
  s.open_reservations = resp.open_reservations();
  s.open_leases = resp.open_leases();
  s.pinned_blocks = resp.pinned_blocks();
  s.namespaces = resp.namespaces();
  s.transport = resp.transport();
  std::map<std::string, uint64_t> sorted(resp.counters().begin(), resp.counters().end());
  s.counters.assign(sorted.begin(), sorted.end());
  return s;
}

}  // namespace strata
