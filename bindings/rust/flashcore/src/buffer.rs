//! The device-memory trait that lets any allocator's buffers reach flashcore.

/// A range of CUDA device memory that flashcore can read or write.
///
/// flashcore allocates nothing itself: q, k, v, out, lse, the gradients and
/// the workspaces come from the caller, as device addresses. Three ways in:
///
/// - **Raw pointers**: wrap the address and length in a [`RawBuffer`] (a
///   `CUdeviceptr`, or a `cudaMalloc` pointer cast with `as u64`). A bare
///   `*mut T` is not a `DeviceBuffer`: it has no length, and the builder
///   checks every tensor against its buffer's length.
/// - **Your own buffer type**: implement this trait for it, as below.
/// - **Another crate's type** (cudarc's `CudaSlice`, a candle or tch
///   tensor's storage): Rust's orphan rule forbids implementing this trait
///   for it in your crate, so adapt it with a type of your own, made for
///   the call, that holds the address and length, and whatever must live
///   until the call is queued. cudarc (0.17 and later) hands out an address
///   only for work on a given stream, with a `SyncOnDrop` guard to drop once
///   that work is queued: keep the guard in the adapter, which the params
///   borrow until [`Handle::forward`](crate::Handle::forward) has returned.
///   `examples/cudarc_adapter.rs` is that adapter, complete; it passes the
///   stream as `stream.cu_stream().cast()`.
///
/// Implementing the trait is safe: the addresses are only handed to the GPU
/// by [`Handle::forward`](crate::Handle::forward),
/// [`Handle::merge_states`](crate::Handle::merge_states) and
/// [`Handle::backward`](crate::Handle::backward), which are `unsafe` and
/// whose callers promise that they are valid.
///
/// ```
/// use flashcore::DeviceBuffer;
///
/// /// Memory from some CUDA allocator (cuMemAlloc, cudaMalloc, a pool...).
/// struct MyDeviceMemory {
///     address: u64,
///     bytes: usize,
/// }
///
/// impl DeviceBuffer for MyDeviceMemory {
///     fn device_ptr(&self) -> u64 {
///         self.address
///     }
///     fn byte_len(&self) -> usize {
///         self.bytes
///     }
/// }
/// # let memory = MyDeviceMemory { address: 0x7000_0000, bytes: 4096 };
/// # assert_eq!((memory.device_ptr(), memory.byte_len()), (0x7000_0000, 4096));
/// ```
pub trait DeviceBuffer {
    /// The device address of the buffer's first byte: a `CUdeviceptr`, or a
    /// `cudaMalloc` pointer cast to `u64`. It must be
    /// [`ALIGNMENT`](crate::ALIGNMENT)-byte aligned for q, k, v, out, the
    /// gradients and the workspace (4-byte for lse and the i32 arrays).
    fn device_ptr(&self) -> u64;

    /// How many bytes, from [`device_ptr`](DeviceBuffer::device_ptr) on, the
    /// buffer owns. The builder checks that each tensor fits in its buffer.
    fn byte_len(&self) -> usize;
}

/// A bare device address and length: flashcore on raw device pointers, or
/// on memory that has no buffer type of its own (a part of a larger
/// allocation, an address from another library).
///
/// ```
/// use flashcore::{DeviceBuffer, RawBuffer};
/// use std::ffi::c_void;
///
/// // A `CUdeviceptr` from cuMemAlloc is a u64 already.
/// let q = RawBuffer::new(0x7f00_0000_0000, 1 << 20);
/// assert_eq!((q.device_ptr(), q.byte_len()), (0x7f00_0000_0000, 1 << 20));
///
/// // A `void *` from cudaMalloc (or a tensor's data pointer), cast with `as u64`.
/// let from_cuda_malloc = 0x7f00_0010_0000 as *mut c_void;
/// let k = RawBuffer::new(from_cuda_malloc as u64, 1 << 20);
/// assert_eq!(k.device_ptr(), 0x7f00_0010_0000);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RawBuffer {
    ptr: u64,
    len: usize,
}

impl RawBuffer {
    /// `byte_len` bytes of device memory starting at device address `ptr`.
    pub const fn new(ptr: u64, byte_len: usize) -> RawBuffer {
        RawBuffer { ptr, len: byte_len }
    }
}

impl DeviceBuffer for RawBuffer {
    fn device_ptr(&self) -> u64 {
        self.ptr
    }

    fn byte_len(&self) -> usize {
        self.len
    }
}
