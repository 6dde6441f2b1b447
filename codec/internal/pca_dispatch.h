// Which kernel family the pca coder takes on this CPU (and under the tests' and the
// environment's switches): one answer for DecodePca and ProjectPca (codec/pca.cc) and for the
// kernels the daemon reports (codec/cpu_kernels.cc), so the report cannot drift from the code.
#ifndef STRATA_CODEC_INTERNAL_PCA_DISPATCH_H_
#define STRATA_CODEC_INTERNAL_PCA_DISPATCH_H_

namespace strata::codec::internal {

enum class PcaDecodeKernel {
  kFloat,       // the Highway float kernels (also where the tests switch the tiles off)
  kAvx2,        // integer sums of byte symbols (internal/pca_avx2.h)
  kAvx512,      // float sums in token lanes (internal/pca_avx512.h)
  kAvx512Vnni,  // integer sums in column lanes, int8 or int16 terms
  kAmxBf16,     // tiles, bf16 operands (internal/pca_amx.h)
  kAmxInt8,     // tiles, int8 terms where a head's axes admit them
};
// For heads whose dimension is a multiple of 32 (and, for kAvx2, at most 256 with symbols that
// fit a byte): the caller checks the head; others take the float kernels.
PcaDecodeKernel ChoosePcaDecodeKernel();

enum class PcaEncodeKernel { kFloat, kAvx2, kAvx512Vnni, kAmxBf16 };
PcaEncodeKernel ChoosePcaEncodeKernel();

const char* PcaDecodeKernelName(PcaDecodeKernel k);
const char* PcaEncodeKernelName(PcaEncodeKernel k);

}  // namespace strata::codec::internal

#endif  // STRATA_CODEC_INTERNAL_PCA_DISPATCH_H_
