// Cold blocks kept at a lower rate instead of evicted (issue 16, item 3).
//
// A namespace opened with a cold codec (OpenNamespaceRequest.cold_codec, e.g. "quant:k2v2:ol")
// has its host-tier victims handed here at the high watermark (storage/host_tier.h,
// options.transcode). Each blob is checked against its CRC, decoded (pca blobs with the
// namespace's calibration from the store) and encoded with the cold codec; when that is
// smaller the host tier rewrites the block in place and keeps it, else it is evicted as it
// would have been. Engines need nothing new: every blob describes its own codec, so a fetch
// decodes whichever representation the node holds. Opaque namespaces are never transcoded
// (their bytes are not blobs). A pca namespace's cold codec is "pca:rC": each blob re-encoded
// with its own calibration, every step scaled so that it holds at most C bits per value.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "codec/calibration.h"
#include "codec/codec.h"
#include "storage/host_tier.h"

namespace strata::daemon {

class CalibrationStore;
class NamespaceRegistry;

class Transcoder {
 public:
  // OK when `cold_codec` can be the cold codec of namespace `ns`, else InvalidArgument or
  // FailedPrecondition saying why not.
  static absl::Status CheckColdCodec(const std::string& cold_codec, const NamespaceSpec& ns);

  // Everything must outlive the Transcoder; `calibrations` may be null (pca blobs are then
  // evicted instead).
  Transcoder(HostTier* host, const NamespaceRegistry* namespaces,
             const CalibrationStore* calibrations);
  ~Transcoder();  // Stop()
  Transcoder(const Transcoder&) = delete;
  Transcoder& operator=(const Transcoder&) = delete;

  // Victims of `ns` (opened with a cold codec) come here from now on.
  void Enable(const NamespaceId& ns) { host_->SetNamespaceTranscodable(ns, true); }

  void Start();
  // Finishes the blocks in hand, hands the waiting ones back to the eviction order. Idempotent.
  void Stop();

 private:
  void Loop();
  // The transcoded block of `item` (its blob and CRC32C), or why not (the host tier counts
  // those as transcode failures).
  absl::Status Transcode(const TranscodeItem& item, std::vector<uint8_t>* blob, uint32_t* crc);
  absl::StatusOr<codec::CodecParams> ColdParams(const std::string& spec)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  HostTier* const host_;
  const NamespaceRegistry* const namespaces_;
  const CalibrationStore* const calibrations_;
  std::thread thread_;
  std::atomic<bool> stop_{false};

  absl::Mutex mu_;  // the codec's scratch and the parsed specs
  codec::Decoder decoder_ ABSL_GUARDED_BY(mu_);
  codec::Encoder encoder_ ABSL_GUARDED_BY(mu_);
  const codec::CalibrationSet no_calibrations_;  // the coders' set without a store
  std::vector<uint8_t> decoded_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, codec::CodecParams> parsed_ ABSL_GUARDED_BY(mu_);
};

}  // namespace strata::daemon
