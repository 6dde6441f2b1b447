// Conversions between the wire messages and the vocabulary types of common/.
#pragma once

#include "strata/block_id.h"
#include "strata/v1/cache.pb.h"

namespace strata {

v1::NamespaceSpecProto ToProto(const NamespaceSpec& spec);
NamespaceSpec FromProto(const v1::NamespaceSpecProto& proto);

}  // namespace strata
