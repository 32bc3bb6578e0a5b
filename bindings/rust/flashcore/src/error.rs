//! Status codes and the error type.

use crate::sys;
use std::ffi::CStr;
use std::fmt;
use std::os::raw::c_char;

/// Why a flashcore call failed: the C `flashcore_status`, less its success value.
///
/// The C library may add statuses in later versions; this crate reports the
/// ones it does not know as [`Status::Unknown`] instead of misreading them.
///
/// ```
/// use flashcore::{sys, Status};
///
/// assert_eq!(Status::from_raw(sys::FLASHCORE_STATUS_NO_DEVICE), Some(Status::NoDevice));
/// assert_eq!(Status::from_raw(sys::FLASHCORE_STATUS_SUCCESS), None);
/// assert_eq!(Status::NoDevice.to_raw(), sys::FLASHCORE_STATUS_NO_DEVICE);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Status {
    /// A parameter is wrong whatever the GPU (`FLASHCORE_STATUS_INVALID_ARGUMENT`).
    InvalidArgument,
    /// Valid, but this build of the library or the GPU has no kernel for it, e.g. a head dim
    /// no pair of [`supported_head_dims`](crate::supported_head_dims) covers
    /// (`FLASHCORE_STATUS_UNSUPPORTED`).
    Unsupported,
    /// A pointer or stride does not meet the alignment the kernels need (`FLASHCORE_STATUS_MISALIGNED`).
    Misaligned,
    /// The workspace is smaller than [`Handle::workspace_size`](crate::Handle::workspace_size)
    /// (or [`Handle::backward_workspace_size`](crate::Handle::backward_workspace_size))
    /// asked for (`FLASHCORE_STATUS_WORKSPACE_TOO_SMALL`).
    WorkspaceTooSmall,
    /// No CUDA device is visible, or the driver is missing or too old (`FLASHCORE_STATUS_NO_DEVICE`).
    NoDevice,
    /// The CUDA runtime reported an error; the message names it (`FLASHCORE_STATUS_CUDA_ERROR`).
    CudaError,
    /// Host or device memory could not be allocated (`FLASHCORE_STATUS_OUT_OF_MEMORY`).
    OutOfMemory,
    /// A bug in flashcore (`FLASHCORE_STATUS_INTERNAL`).
    Internal,
    /// A status code this crate does not know, from a newer library.
    Unknown(u32),
}

const KNOWN: [(Status, sys::flashcore_status); 8] = [
    (Status::InvalidArgument, sys::FLASHCORE_STATUS_INVALID_ARGUMENT),
    (Status::Unsupported, sys::FLASHCORE_STATUS_UNSUPPORTED),
    (Status::Misaligned, sys::FLASHCORE_STATUS_MISALIGNED),
    (Status::WorkspaceTooSmall, sys::FLASHCORE_STATUS_WORKSPACE_TOO_SMALL),
    (Status::NoDevice, sys::FLASHCORE_STATUS_NO_DEVICE),
    (Status::CudaError, sys::FLASHCORE_STATUS_CUDA_ERROR),
    (Status::OutOfMemory, sys::FLASHCORE_STATUS_OUT_OF_MEMORY),
    (Status::Internal, sys::FLASHCORE_STATUS_INTERNAL),
];

impl Status {
    /// Maps a C status code; `None` for `FLASHCORE_STATUS_SUCCESS`.
    ///
    /// ```
    /// # use flashcore::Status;
    /// assert_eq!(Status::from_raw(1), Some(Status::InvalidArgument));
    /// assert_eq!(Status::from_raw(1000), Some(Status::Unknown(1000)));
    /// ```
    pub fn from_raw(raw: sys::flashcore_status) -> Option<Status> {
        if raw == sys::FLASHCORE_STATUS_SUCCESS {
            return None;
        }
        let known = KNOWN.iter().find(|(_, code)| *code == raw);
        Some(known.map_or(Status::Unknown(raw), |(status, _)| *status))
    }

    /// The C status code.
    ///
    /// ```
    /// # use flashcore::Status;
    /// assert_eq!(Status::Misaligned.to_raw(), 3);
    /// ```
    pub fn to_raw(self) -> sys::flashcore_status {
        match self {
            Status::Unknown(raw) => raw,
            known => KNOWN.iter().find(|(status, _)| *status == known).map_or(u32::MAX, |(_, code)| *code),
        }
    }

