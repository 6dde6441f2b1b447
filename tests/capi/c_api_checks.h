/* C checks of strata/c.h, driven by a C++ test that starts the daemon. */
#ifndef STRATA_TESTS_CAPI_C_API_CHECKS_H_
#define STRATA_TESTS_CAPI_C_API_CHECKS_H_

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

int CheckRoundTrip(const char* endpoint, char* failure, size_t failure_size);
int CheckErrors(const char* endpoint, char* failure, size_t failure_size);
int CheckVllmScheme(const char* endpoint, char* failure, size_t failure_size);

#ifdef __cplusplus
}
#endif

#endif
