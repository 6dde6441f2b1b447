#include "codec/blob.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "codec/internal/byte_io.h"
#include "common/crc32c.h"

namespace strata::codec {
namespace {

template <typename T>
void Put(std::vector<uint8_t>* out, size_t at, T v) {
  std::memcpy(out->data() + at, &v, sizeof(T));
}
template <typename T>
T Get(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

}  // namespace

BlobWriter::BlobWriter(std::vector<uint8_t>* out, const BlobHeader& h, uint32_t num_sections)
    : out_(out), num_sections_(num_sections) {
  out_->clear();
  out_->resize(kHeaderBytes + size_t{num_sections} * kSectionEntryBytes, 0);
  Put<uint32_t>(out_, 0, kBlobMagic);
  Put<uint16_t>(out_, 4, kBlobVersion);
  Put<uint16_t>(out_, 6, static_cast<uint16_t>(kHeaderBytes));
  Put<uint8_t>(out_, 8, h.mode);
  Put<uint8_t>(out_, 9, h.flags);
  Put<uint16_t>(out_, 10, h.group_size);
  Put<uint32_t>(out_, 12, h.layout.num_layers);
  Put<uint32_t>(out_, 16, h.layout.num_kv_heads);
  Put<uint32_t>(out_, 20, h.layout.head_dim);
  Put<uint32_t>(out_, 24, h.layout.tokens_per_block);
  Put<uint8_t>(out_, 28, static_cast<uint8_t>(h.layout.dtype));
  Put<uint8_t>(out_, 29, static_cast<uint8_t>(h.layout.kind));
  Put<uint8_t>(out_, 30, h.key_bits);
  Put<uint8_t>(out_, 31, h.value_bits);
  Put<uint32_t>(out_, 32, num_sections);
  Put<uint64_t>(out_, 48, h.layout.BlockBytes());
  Put<uint64_t>(out_, 56, h.calibration_id);
  Put<uint32_t>(out_, 36, h.first_position);
}

std::vector<uint8_t>* BlobWriter::BeginSection(const SectionEntry& e) {
  size_t at = kHeaderBytes + size_t{next_} * kSectionEntryBytes;
  Put<uint8_t>(out_, at + 0, static_cast<uint8_t>(e.type));
  Put<uint8_t>(out_, at + 1, e.tensor);
  Put<uint16_t>(out_, at + 2, e.layer);
  Put<uint8_t>(out_, at + 4, e.bits);
  Put<uint8_t>(out_, at + 5, e.coder);
  section_start_ = out_->size();
  open_ = true;
  return out_;
}

void BlobWriter::SetSectionCoder(uint8_t coder) {
  Put<uint8_t>(out_, kHeaderBytes + size_t{next_} * kSectionEntryBytes + 5, coder);
}

void BlobWriter::EndSection() {
  size_t at = kHeaderBytes + size_t{next_} * kSectionEntryBytes;
  Put<uint64_t>(out_, at + 8, section_start_);
  Put<uint64_t>(out_, at + 16, out_->size() - section_start_);
  ++next_;
  open_ = false;
}

void BlobWriter::RewindTo(const Mark& mark) {
  out_->resize(mark.bytes);
  next_ = mark.next;
  open_ = false;
}

absl::Status BlobWriter::Finish() {
  if (open_ || next_ != num_sections_)
    return absl::InternalError(
        absl::StrCat("blob writer: ", next_, " of ", num_sections_, " sections written"));
  uint64_t total = out_->size() + kTrailerBytes;
  Put<uint64_t>(out_, 40, total);
  uint32_t crc = Crc32c(out_->data(), out_->size());
  size_t at = out_->size();
  out_->resize(at + kTrailerBytes);
  Put<uint32_t>(out_, at, crc);
  return absl::OkStatus();
}

absl::StatusOr<BlobView> ParseBlob(std::span<const uint8_t> blob, ParseOptions opts) {
  if (blob.size() < kHeaderBytes + kTrailerBytes)
    return absl::DataLossError(
        absl::StrCat("blob: ", blob.size(), " bytes is shorter than the minimal blob"));
  const uint8_t* p = blob.data();
  if (Get<uint32_t>(p) != kBlobMagic) return absl::DataLossError("blob: bad magic");
  uint16_t version = Get<uint16_t>(p + 4);
  if (version != kBlobVersion)
    return absl::UnimplementedError(
        absl::StrCat("blob: format version ", version, " (this build reads ", kBlobVersion, ")"));
  if (Get<uint16_t>(p + 6) != kHeaderBytes)
    return absl::DataLossError(absl::StrCat("blob: header size ", Get<uint16_t>(p + 6)));
  BlobView v;
  v.blob = blob;
  BlobHeader& h = v.header;
  h.total_bytes = Get<uint64_t>(p + 40);
  if (h.total_bytes != blob.size())
    return absl::DataLossError(
        absl::StrCat("blob: header says ", h.total_bytes, " bytes, buffer holds ", blob.size()));
  if (opts.verify_crc) {
    size_t body = blob.size() - kTrailerBytes;
    uint32_t want = Get<uint32_t>(p + body);
    uint32_t got = Crc32c(p, body);
    if (want != got)
      return absl::DataLossError(
          absl::StrCat("blob: CRC32C mismatch (stored ", want, ", computed ", got, ")"));
  }
  h.mode = p[8];
  h.flags = p[9];
  h.group_size = Get<uint16_t>(p + 10);
  h.layout.num_layers = Get<uint32_t>(p + 12);
  h.layout.num_kv_heads = Get<uint32_t>(p + 16);
  h.layout.head_dim = Get<uint32_t>(p + 20);
  h.layout.tokens_per_block = Get<uint32_t>(p + 24);
  h.layout.dtype = static_cast<DType>(p[28]);
  h.layout.kind = static_cast<KvKind>(p[29]);
  h.key_bits = p[30];
  h.value_bits = p[31];
  if (p[28] < 1 || p[28] > 4) return absl::DataLossError("blob: unknown dtype");
  if (p[29] < 1 || p[29] > 2) return absl::DataLossError("blob: unknown kv kind");
  if (absl::Status s = h.layout.Validate(); !s.ok())
    return absl::DataLossError(absl::StrCat("blob: bad layout: ", s.message()));
  h.decoded_bytes = Get<uint64_t>(p + 48);
  if (h.decoded_bytes != h.layout.BlockBytes())
    return absl::DataLossError("blob: decoded size disagrees with the layout");
  h.first_position = Get<uint32_t>(p + 36);
  h.calibration_id = Get<uint64_t>(p + 56);
  if (h.first_position != 0 && !ModeNamesCalibration(h.mode))
    return absl::DataLossError("blob: reserved header fields are not zero");
  if ((h.calibration_id != 0) != ModeNamesCalibration(h.mode))
    return absl::DataLossError(h.calibration_id != 0
                                   ? "blob: a calibration id in a mode that has none"
                                   : "blob: calibrated blob without a calibration id");
  uint32_t n = Get<uint32_t>(p + 32);
  if (n > kMaxSections) return absl::DataLossError(absl::StrCat("blob: ", n, " sections"));
  uint64_t table_end = kHeaderBytes + uint64_t{n} * kSectionEntryBytes;
  uint64_t body_end = blob.size() - kTrailerBytes;
  if (table_end > body_end)
    return absl::DataLossError("blob: section table runs past the end of the blob");
  v.sections.resize(n);
  uint64_t cursor = table_end;
  for (uint32_t i = 0; i < n; ++i) {
    const uint8_t* e = p + kHeaderBytes + size_t{i} * kSectionEntryBytes;
    SectionEntry& s = v.sections[i];
    s.type = static_cast<SectionType>(e[0]);
    s.tensor = e[1];
    s.layer = Get<uint16_t>(e + 2);
    s.bits = e[4];
    s.coder = e[5];
    s.offset = Get<uint64_t>(e + 8);
    s.size = Get<uint64_t>(e + 16);
    if (e[0] < 1 || e[0] > 7)
      return absl::DataLossError(absl::StrCat("blob: section ", i, " has unknown type"));
    if (s.layer >= h.layout.num_layers || s.tensor >= h.layout.TensorsPerLayer())
      return absl::DataLossError(absl::StrCat("blob: section ", i, " names layer ", s.layer,
                                              " tensor ", s.tensor, " outside the layout"));
    // Sections are stored in table order without overlap; this also rules out overflow.
    if (s.offset < cursor || s.offset > body_end || s.size > body_end - s.offset)
      return absl::DataLossError(absl::StrCat("blob: section ", i, " bytes [", s.offset, ", +",
                                              s.size, ") are outside the payload area"));
    cursor = s.offset + s.size;
  }
  return v;
}

}  // namespace strata::codec
