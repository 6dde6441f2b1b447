// Which CPU path each part of the codec takes in this process (codec.h, CpuKernels): the answers
// the dispatchers themselves take (internal/pca_dispatch.h, XlKernelInUse), so the report is what
// runs, for the heads and sections that qualify (docs/codec.md, "CPU kernels").
#include "absl/strings/str_cat.h"
#include "codec/codec.h"
#include "codec/internal/cross_layer_amx.h"
#include "codec/internal/pca_dispatch.h"
#include "codec/internal/rans_simd.h"

namespace strata::codec {

namespace {

std::string RansKernel() {
#if STRATA_RANS_AVX512
  if (rans::UseAvx512()) return "avx512";
  if (rans::UseAvx2()) return "avx2";
#endif
  return "scalar";
}

std::string XlKernelName() {
  switch (internal::XlKernelInUse()) {
    case internal::XlKernel::kAmx: return "amx-bf16";
    case internal::XlKernel::kAvx512Bf16: return "avx512-bf16";
    case internal::XlKernel::kFma: return "avx2-fma";
    case internal::XlKernel::kFloat: break;
  }
  return "float";
}

}  // namespace

std::vector<CpuKernel> CpuKernels() {
  return {{"rans", RansKernel()},
          {"pca_decode", internal::PcaDecodeKernelName(internal::ChoosePcaDecodeKernel())},
          {"pca_encode", internal::PcaEncodeKernelName(internal::ChoosePcaEncodeKernel())},
          {"xl_products", XlKernelName()}};
}

std::string DescribeCpuKernels() {
  std::string out;
  for (const CpuKernel& k : CpuKernels())
    absl::StrAppend(&out, out.empty() ? "" : ", ", k.part, " ", k.kernel);
  return out;
}

}  // namespace strata::codec
