"""Exceptions: one FlashcoreError subclass per flashcore_status."""

from . import _ffi, _fields

Status = _ffi.Status


class FlashcoreError(Exception):
    """Base of every error flashcore raises.

    status:  the flashcore.Status the library returned (a plain int for a
             status this package does not know; None when no status applies,
             e.g. the library could not be loaded).
    message: the library's detail text (flashcore_last_error_message), or the
             binding's own when the error was found before calling the library.
    """

    status_code = None  # the Status a subclass stands for

    def __init__(self, message, status=None):
        if status is None:
            status = self.status_code
        self.status = status
        self.message = message
        super().__init__(message)

    def __str__(self):
        if self.status is None:
            return self.message
        return "%s: %s" % (status_name(self.status), self.message)


class InvalidArgumentError(FlashcoreError, ValueError):
    status_code = Status.INVALID_ARGUMENT


class InvalidArgumentTypeError(InvalidArgumentError, TypeError):
    """An argument of a type the binding does not take (a float where the C
    API has an int, None or another struct where it takes a params struct).
    An InvalidArgumentError, and a TypeError as Python's own refusals of a
    type are: either catches it."""


class UnsupportedError(FlashcoreError):
    status_code = Status.UNSUPPORTED


class MisalignedError(FlashcoreError, ValueError):
    status_code = Status.MISALIGNED


class WorkspaceTooSmallError(FlashcoreError, ValueError):
    status_code = Status.WORKSPACE_TOO_SMALL


class NoDeviceError(FlashcoreError):
    status_code = Status.NO_DEVICE


class CudaError(FlashcoreError):
    status_code = Status.CUDA_ERROR


class OutOfMemoryError(FlashcoreError):
    status_code = Status.OUT_OF_MEMORY


class InternalError(FlashcoreError):
    status_code = Status.INTERNAL


class LibraryError(FlashcoreError):
    """libflashcore could not be found or loaded, or is not a version this
    package can use. Carries no status."""


_fields.use_errors(InvalidArgumentError, InvalidArgumentTypeError)

ERROR_CLASSES = {
    cls.status_code: cls
    for cls in (
        InvalidArgumentError,
        UnsupportedError,
        MisalignedError,
        WorkspaceTooSmallError,
        NoDeviceError,
        CudaError,
        OutOfMemoryError,
        InternalError,
    )
}


def status_name(status):
    """Lower-case name of a status without asking the library ("invalid argument")."""
    try:
        return Status(status).name.lower().replace("_", " ")
    except ValueError:
        return "status %d" % int(status)


def error_for_status(status, message):
    """The exception for a non-success status: its subclass, or FlashcoreError
    itself for a status value newer than this package."""
    try:
        status = Status(status)
    except ValueError:
        return FlashcoreError(message, int(status))
    if status == Status.SUCCESS:
        raise ValueError("error_for_status called with SUCCESS")
    return ERROR_CLASSES.get(status, FlashcoreError)(message, status)
