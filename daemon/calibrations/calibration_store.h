// The calibrations this daemon holds (codec modes pca and xl, codec/calibration.h): per
// namespace, the serialized artefacts by id, each with the facts operators and clients ask
// about. Artefacts are kept in memory (a client that encodes or decodes asks for them often)
// and, when the store has a directory, in one file each, so a restarted daemon still decodes
// what it stored before.
//
// Versions: each artefact carries the namespace's counter (v1, v2, ...); the highest is the
// namespace's current calibration, the one new blobs are coded with. Old versions stay: blobs
// coded with them still decode. Nothing here drops an artefact a blob may name; the limits
// refuse new ones instead.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "codec/calibration.h"
#include "strata/block_id.h"

namespace strata::daemon {

// Larger artefacts are refused: gRPC messages are capped at 64 MiB. (A 70B-class model with 80
// layers, 8 KV heads and head_dim 128 needs ~86 MB and is out of reach of format 1.)
inline constexpr uint64_t kMaxCalibrationBytes = codec::kMaxCalibrationArtefactBytes;

struct CalibrationRecord {
  NamespaceId ns;
  uint64_t id = 0;
  uint32_t version = 0;
  uint32_t num_layers = 0, num_kv_heads = 0, head_dim = 0;
  float target_bits = 0, sample_bits = 0, rope_theta = 0;
  std::string mode;  // the codec mode it serves: "pca" or "xl"
  float step = 0;    // xl: the step it was made with
  absl::Time added;
  std::shared_ptr<const std::string> artefact;  // the serialized bytes, as stored
};

class CalibrationStore {
 public:
  struct Limits {
    uint32_t max_per_namespace = 16;
    uint64_t max_bytes = 1ull << 30;  // every artefact of every namespace
    // Parsed calibrations kept for the daemon's own coders (cold transcoding, decodes for GPU
    // peers): the least recently used beyond this are parsed again when needed. 0: no bound.
    uint64_t parsed_bytes = 256ull << 20;
  };

  // `dir` empty: memory only. Otherwise the directory is created if missing and every artefact
  // in it is loaded; a file that does not parse or does not match its name is renamed to
  // *.bad, counted in rejected_files() and left for the operator.
  static absl::StatusOr<std::unique_ptr<CalibrationStore>> Open(std::string dir, Limits limits);

  // Parses and checks `artefact`, then stores it for `ns` (on disk first, when the store has a
  // directory). Storing what is already there returns the existing record. INVALID_ARGUMENT for
  // a malformed artefact; FAILED_PRECONDITION when another artefact of `ns` has its version;
  // RESOURCE_EXHAUSTED past the limits; INTERNAL when the file cannot be written.
  // `check`, when set, sees the parsed calibration first; its error refuses the put.
  absl::StatusOr<CalibrationRecord> Put(
      const NamespaceId& ns, std::string artefact,
      const std::function<absl::Status(const codec::Calibration&)>& check = nullptr);
  // `id` 0: the namespace's current calibration (highest version). NOT_FOUND when absent.
  absl::StatusOr<CalibrationRecord> Get(const NamespaceId& ns, uint64_t id) const;
  // Every record of `ns` (nullopt: of every namespace), by namespace, then version.
  std::vector<CalibrationRecord> List(std::optional<NamespaceId> ns) const;
  // The calibration `id` of `ns`, parsed (kept in parsed() within Limits::parsed_bytes; parsed
  // again after it was dropped). Holding the result keeps it in parsed() for the daemon's
  // Encoder and Decoder. NOT_FOUND when `ns` has no such calibration.
  absl::StatusOr<std::shared_ptr<const codec::Calibration>> Parsed(const NamespaceId& ns,
                                                                   uint64_t id) const;
  // What the daemon's Encoders and Decoders look calibrations up in. Thread-safe.
  const codec::CalibrationSet& parsed() const { return parsed_; }

  // Whether `id` is the namespace's current (highest-version) calibration.
  bool IsCurrent(const NamespaceId& ns, uint64_t id) const;

  size_t size() const;
  uint64_t bytes() const;
  size_t rejected_files() const { return rejected_files_; }

 private:
  CalibrationStore(std::string dir, Limits limits) : dir_(std::move(dir)), limits_(limits) {}
  absl::Status Load();
  absl::Status WriteFile(const CalibrationRecord& r) const;
  bool HasVersion(const NamespaceId& ns, uint32_t version) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Adds a parsed record; the caller has checked the limits.
  void Insert(CalibrationRecord r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string dir_;
  const Limits limits_;
  mutable codec::CalibrationSet parsed_{limits_.parsed_bytes};  // thread-safe
  size_t rejected_files_ = 0;  // set by Load, before the store is shared
  mutable absl::Mutex mu_;
  // Per namespace, by version (a few each: a vector scanned linearly).
  absl::flat_hash_map<NamespaceId, std::vector<CalibrationRecord>> by_ns_ ABSL_GUARDED_BY(mu_);
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // Files being written, by namespace and version: the id and how many Puts write it. Another
  // artefact of that version is refused before its file is written, so two files of one version
  // are only ever left by a crash (Load then keeps the first).
  struct Writing {
    uint64_t id = 0;
    int writers = 0;
  };
  absl::flat_hash_map<std::pair<NamespaceId, uint32_t>, Writing> writing_ ABSL_GUARDED_BY(mu_);
  size_t count_ ABSL_GUARDED_BY(mu_) = 0;
};

// The record of a serialized artefact (parsed and checked) for `ns`; INVALID_ARGUMENT naming
// what is wrong otherwise.
// With `parsed`, the parsed calibration too.
absl::StatusOr<CalibrationRecord> DescribeCalibration(const NamespaceId& ns, std::string artefact,
                                                      codec::Calibration* parsed = nullptr);

}  // namespace strata::daemon
