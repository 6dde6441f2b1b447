#include "daemon/transcode/transcoder.h"

#include <memory>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "daemon/calibrations/calibration_store.h"
#include "daemon/logging.h"
#include "daemon/namespace_registry.h"
#include "spdlog/spdlog.h"

namespace strata::daemon {
namespace {

constexpr size_t kBatch = 8;
constexpr size_t kMaxParsedSpecs = 64;

}  // namespace

absl::Status Transcoder::CheckColdCodec(const std::string& spec, const NamespaceSpec& ns) {
  if (ns.codec_policy == kOpaqueCodecPolicy) {
    return absl::FailedPreconditionError(
        "cold_codec needs a codec namespace: an opaque namespace's blocks are not blobs that can "
        "be decoded");
  }
  auto params = codec::ParseCodecSpec(spec);
  if (!params.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("cold_codec: ", params.status().message()));
  }
  if (codec::UsesCalibration(params->mode)) {
    // Only with the blob's own calibration, the steps scaled to a bit budget: a calibration made
    // for the cold rate would have to be made and replicated first.
    const std::string mode(codec::ModeName(params->mode));
    if (params->calibration_id != 0 || params->pca_target_bits > 0 || params->xl_step > 0 ||
        params->rate_bits == 0)
      return absl::InvalidArgumentError(absl::StrCat(
          "cold_codec: a ", mode, " cold codec is ", mode,
          ":rC (each blob re-coded with its own calibration at most C bits per value)"));
    auto policy = codec::ParseCodecSpec(ns.codec_policy);
    if (!policy.ok() || policy->mode != params->mode)
      return absl::FailedPreconditionError(
          absl::StrCat("cold_codec: ", mode, ":rC needs a ", mode,
                       " namespace (its blobs' calibrations); use a quant or groupwise spec"));
    return absl::OkStatus();
  }
  if (params->mode == codec::Mode::kRaw || params->mode == codec::Mode::kLossless) {
    return absl::InvalidArgumentError(
        absl::StrCat("cold_codec '", spec, "' is not lossy: it would not make blocks smaller"));
  }
  if (auto s = params->Validate(ns.layout); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("cold_codec: ", s.message()));
  }
  return absl::OkStatus();
}

Transcoder::Transcoder(HostTier* host, const NamespaceRegistry* namespaces,
                       const CalibrationStore* calibrations)
    : host_(host), namespaces_(namespaces), calibrations_(calibrations) {
  const codec::CalibrationSet* set = calibrations ? &calibrations->parsed() : &no_calibrations_;
  decoder_.set_calibrations(set);
  encoder_.set_calibrations(set);
}

Transcoder::~Transcoder() { Stop(); }

void Transcoder::Start() {
  if (thread_.joinable()) return;
  stop_ = false;
  thread_ = std::thread([this] { Loop(); });
}

void Transcoder::Stop() {
  stop_ = true;
  host_->StopTranscoding();  // also wakes the loop
  if (thread_.joinable()) thread_.join();
}

void Transcoder::Loop() {
  std::vector<uint8_t> blob;
  while (!stop_.load()) {
    for (const TranscodeItem& item : host_->TakeTranscodes(kBatch, absl::Milliseconds(500))) {
      uint32_t crc = 0;
      absl::Status s = Transcode(item, &blob, &crc);
      if (!s.ok()) {
        blob.clear();
        static LogRateLimiter limit;
        if (uint64_t suppressed = 0; limit.Allow(&suppressed)) {
          spdlog::info("transcode: block {} evicted instead: {}{}", item.id.ShortHex(),
                       LogSafe(s.ToString(), 256), SuppressedNote(suppressed));
        }
      }
      host_->FinishTranscode(item.handle, blob, crc);
    }
  }
}

absl::StatusOr<codec::CodecParams> Transcoder::ColdParams(const std::string& spec) {
  if (auto it = parsed_.find(spec); it != parsed_.end()) return it->second;
  auto params = codec::ParseCodecSpec(spec);
  if (!params.ok()) return params.status();
  if (parsed_.size() >= kMaxParsedSpecs) parsed_.clear();
  parsed_.emplace(spec, *params);
  return params;
}

absl::Status Transcoder::Transcode(const TranscodeItem& item, std::vector<uint8_t>* blob,
                                   uint32_t* crc) {
  absl::MutexLock lock(&mu_);
  auto ns = namespaces_->Find(item.ns);
  if (!ns.has_value() || ns->cold_codec.empty())
    return absl::FailedPreconditionError("the namespace has no cold codec (now)");
  // The transcoder's hold keeps the extent; its bytes are checked before they are trusted.
  const std::span<const uint8_t> stored(host_->base() + item.offset, item.size);
  if (Crc32c(stored.data(), stored.size()) != item.crc)
    return absl::DataLossError("the stored block fails its CRC32C");
  auto info = codec::InspectBlob(stored);
  if (!info.ok()) return info.status();
  if (!(info->layout == ns->spec.layout))
    return absl::InvalidArgumentError("the blob's layout is not its namespace's");
  // Held until the block is re-coded: the store's cache keeps what somebody holds.
  std::shared_ptr<const codec::Calibration> calibration;
  if (codec::UsesCalibration(info->params.mode)) {
    if (calibrations_ == nullptr) return absl::NotFoundError("no calibration store");
    auto parsed = calibrations_->Parsed(item.ns, info->params.calibration_id);
    if (!parsed.ok()) return parsed.status();
    calibration = *std::move(parsed);
  }
  auto cold = ColdParams(ns->cold_codec);
  if (!cold.ok()) return cold.status();
  if (codec::UsesCalibration(cold->mode)) {  // pca:rC, xl:rC: the blob's own calibration
    if (info->params.mode != cold->mode)  // e.g. a block its encoder stored raw (larger coded)
      return absl::FailedPreconditionError(absl::StrCat(
          std::string(codec::ModeName(cold->mode)), ":rC re-codes ",
          std::string(codec::ModeName(cold->mode)), " blobs only; this one is ",
          std::string(codec::ModeName(info->params.mode))));
    cold->calibration_id = info->params.calibration_id;
    cold->first_position = info->params.first_position;
  }
  decoded_.resize(info->layout.BlockBytes());
  if (auto s = decoder_.Decode(stored, decoded_); !s.ok()) return s;
  if (auto s = encoder_.Encode(info->layout, *cold, decoded_, blob); !s.ok()) return s;
  if (blob->size() >= stored.size())
    return absl::FailedPreconditionError(absl::StrCat(
        "the cold codec gives ", blob->size(), " bytes for a blob of ", stored.size()));
  *crc = Crc32c(blob->data(), blob->size());
  return absl::OkStatus();
}

}  // namespace strata::daemon
