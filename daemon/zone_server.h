// Hands each authenticated same-node client the sealed file of its own tenant's arena zone
// (storage/zoned_arena.h, common/zone_wire.h), over an abstract unix socket named after the
// daemon instance. Only with several tenants: otherwise clients map the whole arena through
// UCX, or nothing.
//
// Where zones are read-only it also takes the staging windows clients lend it
// (daemon/staging_table.h): the loan lasts while the client keeps that connection open.
//
// One thread serves one connection at a time; each has a short deadline for its request and
// its reply, so a client that connects and says nothing delays the others by at most that.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/auth.h"
#include "daemon/staging_table.h"
#include "storage/zoned_arena.h"

namespace strata::daemon {

class ZoneServer {
 public:
  // Who a Connect ticket stands for; nullopt when it stands for nobody.
  using TicketCheck = std::function<std::optional<Caller>(std::string_view ticket)>;

  // Listens on the abstract socket `name` (without the leading NUL; clients get it as "@name").
  // `stagings` (may be null: no staging windows) must outlive the server.
  static absl::StatusOr<std::unique_ptr<ZoneServer>> Start(const ZonedArena* arena,
                                                           StagingTable* stagings,
                                                           TicketCheck check,
                                                           const std::string& name,
                                                           absl::Duration io_deadline =
                                                               absl::Milliseconds(500));
  ~ZoneServer();
  ZoneServer(const ZoneServer&) = delete;
  ZoneServer& operator=(const ZoneServer&) = delete;

  // What a client is told to dial: "@" + name.
  const std::string& address() const { return address_; }
  uint64_t handed_out() const { return handed_out_.load(); }
  uint64_t refused() const { return refused_.load(); }
  // Staging windows lent and (their connection closed) returned, since the start.
  uint64_t staging_lent() const { return staging_lent_.load(); }
  uint64_t staging_returned() const { return staging_returned_.load(); }

 private:
  ZoneServer(const ZonedArena* arena, StagingTable* stagings, TicketCheck check,
             absl::Duration io_deadline)
      : arena_(arena), stagings_(stagings), check_(std::move(check)), io_deadline_(io_deadline) {}
  void Run();
  // Answers the request on `conn`; the id of the staging window lent, when one was (the caller
  // then keeps `conn` open until the client closes it).
  std::optional<uint64_t> Serve(int conn);

  const ZonedArena* const arena_;
  StagingTable* const stagings_;
  const TicketCheck check_;
  const absl::Duration io_deadline_;
  std::string address_;
  int listen_fd_ = -1;
  int stop_fd_ = -1;  // an eventfd: readable once the destructor wants the thread to end
  std::thread thread_;
  std::atomic<uint64_t> handed_out_{0}, refused_{0}, staging_lent_{0}, staging_returned_{0};
  std::vector<std::pair<int, uint64_t>> lent_;  // connection, staging window id (thread_ only)
};

}  // namespace strata::daemon
