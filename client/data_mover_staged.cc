// Publish through the staging window of a read-only tenant zone (client/internal/zone_window.h,
// am_wire::kPublishStagedAm): each block is copied into the window with its CRC taken in the
// same pass and named to the daemon; the daemon copies it on into the reserved extent and
// acknowledges it. Blocks in publish buffers are named where they are. Where the daemon takes
// them (kPublishStagedManyAm), the blocks of about 1 MiB go in one message, which the daemon
// copies on two threads and acknowledges once. The window is a ring: a block reuses space once
// the blocks before it there are acknowledged, so the client's copy of one block overlaps the
// daemon's copy of the ones before.
#include <algorithm>
#include <chrono>
#include <deque>
#include <thread>

#include "client/data_mover.h"
#include "client/internal/data_mover_waits.h"
#include "common/am_wire.h"
#include "common/crc32c.h"
#include "common/status_macros.h"

namespace strata::client {
namespace {

// Waiting for stratad's copies (PutByStaging): napped through when this many bytes are behind,
// for their length at the fastest copy rate (a nap never outlasts the copy), at most kMaxNap:
// the last nap outlasts the last acknowledgement by half of it on average (250 us naps: 1 MiB
// blocks from publish buffers at 12.6-14.3 GB/s, 50 us: 16.7-18.2).
constexpr uint64_t kNapBehindBytes = 512 << 10;
constexpr uint64_t kFastestCopyBytesPerNs = 32;  // 32 GB/s
constexpr std::chrono::microseconds kMaxNap{50};
// Staged blocks named in one message (am_wire::kPublishStagedManyAm) add up to about this much:
// the daemon's copy of them runs on two threads, and the next message is on its way meanwhile.
constexpr uint64_t kStagedBatchBytes = 1 << 20;
// Blocks named in publish buffers, which this thread does not copy, go in larger messages: each
// message costs stratad a handler and a two-thread copy's start (1 MiB blocks from publish
// buffers: 8.2 GB/s in 1 MiB messages, 10.5-10.9 in 8 MiB; 32 MiB no faster). Not more: the
// progress thread serves no one else while it copies.
constexpr uint64_t kPublishBufferBatchBytes = 8 << 20;

}  // namespace

bool DataMover::PublishesByMessage() const {
  std::shared_lock<std::shared_mutex> map_lock(map_mu_);
  // A zone window here: staged or mapped, either way not by message.
  return zone_window_ == nullptr &&
         ChooseRoute(Direction::kPut, mapped_arena_ != nullptr) == Route::kPush;
}

bool DataMover::FitsStaging(const ZoneWindow& window, std::span<const BlockMove> blocks) {
  const ZoneWindow::Staging& s = window.staging();
  return std::all_of(blocks.begin(), blocks.end(), [&](const BlockMove& b) {
    if (!window.Covers(b.arena_offset, b.length)) return false;
    if (publish_buffers_.Find(window, b.local, b.length)) return true;
    return s.data != nullptr && b.length <= s.bytes;
  });
}

void DataMover::LendPublishBuffersToCurrentWindow() {
  std::shared_ptr<const ZoneWindow> window;
  {
    std::shared_lock<std::shared_mutex> map_lock(map_mu_);
    window = zone_window_;
  }
  if (window && !window->writable()) publish_buffers_.LendStale(*window);
}

absl::StatusOr<uint8_t*> DataMover::AllocatePublishBuffer(uint64_t bytes) {
  std::shared_ptr<const ZoneWindow> window;
  {
    std::shared_lock<std::shared_mutex> map_lock(map_mu_);
    window = zone_window_;
  }
  if (window == nullptr || window->writable())
    return absl::FailedPreconditionError(
        "publish buffers are for same-node clients of a read-only tenant zone");
  return publish_buffers_.Allocate(*window, bytes);  // a loan: no lock of ours held
}

absl::Status DataMover::PutByStaging(uint64_t reservation_id, std::span<const BlockMove> blocks,
                                     const ZoneWindow& window, absl::Time deadline,
                                     std::vector<uint32_t>* crcs,
                                     const FollowUpFor* follow_up_for,
                                     std::optional<absl::StatusOr<Reply>>* follow_up_reply) {
  const ZoneWindow::Staging& staging = window.staging();
  std::lock_guard<std::mutex> lock(ucx_mu_);
  PublishWait w;
  STRATA_RETURN_IF_ERROR(StartPublishWait(blocks, &w));
  std::vector<void*> sending;
  struct Placed {
    uint64_t offset, length;
    size_t index;
  };
  std::deque<Placed> in_window;  // sent, not yet acknowledged, in the window's order
  uint64_t head = 0;             // where the next block goes when it fits there
  auto idle_since = transport::Worker::Clock::now();
  unsigned spins = 0;
  w.blocks = blocks;
  uint64_t sent_bytes = 0;
  // Progresses once: acknowledgements free the window's space, finished sends are reaped.
  auto progress = [&] {
    // While stratad copies much of the publish it runs on both cores; polling for its
    // acknowledgements would take one of them (1 MiB blocks from publish buffers, one message
    // each: 4.7 GB/s polling, 6.1-6.6 with the client sleeping in epoll,
    // STRATA_CLIENT_WAIT_YIELD_US=0, same runs). So this thread sleeps for the time that copy
    // takes at least, and polls again only for the last of it.
    const uint64_t behind = sent_bytes - w.acked_bytes;
    if (behind >= kNapBehindBytes && worker_->Progress() == 0) {
      std::this_thread::sleep_for(std::min<std::chrono::nanoseconds>(
          kMaxNap, std::chrono::nanoseconds(behind / kFastestCopyBytesPerNs)));
      idle_since = transport::Worker::Clock::now();
    } else {
      worker_->ProgressWaiting(&idle_since, deadline, /*may_sleep=*/sending.empty());
    }
    ReapSends(&sending, &w.error, "sending a staged block failed");
    if (w.error.ok() && ep_->failed()) w.error = DaemonWentAway("a staged publish");
    if ((++spins & 63) == 0 && absl::Now() >= deadline)
      w.error = absl::DeadlineExceededError(
          "stratad did not acknowledge every staged block in time");
  };
  // Where a block of `length` fits in the window now, if anywhere.
  auto place = [&](uint64_t length) -> std::optional<uint64_t> {
    while (!in_window.empty() && w.acked[in_window.front().index]) in_window.pop_front();
    if (in_window.empty()) return head = 0;
    // Blocks in flight occupy [tail, head) when head > tail, else (wrapped) [tail, end) and
    // [0, head); head == tail with blocks in flight is a full window.
    const uint64_t tail = in_window.front().offset;
    if (head > tail) {
      if (length <= staging.bytes - head) return head;
      if (length <= tail) return 0;  // wraps
      return std::nullopt;
    }
    if (length <= tail - head) return head;
    return std::nullopt;
  };
  crcs->assign(blocks.size(), 0);
  w.crcs_from_acks = crcs;
  absl::Status s;
  // Blocks named but not sent yet (a daemon that takes kPublishStagedManyAm): they go together
  // once they add up to kStagedBatchBytes or fill a message, and before this thread waits.
  std::string batch;
  uint32_t batched = 0;
  uint64_t batched_bytes = 0;
  uint64_t batched_window_bytes = 0;  // of batched_bytes, those copied into the staging window
  auto send_batch = [&]() -> absl::Status {
    if (batched == 0) return absl::OkStatus();
    absl::Status sent =
        ep_->AmPost(am_wire::kPublishStagedManyAm,
                    am_wire::EncodePublishStagedManyHeader(w.request_id, reservation_id, batched),
                    std::move(batch));
    batch.clear();
    batched = 0;
    sent_bytes += batched_bytes;
    batched_bytes = 0;
    batched_window_bytes = 0;
    return sent;
  };
  for (size_t i = 0; i < blocks.size() && s.ok() && w.error.ok(); ++i) {
    const BlockMove& b = blocks[i];
    const uint8_t* const local = static_cast<const uint8_t*>(b.local);
    uint64_t window_id, at;
    uint32_t flags = 0;
    if (auto in = publish_buffers_.Find(window, local, b.length)) {
      // The engine wrote the block into a publish buffer: this process never reads it; stratad
      // takes its CRC as it copies it and sends it back.
      window_id = in->id;
      at = in->offset;
      flags = am_wire::kStagedCrcByDaemon;
      if (w.crc_by_daemon.empty()) w.crc_by_daemon.assign(blocks.size(), 0);
      w.crc_by_daemon[i] = 1;
    } else {
      std::optional<uint64_t> free_at = place(b.length);
      // The window's space comes back only as the blocks in it are stored: they must be sent.
      if (!free_at) s = send_batch();
      while (s.ok() && !free_at && w.error.ok()) {
        progress();
        free_at = place(b.length);
      }
      if (!s.ok() || !w.error.ok()) break;
      window_id = staging.id;
      at = *free_at;
      (*crcs)[i] = CopyWithCrc32c(staging.data + at, local, b.length);
      in_window.push_back({at, b.length, i});
      head = at + b.length;
    }
    const am_wire::PublishStagedHeader staged{
        {w.request_id, reservation_id, b.arena_offset, b.length, static_cast<uint32_t>(i)},
        window_id,
        at,
        (*crcs)[i],
        flags};
    if (window.staged_many()) {
      batch += am_wire::EncodePublishStagedHeader(staged);
      batched_bytes += b.length;
      if (flags == 0) batched_window_bytes += b.length;
      if (++batched == am_wire::kMaxStagedPerMessage ||
          batched_window_bytes >= kStagedBatchBytes || batched_bytes >= kPublishBufferBatchBytes)
        s = send_batch();
      continue;
    }
    auto r = ep_->AmSendAsync(am_wire::kPublishStagedAm, am_wire::EncodePublishStagedHeader(staged),
                              nullptr, 0, nullptr, /*eager=*/true);
    sent_bytes += b.length;
    if (!r.ok())
      s = r.status();
    else if (*r != nullptr)
      sending.push_back(*r);
  }
  if (s.ok() && w.error.ok()) s = send_batch();
  // The Commit follows the blocks on the same endpoint: the daemon has copied each one in its
  // handler before it reads the Commit.
  ExchangeWait reply;
  std::optional<FollowUp> follow_up;
  // The Commit names every CRC: not before stratad has sent back those it takes.
  if (s.ok() && w.error.ok() && follow_up_for != nullptr && *follow_up_for &&
      w.crc_by_daemon.empty())
    follow_up = (*follow_up_for)(*crcs);
  if (follow_up && s.ok()) s = PostFollowUp(&*follow_up, &reply);
  while (s.ok() && w.error.ok() &&
         (w.done < blocks.size() || !sending.empty() || (follow_up && !reply.done)))
    progress();
  if (!s.ok()) w.error = s;
  FinishSends(&sending, /*abort=*/!w.error.ok());
  publish_wait_ = nullptr;
  exchange_wait_ = nullptr;
  if (follow_up && w.error.ok()) *follow_up_reply = std::move(reply.reply);
  return w.error;
}

}  // namespace strata::client
