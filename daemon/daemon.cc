#include "daemon/daemon.h"

#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "common/units.h"
#include "daemon/cache_service.h"
#include "daemon/namespace_registry.h"
#include "storage/arena.h"
#include "storage/host_tier.h"
#include "transport/ucx.h"

namespace strata::daemon {

struct Daemon::Impl {
  DaemonConfig config;
  std::string endpoint;
  std::shared_ptr<transport::Context> ucx;
  std::unique_ptr<transport::Worker> worker;
  std::unique_ptr<MmapArena> mmap_arena;            // when the arena is ours
  std::unique_ptr<transport::MemoryRegion> region;  // the arena as UCX sees it
  std::unique_ptr<transport::ProgressThread> progress;
  std::unique_ptr<HostTier> tier;
  std::unique_ptr<NamespaceRegistry> namespaces;
  std::unique_ptr<CacheService> service;
  std::unique_ptr<grpc::Server> server;
  absl::Notification stop_reclaim;
  std::thread reclaim;
  bool shut_down = false;
};

namespace {

absl::StatusOr<std::string> LoadOrCreateSecret(const DaemonConfig& c) {
  std::string path = c.cluster_secret_file;
  if (path.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(c.data_dir, ec);
    if (ec)
      return absl::FailedPreconditionError(
          absl::StrCat("config field 'data_dir': cannot create ", c.data_dir, ": ", ec.message()));
    path = c.data_dir + "/cluster_secret";
    if (!std::filesystem::exists(path)) {
      unsigned char raw[32];
      if (RAND_bytes(raw, sizeof raw) != 1)
        return absl::InternalError("cannot draw random bytes for the cluster secret");
      std::string hex =
          absl::BytesToHexString(absl::string_view(reinterpret_cast<char*>(raw), sizeof raw));
      std::ofstream out(path, std::ios::trunc);
      out << hex << "\n";
      if (!out)
        return absl::FailedPreconditionError(absl::StrCat("cannot write cluster secret ", path));
      chmod(path.c_str(), 0600);
      spdlog::info("generated a new cluster secret in {}", path);
    }
  }
  std::ifstream in(path);
  if (!in)
    return absl::FailedPreconditionError(
        absl::StrCat("config field 'cluster_secret_file': cannot read ", path));
  std::string secret;
  std::getline(in, secret);
  secret = std::string(absl::StripAsciiWhitespace(secret));
  if (secret.size() < 16)
    return absl::FailedPreconditionError(absl::StrCat(
        "config field 'cluster_secret_file': ", path, " must hold at least 16 characters"));
  return secret;
}

std::string Hostname() {
  char buf[256] = {};
  gethostname(buf, sizeof buf - 1);
  return buf;
}

}  // namespace

Daemon::Daemon(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Daemon::~Daemon() { Shutdown(); }

const std::string& Daemon::endpoint() const { return impl_->endpoint; }

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Start(const DaemonConfig& config) {
  RETURN_IF_ERROR(ValidateConfig(config));
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  const std::string node_id = config.node_id.empty() ? Hostname() : config.node_id;
  ASSIGN_OR_RETURN(std::string secret, LoadOrCreateSecret(config));

  // Data plane: the arena is registered once; clients get its address and rkey at Connect.
  ASSIGN_OR_RETURN(impl->ucx, transport::Context::Create(/*wakeup=*/true));
  ASSIGN_OR_RETURN(impl->worker, transport::Worker::Create(impl->ucx));
  bool huge = false;
  if (config.arena != ArenaSource::kMmap) {
    auto region = impl->ucx->Allocate(config.host_capacity);
    if (region.ok()) {
      impl->region = std::move(*region);
      // Fault every page in now: otherwise the first publish into each page pays a page fault
      // inside the client's RMA, which shows up as a publish-latency spike.
      std::memset(impl->region->data(), 0, impl->region->size());
    } else if (config.arena == ArenaSource::kUcx) {
      return region.status();
    } else {
      spdlog::warn("UCX could not allocate the arena ({}); using an mmap arena",
                   region.status().ToString());
    }
  }
  if (!impl->region) {
    ASSIGN_OR_RETURN(impl->mmap_arena, MmapArena::Create(config.host_capacity, config.huge_pages));
    huge = impl->mmap_arena->huge_pages();
    ASSIGN_OR_RETURN(impl->region,
                     impl->ucx->Register(impl->mmap_arena->data(), impl->mmap_arena->size()));
  }
  impl->progress = std::make_unique<transport::ProgressThread>(impl->worker.get());

  HostTierOptions topts;
  topts.high_watermark = config.high_watermark;
  topts.low_watermark = config.low_watermark;
  topts.reservation_timeout = config.reservation_timeout;
  topts.lease_timeout = config.lease_timeout;
  topts.max_pin_ttl = config.max_pin_ttl;
  topts.max_block_bytes = std::min(config.max_block_size, config.host_capacity);
  impl->tier = std::make_unique<HostTier>(impl->region->data(),
                                          std::min<uint64_t>(impl->region->size(),
                                                             config.host_capacity),
                                          topts);
  impl->namespaces = std::make_unique<NamespaceRegistry>(secret);

  DataPlaneInfo dp;
  dp.node_id = node_id;
  dp.worker_address = impl->worker->address();
  dp.arena_base = reinterpret_cast<uint64_t>(impl->region->data());
  dp.arena_bytes = impl->tier->capacity();
  ASSIGN_OR_RETURN(dp.arena_rkey, impl->region->PackRkey());
  dp.transports = impl->worker->TransportSummary();
  dp.huge_pages = huge;
  impl->service = std::make_unique<CacheService>(impl->tier.get(), impl->namespaces.get(), dp);

  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(config.listen, grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(impl->service.get());
  builder.SetMaxReceiveMessageSize(64 << 20);
  impl->server = builder.BuildAndStart();
  if (!impl->server || port == 0)
    return absl::UnavailableError(
        absl::StrCat("config field 'listen': cannot listen on ", config.listen));
  if (config.listen.rfind("unix:", 0) == 0) {
    impl->endpoint = config.listen;  // a Unix socket has no port to resolve
  } else {
    std::string host = config.listen.substr(0, config.listen.rfind(':'));
    impl->endpoint = absl::StrCat(host, ":", port);
  }

  absl::Duration period = std::min({absl::Seconds(1), config.reservation_timeout / 4,
                                    config.lease_timeout / 4});
  Impl* raw = impl.get();
  impl->reclaim = std::thread([raw, period] {
    while (!raw->stop_reclaim.WaitForNotificationWithTimeout(period)) raw->tier->ReclaimExpired();
  });

  spdlog::info("stratad {} node '{}' listening on {}; host tier {} ({}), UCX transports {}",
               STRATA_VERSION, node_id, impl->endpoint, FormatSize(impl->tier->capacity()),
               impl->mmap_arena ? (huge ? "mmap, huge pages" : "mmap") : "UCX-allocated",
               dp.transports);
  return std::unique_ptr<Daemon>(new Daemon(std::move(impl)));
}

void Daemon::Shutdown() {
  Impl& d = *impl_;
  if (d.shut_down) return;
  d.shut_down = true;
  spdlog::info("draining: refusing new calls, {} for in-flight ones",
               absl::FormatDuration(d.config.shutdown_grace));
  if (!d.service->Drain(d.config.shutdown_grace))
    spdlog::warn("calls still running after {}; cancelling them",
                 absl::FormatDuration(d.config.shutdown_grace));
  // Everything admitted has finished (or is being cancelled): close the server at once.
  d.server->Shutdown(std::chrono::system_clock::now());
  d.stop_reclaim.Notify();
  if (d.reclaim.joinable()) d.reclaim.join();
  d.progress->Stop();
  auto s = d.tier->Stats();
  spdlog::info("stopped: {} blocks, {} open reservations and {} open leases dropped", s.blocks,
               s.open_reservations, s.open_leases);
}

}  // namespace strata::daemon