    /// The library's static name for the status (`flashcore_status_string`),
    /// such as the one for [`Status::NoDevice`]; `"unknown status"` for
    /// codes the loaded library does not know either.
    ///
    /// ```
    /// # use flashcore::Status;
    /// assert_eq!(Status::Unknown(1000).name(), "unknown status");
    /// println!("{}", Status::NoDevice.name());
    /// ```
    pub fn name(self) -> &'static str {
        // SAFETY: the library returns a static NUL-terminated string, never NULL.
        unsafe { static_str(sys::flashcore_status_string(self.to_raw())) }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A failed flashcore call: the [`Status`] and the library's explanation.
///
/// The message is the calling thread's `flashcore_last_error_message`, copied
/// right after the failing call, so it says what was wrong and what is
/// supported. Errors found by this crate itself (a field the builder was
/// never given, a buffer too small for its tensor) carry a message written
/// here, with status [`Status::InvalidArgument`].
///
/// ```
/// use flashcore::{ForwardParams, Status};
///
/// let err = ForwardParams::builder().build().unwrap_err();
/// assert_eq!(err.status(), Status::InvalidArgument);
/// assert!(err.message().contains("batch_size"));
/// println!("{err}"); // "<status name>: <message>"
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    status: Status,
    message: String,
}

impl Error {
    /// The status the call returned.
    pub fn status(&self) -> Status {
        self.status
    }

    /// What was wrong, in the library's words (may be empty).
    pub fn message(&self) -> &str {
        &self.message
    }

    pub(crate) fn new(status: Status, message: impl Into<String>) -> Error {
        Error { status, message: message.into() }
    }

    /// Must run on the failing call's thread before any other flashcore call.
    fn from_last_call(status: Status) -> Error {
        // SAFETY: never NULL; valid until the next flashcore call on this thread.
        let message = unsafe { CStr::from_ptr(sys::flashcore_last_error_message()) };
        Error::new(status, message.to_string_lossy())
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.message.is_empty() {
            write!(f, "{}", self.status)
        } else {
            write!(f, "{}: {}", self.status, self.message)
        }
    }
}

impl std::error::Error for Error {}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Turns a status returned by the C library into a `Result`, copying the
/// thread's last error message on failure. Call it directly on the status.
pub(crate) fn check(raw: sys::flashcore_status) -> Result<()> {
    match Status::from_raw(raw) {
        None => Ok(()),
        Some(status) => Err(Error::from_last_call(status)),
    }
}

/// # Safety
/// `ptr` is a NUL-terminated string that lives for the whole program.
pub(crate) unsafe fn static_str(ptr: *const c_char) -> &'static str {
    if ptr.is_null() {
        return "";
    }
    CStr::from_ptr(ptr).to_str().unwrap_or("(not UTF-8)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_maps_to_its_status_and_back() {
        // The header numbers the failures 1 to 8 and promises never to renumber them.
        let in_code_order = [
            Status::InvalidArgument,
            Status::Unsupported,
            Status::Misaligned,
            Status::WorkspaceTooSmall,
            Status::NoDevice,
            Status::CudaError,
            Status::OutOfMemory,
            Status::Internal,
        ];
        for (code, status) in (1..).zip(in_code_order) {
            assert_eq!(Status::from_raw(code), Some(status), "code {code}");
            assert_eq!(status.to_raw(), code, "{status:?}");
        }
        assert_eq!(sys::FLASHCORE_STATUS_NO_DEVICE, 5);
        assert_eq!(Status::from_raw(sys::FLASHCORE_STATUS_SUCCESS), None);
        assert_eq!(check(sys::FLASHCORE_STATUS_SUCCESS), Ok(()));
    }

    #[test]
    fn unknown_codes_are_kept_not_misread() {
        for code in [9, 42, u32::MAX] {
            assert_eq!(Status::from_raw(code), Some(Status::Unknown(code)));
            assert_eq!(Status::Unknown(code).to_raw(), code);
            assert_eq!(Status::Unknown(code).name(), "unknown status");
        }
    }

    #[test]
    fn names_come_from_the_library() {
        for (status, code) in KNOWN {
            // SAFETY: static strings, as above.
            let c_name = unsafe { static_str(sys::flashcore_status_string(code)) };
            assert_eq!(status.name(), c_name);
            assert_ne!(status.name(), "unknown status", "{status:?}");
            assert_eq!(status.to_string(), c_name);
        }
    }

    #[test]
    fn error_carries_status_and_library_message() {
        // SAFETY: NULL params is a documented invalid argument.
        let err = check(unsafe { sys::flashcore_forward_check(std::ptr::null()) }).unwrap_err();
        assert_eq!(err.status(), Status::InvalidArgument);
        assert!(!err.message().is_empty(), "the library explains the failure");
        assert_eq!(err.to_string(), format!("{}: {}", Status::InvalidArgument.name(), err.message()));
        let bare = Error::new(Status::Internal, "");
        assert_eq!(bare.to_string(), Status::Internal.name());
    }
}
