// The encoded-blob container: a fixed header (magic, version, codec id and parameters, KvLayout),
// a section table, section payloads and a CRC32C trailer over everything before it.
//
//   offset  size  field
//   0       4     magic "SKVC"
//   4       2     format version (kBlobVersion)
//   6       2     header bytes (kHeaderBytes)
//   8       1     mode (codec::Mode)
//   9       1     flags (kFlag*)
//   10      2     group size
//   12      4     num_layers
//   16      4     num_kv_heads
//   20      4     head_dim
//   24      4     tokens_per_block
//   28      1     dtype (common DType)
//   29      1     kind (common KvKind)
//   30      1     key bits (default for the blob; sections carry their own)
//   31      1     value bits
//   32      4     number of sections
//   36      4     pca, xl: position of the block's first token (without RoPE, nonzero at
//                 least where the block does not begin its sequence); zero for other modes
//   40      8     total blob bytes, trailer included
//   48      8     decoded bytes (KvLayout::BlockBytes)
//   56      8     calibration id (pca and xl blobs, never zero); zero for every other mode
//   64      24*n  section table: u8 type, u8 tensor, u16 layer, u8 bits, u8 coder, u16 reserved,
//                 u64 offset, u64 size (offsets from the start of the blob)
//   ...           section payloads, in table order, non-overlapping
//   end-4   4     CRC32C of every preceding byte
//
// All integers are little-endian. ParseBlob validates every field and every offset before
// anything reads a payload, so a hostile blob yields a Status and never an out-of-bounds read.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "strata/kv_layout.h"

namespace strata::codec {

inline constexpr uint32_t kBlobMagic = 0x43564B53;  // "SKVC" little-endian
inline constexpr uint16_t kBlobVersion = 1;
inline constexpr size_t kHeaderBytes = 64;
inline constexpr size_t kSectionEntryBytes = 24;
inline constexpr size_t kTrailerBytes = 4;
// A raw blob's bytes for a block of `block_bytes`: header, one section entry, the block, trailer.
inline constexpr size_t RawBlobBytes(size_t block_bytes) {
  return kHeaderBytes + kSectionEntryBytes + block_bytes + kTrailerBytes;
}
inline constexpr uint32_t kMaxSections = 1u << 20;

// The modes whose blobs name a calibration (codec::Mode::kPca, kCrossLayer); the blob layer
// checks the field.
inline constexpr uint8_t kModeCalibrated = 6;
inline constexpr uint8_t kModeCrossLayer = 7;
inline constexpr bool ModeNamesCalibration(uint8_t mode) {
  return mode == kModeCalibrated || mode == kModeCrossLayer;
}

inline constexpr uint8_t kFlagHadamard = 1;
inline constexpr uint8_t kFlagTokenDelta = 2;
inline constexpr uint8_t kFlagEntropy = 4;
inline constexpr uint8_t kFlagKeyOutliers = 8;

// kStream: the rANS stream that the blob's kCoderShared quant sections share; the last section
// (layer 0, tensor 0, bits 0, coder 4: 128 states) when there is one. kCrossLayer: an xl
// blob's only section (layer 0, tensor 0), every layer's payload (codec/cross_layer.h).
enum class SectionType : uint8_t {
  kRaw = 1,
  kLossless = 2,
  kQuant = 3,
  kGroupwise = 4,
  kStream = 5,
  kPca = 6,
  kCrossLayer = 7
};

struct SectionEntry {
  SectionType type = SectionType::kRaw;
  uint8_t tensor = 0;  // 0 = K (or the MLA latent), 1 = V
  uint16_t layer = 0;
  uint8_t bits = 0;
  uint8_t coder = 0;
  uint64_t offset = 0;
  uint64_t size = 0;
};

struct BlobHeader {
  uint8_t mode = 0;
  uint8_t flags = 0;
  uint16_t group_size = 0;
  KvLayout layout;
  uint8_t key_bits = 0;
  uint8_t value_bits = 0;
  uint64_t total_bytes = 0;
  uint64_t decoded_bytes = 0;
  uint64_t calibration_id = 0;  // pca and xl modes only (ModeNamesCalibration)
  uint32_t first_position = 0;  // pca and xl modes only
};

// A validated view of a blob; spans point into the caller's buffer.
struct BlobView {
  BlobHeader header;
  std::vector<SectionEntry> sections;
  std::span<const uint8_t> blob;
  std::span<const uint8_t> Payload(const SectionEntry& s) const {
    return blob.subspan(s.offset, s.size);
  }
};

// Builds a blob: header, table and payloads are appended in order; Finish() patches offsets
// and writes the trailer. Payload bytes are written straight into the output buffer.
class BlobWriter {
 public:
  BlobWriter(std::vector<uint8_t>* out, const BlobHeader& header, uint32_t num_sections);
  // Starts the next section's payload; returns the output buffer to append to.
  std::vector<uint8_t>* BeginSection(const SectionEntry& entry);
  // Rewrites the open section's coder (a section encoder may settle on another coder).
  void SetSectionCoder(uint8_t coder);
  void EndSection();
  // Where the next section begins; RewindTo(mark) forgets every section begun since (a bit
  // budget's encoder codes its last section again).
  struct Mark {
    size_t bytes = 0;
    uint32_t next = 0;
  };
  Mark Position() const { return {out_->size(), next_}; }
  void RewindTo(const Mark& mark);
  // Fails if fewer sections than announced were written.
  absl::Status Finish();

 private:
  std::vector<uint8_t>* out_;
  uint32_t num_sections_;
  uint32_t next_ = 0;
  size_t section_start_ = 0;
  bool open_ = false;
};

struct ParseOptions {
  bool verify_crc = true;
};

absl::StatusOr<BlobView> ParseBlob(std::span<const uint8_t> blob, ParseOptions opts = {});

}  // namespace strata::codec
