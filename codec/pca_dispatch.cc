#include "codec/internal/pca_dispatch.h"

#include "codec/internal/kernels.h"
#include "codec/internal/pca_amx.h"
#include "codec/internal/pca_avx2.h"
#include "codec/internal/pca_avx512.h"

namespace strata::codec::internal {

PcaDecodeKernel ChoosePcaDecodeKernel() {
  if (PcaAmxAvailable())
    return PcaAmxInt8Available() && PcaVnniBytesAvailable() ? PcaDecodeKernel::kAmxInt8
                                                            : PcaDecodeKernel::kAmxBf16;
  // Tiles present but switched off by the tests' switch: the float kernels, not the lanes, so
  // those runs compare the tiles against the reference. (STRATA_CODEC_AMX=0 hides the tiles
  // altogether: the lanes then run as on a core without them.)
  if (PcaAmxSupported()) return PcaDecodeKernel::kFloat;
  // Where Highway would dispatch to another target (tests pin each), its float kernels.
  if (PcaLanesSupported() && DispatchesToAvx512())
    return PcaVnniAvailable() ? PcaDecodeKernel::kAvx512Vnni : PcaDecodeKernel::kAvx512;
  if (PcaAvx2Available() && DispatchesToAvx2()) return PcaDecodeKernel::kAvx2;
  return PcaDecodeKernel::kFloat;
}

PcaEncodeKernel ChoosePcaEncodeKernel() {
  if (PcaAmxEncodeAvailable()) return PcaEncodeKernel::kAmxBf16;
  if (PcaAmxSupported()) return PcaEncodeKernel::kFloat;
  if (PcaVnniAvailable() && DispatchesToAvx512()) return PcaEncodeKernel::kAvx512Vnni;
  if (PcaAvx2Available() && DispatchesToAvx2()) return PcaEncodeKernel::kAvx2;
  return PcaEncodeKernel::kFloat;
}

const char* PcaDecodeKernelName(PcaDecodeKernel k) {
  switch (k) {
    case PcaDecodeKernel::kAvx2: return "avx2";
    case PcaDecodeKernel::kAvx512: return "avx512";
    case PcaDecodeKernel::kAvx512Vnni: return "avx512-vnni";
    case PcaDecodeKernel::kAmxBf16: return "amx-bf16";
    case PcaDecodeKernel::kAmxInt8: return "amx-int8";
    case PcaDecodeKernel::kFloat: break;
  }
  return "float";
}

const char* PcaEncodeKernelName(PcaEncodeKernel k) {
  switch (k) {
    case PcaEncodeKernel::kAvx2: return "avx2";
    case PcaEncodeKernel::kAvx512Vnni: return "avx512-vnni";
    case PcaEncodeKernel::kAmxBf16: return "amx-bf16";
    case PcaEncodeKernel::kFloat: break;
  }
  return "float";
}

}  // namespace strata::codec::internal
