// Publish buffers (Client::AllocatePublishBuffer): memory the engine writes its blocks into
// before publishing them, lent to the daemon as staging windows of a read-only tenant zone, so
// that a publish from it needs no copy in the client (the daemon copies each block once, from
// the buffer into the zone). Each buffer is a sealed memfd mapped here for as long as the client
// lives; it is lent to the daemon behind the current zone window, and lent again (LendStale,
// before a publish takes the data mover's locks) when a restarted daemon brings a new window.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "client/internal/zone_window.h"

namespace strata::client {

class PublishBuffers {
 public:
  PublishBuffers() = default;
  ~PublishBuffers();
  PublishBuffers(const PublishBuffers&) = delete;
  PublishBuffers& operator=(const PublishBuffers&) = delete;

  // A new buffer of `bytes`, lent to `window`'s daemon.
  absl::StatusOr<uint8_t*> Allocate(const ZoneWindow& window, uint64_t bytes);
  // Lends `window`'s daemon the buffers lent to an earlier one (or to none). The exchanges run
  // with no lock held; a buffer that fails stays unlent until the next call.
  void LendStale(const ZoneWindow& window);
  // Where [data, data + length) lies in a buffer lent to `window`'s daemon: the window id and
  // the offset in it. nullopt when it lies in no such buffer (the publish then copies it
  // through the staging window as any other block). Never talks to the daemon.
  struct At {
    uint64_t id = 0, offset = 0;
  };
  std::optional<At> Find(const ZoneWindow& window, const void* data, uint64_t length);

 private:
  struct Buffer {
    uint8_t* data = nullptr;
    uint64_t bytes = 0;
    int fd = -1;
    uint64_t lent_to = 0;  // ZoneWindow::serial() of the loan; 0: none
    uint64_t id = 0;
    int socket = -1;  // the loan lasts while it stays open
    bool lending = false;  // a LendStale is lending it now
  };

  absl::Mutex mu_;
  std::vector<Buffer> buffers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace strata::client
