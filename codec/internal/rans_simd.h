// AVX-512 dispatch shared by the rANS encoder and decoder. STRATA_RANS_AVX512 is 1 where the
// compiler can emit the AVX-512 paths (x86-64); UseAvx512() says whether this CPU runs them.
#pragma once

#include <cstdint>
#include <type_traits>

#if defined(__x86_64__)
#if defined(__GNUC__) && !defined(__clang__)
// GCC's AVX-512 headers start some conversions from _mm*_undefined_*(), which -Wall flags.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#define STRATA_RANS_AVX512 1
#endif

namespace strata::codec::rans {

// Set by ForceScalarForTesting and ForceAvx2ForTesting.
extern bool g_force_scalar;
extern bool g_force_avx2;

#if STRATA_RANS_AVX512
inline bool CpuHasAvx512() {
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  return ok;
}

inline bool UseAvx512() { return CpuHasAvx512() && !g_force_scalar && !g_force_avx2; }

// The 8-lane loops, for x86 cores without AVX-512 (AMD's before Zen 4, Intel's clients):
// AVX2 with its gathers, FMA (the encoder's float(x)), BMI1, BMI2 and POPCNT: every feature
// their target attributes name.
inline bool CpuHasAvx2() {
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                         __builtin_cpu_supports("bmi") && __builtin_cpu_supports("bmi2") &&
                         __builtin_cpu_supports("popcnt");
  return ok;
}

inline bool UseAvx2() { return CpuHasAvx2() && !UseAvx512() && !g_force_scalar; }

// The SIMD paths are templates on the number of 16-lane state vectors (8, 4 or 2 for 128, 64
// or 32 states) and on the span of a section's symbol table (16, 32, 64, or a general one):
// these call f with each as a compile-time constant.
template <typename F>
decltype(auto) WithChains(int chains, F&& f) {
  switch (chains) {
    case 8: return f(std::integral_constant<int, 8>{});
    case 4: return f(std::integral_constant<int, 4>{});
    default: return f(std::integral_constant<int, 2>{});
  }
}
template <int kGeneral, typename F>
decltype(auto) WithTableSpan(uint32_t span, F&& f) {
  switch (span) {
    case 16: return f(std::integral_constant<int, 16>{});
    case 32: return f(std::integral_constant<int, 32>{});
    case 64: return f(std::integral_constant<int, 64>{});
    default: return f(std::integral_constant<int, kGeneral>{});
  }
}
#endif

}  // namespace strata::codec::rans
