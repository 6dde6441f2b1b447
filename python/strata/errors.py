"""Exceptions raised by the strata client: one class per status code, all StrataError.

The message is the daemon's (or the library's) own text; `code` is the status code's name.
"""


class StrataError(Exception):
    code = "UNKNOWN"


class InvalidArgumentError(StrataError, ValueError):
    code = "INVALID_ARGUMENT"


class NotFoundError(StrataError, LookupError):
    code = "NOT_FOUND"


class AlreadyExistsError(StrataError):
    code = "ALREADY_EXISTS"


class FailedPreconditionError(StrataError):
    code = "FAILED_PRECONDITION"


class DeadlineExceededError(StrataError, TimeoutError):
    code = "DEADLINE_EXCEEDED"


class UnavailableError(StrataError, ConnectionError):
    code = "UNAVAILABLE"


class ResourceExhaustedError(StrataError):
    code = "RESOURCE_EXHAUSTED"


class PermissionDeniedError(StrataError, PermissionError):
    code = "PERMISSION_DENIED"


class UnauthenticatedError(StrataError, PermissionError):
    code = "UNAUTHENTICATED"


class DataLossError(StrataError):
    code = "DATA_LOSS"


class InternalError(StrataError):
    code = "INTERNAL"


_BY_CODE = {
    cls.code: cls
    for cls in (InvalidArgumentError, NotFoundError, AlreadyExistsError,
                FailedPreconditionError, DeadlineExceededError, UnavailableError,
                ResourceExhaustedError, PermissionDeniedError, UnauthenticatedError,
                DataLossError, InternalError)
}


def error_class(code_name: str) -> type:
    """The exception class for an absl status code name such as 'NOT_FOUND'."""
    return _BY_CODE.get(code_name, StrataError)
