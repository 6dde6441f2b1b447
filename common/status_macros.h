// Early-return helpers for absl::Status / absl::StatusOr, the error currency of every module.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define STRATA_CONCAT_INNER(a, b) a##b
#define STRATA_CONCAT(a, b) STRATA_CONCAT_INNER(a, b)

#define STRATA_RETURN_IF_ERROR(expr)                 \
  do {                                               \
    ::absl::Status strata_status_ = (expr);          \
    if (!strata_status_.ok()) return strata_status_; \
  } while (0)

#define STRATA_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(*tmp)

#define STRATA_ASSIGN_OR_RETURN(lhs, expr) \
  STRATA_ASSIGN_OR_RETURN_IMPL(STRATA_CONCAT(strata_statusor_, __LINE__), lhs, expr)
