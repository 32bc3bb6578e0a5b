//! Safe Rust API for libflashcore: fused scaled-dot-product attention on
//! NVIDIA GPUs (sm_80 and newer),
//!
//! ```text
//! out = softmax(softmax_scale · Q·Kᵀ [+ causal mask]) · V
//! ```
//!
//! computed in one FlashAttention-style kernel, never materialising the score
//! matrix. fp16 and bf16; head_dim 64 or 128; grouped-query attention;
//! any strides.
//!
//! This crate links the installed `libflashcore.so` (see [`sys`] for how it
//! is found) and compiles no CUDA, so it builds in seconds and has no
//! dependencies outside the standard library. Device memory and streams stay
//! yours: any buffer type reaches flashcore through the [`DeviceBuffer`]
//! trait, or as a bare address in a [`RawBuffer`].
//!
//! # Overview
//!
//! - [`Handle`]: the library bound to one GPU; [`Handle::workspace_size`]
//!   and [`Handle::forward`].
//! - [`ForwardParams`]: shapes, options and buffers of one call, made and
//!   validated by [`ForwardParamsBuilder`].
//! - [`Error`]: a [`Status`] and the library's explanation.
//!
//! # Example
//!
//! ```no_run
//! use flashcore::{DeviceBuffer, ForwardParams, Handle, Layout};
//!
//! // Any device buffer type: implement DeviceBuffer for yours (or wrap a
//! // cudarc slice, or use flashcore::RawBuffer for a bare address).
//! struct Buffer { address: u64, bytes: usize }
//! impl DeviceBuffer for Buffer {
//!     fn device_ptr(&self) -> u64 { self.address }
//!     fn byte_len(&self) -> usize { self.bytes }
//! }
//! # fn alloc(bytes: usize) -> Buffer { unimplemented!() }
//! # fn free_after(stream: *mut std::ffi::c_void, buffers: Vec<Buffer>) {}
//!
//! let handle = Handle::new()?;
//! // [batch 2, seqlen 1024, 16 query / 4 key-value heads, head_dim 128], fp16.
//! let (q, k, v) = (alloc(2 * 1024 * 16 * 128 * 2), alloc(2 * 1024 * 4 * 128 * 2), alloc(2 * 1024 * 4 * 128 * 2));
//! let mut out = alloc(2 * 1024 * 16 * 128 * 2);
//! let params = ForwardParams::builder()
//!     .batch_size(2)
//!     .seqlen_q(1024)
//!     .seqlen_k(1024)
//!     .num_heads_q(16)
//!     .num_heads_kv(4)
//!     .head_dim(128)
//!     .causal(true)
//!     .layout(Layout::Bshd)
//!     .q(&q)
//!     .k(&k)
//!     .v(&v)
//!     .out(&mut out)
//!     .build()?; // validated by the library; no GPU needed for this
//! let mut workspace = alloc(handle.workspace_size(&params)?);
//! let stream = std::ptr::null_mut(); // or your cudaStream_t / CUstream
//! // SAFETY: live device buffers of the stated sizes, freed only once the
//! // stream has finished the work.
//! unsafe { handle.forward(&params, Some(&mut workspace), stream)? };
//! free_after(stream, vec![q, k, v, out, workspace]);
//! # Ok::<(), flashcore::Error>(())
//! ```

#![deny(missing_docs)]

mod buffer;
mod error;
mod handle;
mod params;

pub use buffer::{DeviceBuffer, RawBuffer};
pub use error::{Error, Result, Status};
pub use handle::Handle;
pub use params::{DType, ForwardParams, ForwardParamsBuilder, Layout, Strides, Tensor};

/// The raw C API (`flashcore-sys`), for what this crate does not wrap.
pub use flashcore_sys as sys;

/// Alignment in bytes that q, k, v, out and the workspace must have, and that
/// every stride must be a multiple of (in bytes).
pub const ALIGNMENT: usize = sys::FLASHCORE_ALIGNMENT as usize;

/// Version of the loaded library, `"MAJOR.MINOR.PATCH"`.
///
/// ```
/// println!("libflashcore {}", flashcore::version());
/// ```
pub fn version() -> &'static str {
    // SAFETY: the library returns a static string.
    unsafe { error::static_str(sys::flashcore_version_string()) }
}

/// Version of the loaded library as `MAJOR * 10000 + MINOR * 100 + PATCH`.
/// These bindings were made for [`sys::FLASHCORE_VERSION_NUMBER`]; a library
/// with the same major version and a number at least that large works.
///
/// ```
/// let loaded = flashcore::version_number();
/// assert_eq!(loaded / 10000, flashcore::sys::FLASHCORE_VERSION_MAJOR);
/// assert!(loaded >= flashcore::sys::FLASHCORE_VERSION_NUMBER);
/// ```
pub fn version_number() -> u32 {
    // SAFETY: no arguments, no preconditions.
    unsafe { sys::flashcore_version_number() }
}

#[cfg(test)]
mod tests {
    #[test]
    fn handle_is_send_and_sync() {
        fn shareable<T: Send + Sync>() {}
        shareable::<crate::Handle>();
    }

    #[test]
    fn version_string_matches_number() {
        let n = crate::version_number();
        assert_eq!(crate::version(), format!("{}.{}.{}", n / 10000, n / 100 % 100, n % 100));
    }
}
