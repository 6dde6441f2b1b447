// STRATA_TSAN: 1 in ThreadSanitizer builds (GCC and Clang spell the test differently), else 0.
// Code that only exists to tell TSan about an ordering it cannot see compiles away without it.
#pragma once

#if defined(__SANITIZE_THREAD__)
#define STRATA_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define STRATA_TSAN 1
#endif
#endif
#ifndef STRATA_TSAN
#define STRATA_TSAN 0
#endif
