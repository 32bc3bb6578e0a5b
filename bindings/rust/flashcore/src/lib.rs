//! Safe Rust API for libflashcore: fused scaled-dot-product attention on
//! NVIDIA GPUs (sm_80 and newer),
//!
//! ```text
//! out = softmax(cap(softmax_scale · Q·Kᵀ) [+ causal/window mask]) · V
//! ```
//!
//! computed in one FlashAttention-style kernel, never materialising the score
//! matrix. fp16 and bf16; head dims that are multiples of 8 up to those of
//! the build's kernels (see [`supported_head_dims`]), with v and out
//! optionally narrower than q and k (e.g. 192 and 128); grouped-query
//! attention; any strides; sliding windows
//! ([`ForwardParamsBuilder::window`]) and logit softcapping
//! ([`ForwardParamsBuilder::softcap`], the `cap` above; none by default);
//! split-KV for calls too small to fill the GPU
//! ([`ForwardParamsBuilder::num_splits`]); KV caches: per-sequence key counts
//! ([`ForwardParamsBuilder::seqused_k`]), paged pools
//! ([`ForwardParamsBuilder::paged_kv`]) and fp8 (e4m3) keys and values with
//! per-tensor or per-(batch, head) descale factors
//! ([`ForwardParamsBuilder::kv_dtype`], [`ForwardParamsBuilder::k_descale`],
//! [`ForwardParamsBuilder::v_descale`]); fp8 prefill on compute capability
//! 9.0 GPUs: e4m3 queries, keys and values with a bf16 output
//! ([`ForwardParamsBuilder::dtype`], [`ForwardParamsBuilder::q_descale`],
//! [`ForwardParamsBuilder::out_dtype`]); variable-length batches packed as
//! FlashAttention's varlen calls ([`ForwardParamsBuilder::varlen_q`],
//! [`ForwardParamsBuilder::varlen_k`]); merging of results computed over
//! parts of the keys ([`Handle::merge_states`]); and the backward pass for
//! training: the gradients dq, dk and dv ([`Handle::backward`], with every
//! option of the forward but paged KV caches).
//!
//! This crate links the installed `libflashcore.so` (see [`sys`] for how it
//! is found) and compiles no CUDA, so it builds in seconds and has no
//! dependencies outside the standard library. Device memory and streams stay
//! yours: any buffer type reaches flashcore through the [`DeviceBuffer`]
//! trait, or as a bare address in a [`RawBuffer`]; types from other crates,
//! such as cudarc's, through an adapter (see [`DeviceBuffer`] and
//! `examples/cudarc_adapter.rs`). A stream is a raw `cudaStream_t`/`CUstream`
//! (`*mut c_void`; cudarc's is `stream.cu_stream().cast()`).
//!
//! # Overview
//!
//! - [`Handle`]: the library bound to one GPU; [`Handle::workspace_size`],
//!   [`Handle::forward`], [`Handle::merge_states`],
//!   [`Handle::backward_workspace_size`] and [`Handle::backward`].
//! - [`ForwardParams`]: shapes, options and buffers of one call, made and
//!   validated by [`ForwardParamsBuilder`]; [`DType`] for the element types
//!   and [`DescaleStrides`] for where the descale factors of fp8 tensors are.
//! - [`BackwardParams`]: the same for the gradients of a forward call (its
//!   inputs, out, lse and dout in; dq, dk and dv out), made and validated by
//!   [`BackwardParamsBuilder`].
//! - [`MergeParams`]: partial results (out and lse of attention over parts
//!   of the keys) and where their merge goes, made by [`MergeParamsBuilder`].
//! - [`Error`]: a [`Status`] and the library's explanation.
//! - [`supported_head_dims`]: the (head_dim, head_dim_v) pairs this build of
//!   the library has kernels for.
//!
//! # Example
//!
//! ```no_run
//! use flashcore::{DeviceBuffer, ForwardParams, Handle, Layout};
//!
//! // Any device buffer type: implement DeviceBuffer for yours (or adapt a
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

// First: its setters! macro serves the other builders.
#[macro_use]
mod params;
mod backward;
mod buffer;
mod error;
mod handle;
mod merge;

