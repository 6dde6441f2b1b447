#include "common/packed_ids.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace strata {

std::string PackIds(std::span<const BlockId> ids) {
  std::string out(ids.size() * sizeof(BlockId::bytes), '\0');
  for (size_t i = 0; i < ids.size(); ++i)
    std::memcpy(out.data() + i * sizeof(BlockId::bytes), ids[i].bytes.data(),
                sizeof(BlockId::bytes));
  return out;
}

absl::StatusOr<std::vector<BlockId>> UnpackIds(std::string_view packed, std::string_view field,
                                               size_t max_ids) {
  constexpr size_t kIdBytes = sizeof(BlockId::bytes);
  if (packed.size() % kIdBytes != 0)
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(field), " must be a multiple of 32 bytes, got ", packed.size()));
  const size_t n = packed.size() / kIdBytes;
  if (n > max_ids)
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(field), " holds ", n, " ids; the limit per call is ", max_ids));
  std::vector<BlockId> ids(n);
  for (size_t i = 0; i < n; ++i)
    std::memcpy(ids[i].bytes.data(), packed.data() + i * kIdBytes, kIdBytes);
  return ids;
}

}  // namespace strata
