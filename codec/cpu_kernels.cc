// Which CPU path each part of the codec takes in this process (codec.h, CpuKernels): the same
// predicates the dispatchers ask, so the answer is what runs, for the heads and sections that
// qualify (docs/codec.md, "CPU kernels").
#include "absl/strings/str_cat.h"
#include "codec/codec.h"
#include "codec/internal/cross_layer_amx.h"
#include "codec/internal/kernels.h"
#include "codec/internal/pca_amx.h"
#include "codec/internal/pca_avx2.h"
#include "codec/internal/pca_avx512.h"
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

// As DecodePca chooses for a head of a multiple of 32 dimensions with byte symbols.
std::string PcaDecodeKernel() {
  using namespace internal;
  if (PcaAmxAvailable()) return PcaAmxInt8Available() ? "amx-int8" : "amx-bf16";
  if (PcaAmxSupported()) return "float";  // the tiles switched off: the float kernels
  if (PcaLanesSupported() && DispatchesToAvx512())
    return PcaVnniAvailable() ? "avx512-vnni" : "avx512";
  if (PcaAvx2Available() && DispatchesToAvx2()) return "avx2";
  return "float";
}

// As ProjectPca chooses.
std::string PcaEncodeKernel() {
  using namespace internal;
  if (PcaAmxEncodeAvailable()) return "amx-bf16";
  if (PcaAmxSupported()) return "float";
  if (PcaVnniAvailable() && DispatchesToAvx512()) return "avx512-vnni";
  if (PcaAvx2Available() && DispatchesToAvx2()) return "avx2";
  return "float";
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
          {"pca_decode", PcaDecodeKernel()},
          {"pca_encode", PcaEncodeKernel()},
          {"xl_products", XlKernelName()}};
}

std::string DescribeCpuKernels() {
  std::string out;
  for (const CpuKernel& k : CpuKernels())
    absl::StrAppend(&out, out.empty() ? "" : ", ", k.part, " ", k.kernel);
  return out;
}

}  // namespace strata::codec