pub use backward::{BackwardParams, BackwardParamsBuilder, BackwardTensor};
pub use buffer::{DeviceBuffer, RawBuffer};
pub use error::{Error, Result, Status};
pub use handle::Handle;
pub use merge::{MergeParams, MergeParamsBuilder, StateStrides};
pub use params::{DType, DescaleStrides, ForwardParams, ForwardParamsBuilder, Layout, Strides, Tensor};

/// The raw C API (`flashcore-sys`), for what this crate does not wrap.
pub use flashcore_sys as sys;

/// Alignment in bytes that q, k, v, out and the workspace must have (and
/// dout, dq, dk and dv of a backward call), and that every stride must be a
/// multiple of (in bytes).
pub const ALIGNMENT: usize = sys::FLASHCORE_ALIGNMENT as usize;

/// The largest [`num_splits`](ForwardParamsBuilder::num_splits) a forward
/// call may ask for.
pub const MAX_NUM_SPLITS: i32 = sys::FLASHCORE_MAX_NUM_SPLITS as i32;

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

/// The CUDA runtime linked into the loaded library, as CUDA writes versions
/// (`1000 * major + 10 * minor`: 12040 for a CUDA 12.4 build, 13000 for
/// 13.0). It runs on an NVIDIA driver for CUDA `major.0` or newer: 525.60.13
/// and later for a CUDA 12 build, 580.65.06 and later for a CUDA 13 build.
///
/// ```
/// assert!(flashcore::cuda_runtime_version() >= 12040);
/// ```
pub fn cuda_runtime_version() -> i32 {
    // SAFETY: no arguments, no preconditions.
    unsafe { sys::flashcore_cuda_runtime_version() }
}

/// The `(head_dim, head_dim_v)` pairs this build of the library has kernels
/// of its own for (`flashcore_supported_head_dims`), in increasing order; the
/// default build has (32, 32), (64, 64), (96, 96), (128, 128), (192, 128),
/// (256, 256), (512, 512) and (576, 512) (DeepSeek MLA's latent cache, whose
/// v must be k's view: the header's `head_dim_v`).
///
/// Other head dims run too: a call's head_dim and head_dim_v, both multiples
/// of 8, run on the first listed pair whose dims are both at least theirs
/// (head_dim 80 on (96, 96)); one that no listed pair covers fails with
/// [`Status::Unsupported`].
///
/// ```
/// let pairs = flashcore::supported_head_dims()?;
/// assert!(!pairs.is_empty());
/// for (head_dim, head_dim_v) in pairs {
///     println!("kernel for head_dim {head_dim}, head_dim_v {head_dim_v}");
/// }
/// # Ok::<(), flashcore::Error>(())
/// ```
pub fn supported_head_dims() -> Result<Vec<(i32, i32)>> {
    let mut count = 0;
    // SAFETY: capacity 0 with null arrays only writes the count.
    error::check(unsafe {
        sys::flashcore_supported_head_dims(std::ptr::null_mut(), std::ptr::null_mut(), 0, &mut count)
    })?;
    let (mut dims, mut dims_v) = (vec![0; count], vec![0; count]);
    // SAFETY: both arrays hold `count` elements, the capacity passed.
    error::check(unsafe {
        sys::flashcore_supported_head_dims(dims.as_mut_ptr(), dims_v.as_mut_ptr(), count, &mut count)
    })?;
    Ok(dims.into_iter().zip(dims_v).take(count).collect())
}

#[cfg(test)]
mod tests {
    #[test]
    fn handle_is_send_and_sync() {
        fn shareable<T: Send + Sync>() {}
        shareable::<crate::Handle>();
    }

    #[test]
    fn supported_head_dims_are_sorted_multiples_of_8() {
        let pairs = crate::supported_head_dims().expect("the query cannot fail");
        assert!(!pairs.is_empty());
        assert!(pairs.windows(2).all(|w| w[0] < w[1]), "{pairs:?}");
        assert!(pairs.iter().all(|&(d, dv)| d >= 8 && dv >= 8 && d % 8 == 0 && dv % 8 == 0), "{pairs:?}");
    }

    #[test]
    fn version_string_matches_number() {
        let n = crate::version_number();
        assert_eq!(crate::version(), format!("{}.{}.{}", n / 10000, n / 100 % 100, n % 100));
    }

    #[test]
    fn cuda_runtime_is_12_or_13() {
        let v = crate::cuda_runtime_version();
        assert!((12040..14000).contains(&v), "{v}");
    }
}
