#include "client/daemon_link.h"

#include <algorithm>
#include <cstdlib>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "client/calibrations.h"
#include "codec/codec.h"
#include "common/am_wire.h"
#include "common/crc32c.h"
#include "common/status_macros.h"

namespace strata::client {

absl::StatusOr<std::unique_ptr<DaemonLink>> DaemonLink::Connect(const ClientOptions& options) {
  STRATA_ASSIGN_OR_RETURN(ChannelSecurity security,
                          LoadChannelSecurity(options.tls, options.auth_token));
  return Connect(options, std::move(security));
}

absl::StatusOr<std::unique_ptr<DaemonLink>> DaemonLink::Connect(const ClientOptions& options,
                                                                ChannelSecurity security) {
  std::unique_ptr<DaemonLink> link(new DaemonLink(options));
  if (const char* on = std::getenv("STRATA_CLIENT_SPARES"); on != nullptr)
    link->spares_on_ = std::string_view(on) != "0";
  ControlOptions control;
  control.endpoint = options.endpoint;
  control.client_name = options.client_name;
  control.security = std::move(security);
  control.rpc_timeout = options.rpc_timeout;
  control.lookup_fast_path = options.lookup_fast_path;
  control.control_by_message = options.control_by_message;
  control.log = options.log;
  link->control_ = std::make_unique<ControlChannel>(std::move(control));
  DataMoverOptions data;
  data.fetch_transfer = options.fetch_transfer;
  data.wait_spin = options.wait_spin;
  data.wait_yield = options.wait_yield;
  if (const char* us = std::getenv("STRATA_CLIENT_WAIT_SPIN_US"); us != nullptr && *us != '\0')
    data.wait_spin = std::string_view(us) == "inf" ? absl::InfiniteDuration()
                                                   : absl::Microseconds(std::atoll(us));
  if (const char* us = std::getenv("STRATA_CLIENT_WAIT_YIELD_US"); us != nullptr && *us != '\0')
    data.wait_yield = std::string_view(us) == "inf" ? absl::InfiniteDuration()
                                                    : absl::Microseconds(std::atoll(us));
  data.push_piece_bytes = options.push_piece_bytes;
  if (const char* b = std::getenv("STRATA_CLIENT_PUSH_PIECE_BYTES"); b != nullptr && *b != '\0')
    data.push_piece_bytes = static_cast<uint32_t>(std::strtoul(b, nullptr, 10));
  data.transfer_timeout = options.transfer_timeout;
  data.same_node = options.same_node;
  data.log = options.log;
  ControlChannel* channel = link->control_.get();
  STRATA_ASSIGN_OR_RETURN(link->mover_, DataMover::Connect(std::move(data), [channel] {
                            return channel->ConnectDataPlane();
                          }));
  link->control_->UseFastPath(link->mover_.get());
  return link;
}

absl::StatusOr<PublishResult> DaemonLink::PublishBlobs(const NamespaceId& ns,
                                                       std::span<const BlockId> ids,
                                                       std::span<const BlockId> parents,
                                                       std::span<const ConstBuffer> blobs) {
  const bool spares = UsesSpares(ids.size());
  if (spares) {
    if (std::optional<Spare> spare = TakeSpare(ns, blobs[0].size)) {
      if (auto done = PublishIntoSpare(*spare, ns, ids[0], parents.empty() ? BlockId{} : parents[0],
                                       blobs[0]))
        return *std::move(done);
    }
  }
  PublishResult result;
  result.ids.assign(ids.begin(), ids.end());
  if (mover_->PublishesByMessage()) {
    STRATA_ASSIGN_OR_RETURN(std::optional<std::vector<BlockStatus>> in_one,
                            control_->PublishInOne(ns, ids, parents, blobs));
    if (in_one) {
      result.status = std::move(*in_one);
      return Tally(std::move(result), blobs);
    }
  }
  std::vector<uint64_t> sizes;
  for (const ConstBuffer& b : blobs) sizes.push_back(b.size);
  STRATA_ASSIGN_OR_RETURN(Reservation reservation, control_->Reserve(ns, ids, parents, sizes));
  result.status = reservation.status;
  std::vector<BlockMove> moves;
  std::vector<size_t> reserved;  // index into ids of each move, in reservation order
  for (size_t i = 0; i < ids.size(); ++i) {
    if (result.status[i] != BlockStatus::kOk) continue;
    reserved.push_back(i);
    moves.push_back({const_cast<void*>(blobs[i].data), blobs[i].size, reservation.offsets[i]});
  }
  if (reserved.empty()) return Tally(std::move(result), blobs);
  // Where blocks go by message, the Commit follows them on the same endpoint: a small publish
  // then takes two round trips (Reserve; blocks and Commit), not three.
  const uint64_t reservation_id = reservation.id;
  auto put = mover_->Put(reservation.id, moves, reservation.expires_in, reservation.instance_id,
                         [&](std::span<const uint32_t> crcs) {
                           return control_->CommitFollowUp(reservation_id, crcs,
                                                           /*taken_while_writing=*/false);
                         });
  if (!put.ok()) {
    control_->Abort(reservation.id);
    return absl::Status(put.status().code(),
                        absl::StrCat("publish transfer failed: ", put.status().message()));
  }
  CommitSpares ask;
  ask.ns = &ns;
  if (spares) ask.want_bytes = blobs[0].size;  // for the next publish
  STRATA_ASSIGN_OR_RETURN(std::vector<BlockStatus> committed,
                          control_->Commit(reservation.id, put->crc32c,
                                           /*taken_while_writing=*/put->route == Route::kMapped,
                                           &put->follow_up_reply, &ask));
  if (spares) KeepSpare(ns, ask.want_bytes, ask.granted);
  for (size_t k = 0; k < reserved.size(); ++k) result.status[reserved[k]] = committed[k];
  return Tally(std::move(result), blobs);
}

PublishResult DaemonLink::Tally(PublishResult result, std::span<const ConstBuffer> blobs) {
  for (size_t i = 0; i < result.status.size(); ++i) {
    if (result.status[i] == BlockStatus::kExists) ++result.deduplicated;
    if (result.status[i] != BlockStatus::kOk) continue;
    ++result.stored;
    result.bytes_sent += blobs[i].size;
  }
  return result;
}

struct DaemonLink::Plan {
  std::vector<BlockMove> moves;
  std::vector<size_t> moving;                 // index into ids of each move
  std::vector<std::vector<uint8_t>> staging;  // decoding: where each move lands
};

// Blobs land in the engine's buffers, in `blobs`, or, to be decoded, in staging buffers.
DaemonLink::Plan DaemonLink::PlanLanding(const Lease& lease, const FetchLanding& into,
                                         FetchResult* r) {
  const bool decode = into.decode && !into.blobs;
  Plan plan;
  for (size_t i = 0; i < lease.status.size(); ++i) {
    if (lease.status[i] != BlockStatus::kOk) {
      r->status[i] = lease.status[i];
      continue;
    }
    void* landing = nullptr;
    if (into.blobs) {
      (*into.blobs)[i].resize(lease.sizes[i]);
      landing = (*into.blobs)[i].data();
    } else {
      if ((decode ? into.decoded_bytes : lease.sizes[i]) > into.buffers[i].size) {
        r->status[i] = BlockStatus::kInvalid;  // the engine's buffer is too small for the block
        continue;
      }
      landing = into.buffers[i].data;
      if (decode) landing = plan.staging.emplace_back(lease.sizes[i]).data();
    }
    plan.moving.push_back(i);
    plan.moves.push_back({landing, lease.sizes[i], lease.offsets[i], lease.crc32c[i]});
  }
  return plan;
}

absl::StatusOr<FetchResult> DaemonLink::Fetch(const NamespaceId& ns, std::span<const BlockId> ids,
                                              const FetchLanding& into) {
  if (!into.blobs && ids.size() != into.buffers.size())
    return absl::InvalidArgumentError(
        absl::StrCat(ids.size(), " ids but ", into.buffers.size(), " buffers"));
  FetchResult r;
  r.status.assign(ids.size(), BlockStatus::kNotFound);
  r.sizes.assign(ids.size(), 0);
  if (ids.empty()) return r;
  // A blob carries its own CRC32C, checked by the decoder; blocks kept as stored are checked
  // against the CRC recorded at commit.
  const bool verify = options_.verify_crc && !(into.decode && !into.blobs);
  if (FetchSmallInOne(ns, ids, into, verify, &r)) return r;
  if (auto fetched = FetchInOneRequest(ns, ids, into, verify, &r)) return std::move(*fetched);
  STRATA_ASSIGN_OR_RETURN(Lease lease, control_->Acquire(ns, ids));
  if (into.blobs) into.blobs->assign(ids.size(), {});
  Plan plan = PlanLanding(lease, into, &r);
  auto moved = mover_->Get(lease.id, plan.moves, verify, lease.expires_in, lease.instance_id,
                           AroundCaches(into));
  control_->ReleaseAsync(lease.id);
  if (!moved.ok()) return moved.status();
  Finish(into, plan, std::move(moved->intact), &r);
  return r;
}

bool DaemonLink::FetchSmallInOne(const NamespaceId& ns, std::span<const BlockId> ids,
                                 const FetchLanding& into, bool verify, FetchResult* r) {
  // Where this process maps the arena a local copy beats any message. The answer carries the
  // bytes, copied into it by stratad and out of it here: cheaper than a second message up to
  // some 32 KiB. Larger blocks go by acquire-and-push, sent from the arena and received in place
  // (tcp, 4 clients on 2 cores: 64 KiB blocks at 1.78-1.92 GB/s in one answer, 2.01-2.28
  // pushed; 128 KiB 2.35 against 2.56; 32 KiB alike; 4 and 16 KiB 1.2-1.3x faster in one).
  constexpr uint64_t kInOneBytes = std::min<uint64_t>(32 << 10, am_wire::kMaxFetchInOneBytes);
  if (into.blobs || mover_->route(DataMover::Direction::kGet) != Route::kPush) return false;
  uint64_t room = 0;
  for (const MutableBuffer& b : into.buffers) room += b.size;
  if (room > kInOneBytes) return false;
  std::optional<ControlChannel::FetchedInOne> got = control_->FetchInOne(ns, ids);
  if (!got) return false;
  Plan plan = PlanLanding(got->lease, into, r);
  // Where each leased block's bytes start in the answer.
  std::vector<uint64_t> at(ids.size(), 0);
  for (size_t i = 0, pos = 0; i < ids.size(); ++i) {
    at[i] = pos;
    if (got->lease.status[i] == BlockStatus::kOk) pos += got->lease.sizes[i];
  }
  std::vector<uint8_t> intact(plan.moving.size(), 1);
  for (size_t k = 0; k < plan.moving.size(); ++k) {
    const BlockMove& m = plan.moves[k];
    const uint32_t crc = DataMover::CopyFetched(m.local, got->bytes.data() + at[plan.moving[k]],
                                                m.length, verify, AroundCaches(into));
    if (verify && crc != m.crc32c) intact[k] = 0;
  }
  Finish(into, plan, std::move(intact), r);
  return true;
}

std::optional<absl::StatusOr<FetchResult>> DaemonLink::FetchInOneRequest(
    const NamespaceId& ns, std::span<const BlockId> ids, const FetchLanding& into, bool verify,
    FetchResult* r) {
  if (mover_->route(DataMover::Direction::kGet) != Route::kPush) return std::nullopt;
  std::optional<FollowUp> request =
      control_->AcquirePushRequest(ns, ids, mover_->push_piece_bytes());
  if (!request) return std::nullopt;
  std::optional<Lease> lease;
  Plan plan;
  // Runs when the answer comes, before the first block does.
  auto landing = [&](const AmReply& reply) -> std::optional<DataMover::PushLanding> {
    lease = control_->LeaseFromPushReply(reply, ids.size());
    if (!lease) return std::nullopt;
    if (into.blobs) into.blobs->assign(ids.size(), {});
    plan = PlanLanding(*lease, into, r);
    // Every leased block comes; one this fetch cannot take (its buffer is too small) is dropped.
    DataMover::PushLanding out{std::vector<BlockMove>(ids.size()), lease->expires_in};
    for (size_t i = 0; i < ids.size(); ++i)
      if (lease->status[i] == BlockStatus::kOk)
        out.moves[i] = {nullptr, lease->sizes[i], lease->offsets[i], 0};
    for (size_t k = 0; k < plan.moving.size(); ++k) out.moves[plan.moving[k]] = plan.moves[k];
    return out;
  };
  // As short as an acquire by message's wait: a daemon slow to answer is asked through gRPC.
  auto got = mover_->AcquireAndGet(std::move(*request), landing, verify,
                                   std::min(options_.rpc_timeout, absl::Milliseconds(250)),
                                   AroundCaches(into));
  if (lease && lease->id != 0 && !control_->DaemonReleasesPushes())
    control_->ReleaseAsync(lease->id);
  if (!got.ok() && !lease) {
    const absl::StatusCode code = got.status().code();
    if (code == absl::StatusCode::kFailedPrecondition ||
        code == absl::StatusCode::kDeadlineExceeded)
      return std::nullopt;
  }
  if (!got.ok())
    return absl::StatusOr<FetchResult>(absl::Status(
        got.status().code(), absl::StrCat("fetch transfer failed: ", got.status().message())));
  if (!got->pushed) return std::nullopt;
  std::vector<uint8_t> intact(plan.moving.size());
  for (size_t k = 0; k < plan.moving.size(); ++k) intact[k] = got->intact[plan.moving[k]];
  Finish(into, plan, std::move(intact), r);
  return absl::StatusOr<FetchResult>(std::move(*r));
}

void DaemonLink::Finish(const FetchLanding& into, const Plan& plan, std::vector<uint8_t> intact,
                        FetchResult* r) {
  const bool decode = into.decode && !into.blobs;
  // Per moved block: 0 ok, 1 damaged, 2 names a calibration this client lacks.
  enum : uint8_t { kDecoded = 0, kDamaged = 1, kNoCalibration = 2 };
  std::vector<uint8_t> outcome(plan.moving.size(), kDecoded);
  for (size_t k = 0; k < plan.moving.size(); ++k)
    if (!intact[k]) outcome[k] = kDamaged;
  if (decode) {
    auto decode_some = [&](const std::vector<size_t>& which) {
      mover_->helper().ParallelFor(which.size(), [&](size_t j) {
        const size_t k = which[j];
        thread_local codec::Decoder decoder;
        decoder.set_calibrations(into.calibrations);
        auto* out = static_cast<uint8_t*>(into.buffers[plan.moving[k]].data);
        absl::Status s = decoder.Decode(plan.staging[k], {out, into.decoded_bytes});
        outcome[k] = s.ok() ? kDecoded
                     : absl::IsNotFound(s) && BlobCalibrationId(plan.staging[k]) != 0
                         ? kNoCalibration
                         : kDamaged;
      });
    };
    std::vector<size_t> all;
    for (size_t k = 0; k < plan.moving.size(); ++k)
      if (outcome[k] == kDecoded) all.push_back(k);
    decode_some(all);
    // Blobs of a calibration this client has not seen yet (another node's clients made it, or
    // a recalibration): fetched once, then those blobs decode again.
    std::vector<size_t> retry;
    std::vector<uint64_t> missing;
    for (size_t k = 0; k < plan.moving.size(); ++k)
      if (outcome[k] == kNoCalibration) {
        retry.push_back(k);
        const uint64_t id = BlobCalibrationId(plan.staging[k]);
        if (std::find(missing.begin(), missing.end(), id) == missing.end()) missing.push_back(id);
      }
    if (!retry.empty() && into.ensure_calibrations) {
      const auto held = into.ensure_calibrations(missing);
      decode_some(retry);
    }
  }
  for (size_t k = 0; k < plan.moving.size(); ++k) {
    const size_t i = plan.moving[k];
    if (outcome[k] != kDecoded) {
      r->status[i] =
          outcome[k] == kNoCalibration ? BlockStatus::kUnknownCalibration : BlockStatus::kCrcMismatch;
      continue;
    }
    r->status[i] = BlockStatus::kOk;
    r->sizes[i] = decode ? into.decoded_bytes : plan.moves[k].length;
    ++r->fetched;
    r->bytes_received += plan.moves[k].length;
  }
}

}  // namespace strata::client
