//! The device-memory trait that lets any allocator's buffers reach flashcore.

/// A range of CUDA device memory that flashcore can read or write.
///
/// flashcore allocates nothing itself: q, k, v, out, lse and the workspace
/// come from the caller, as device addresses. Implement this trait for your
/// own buffer type (a wrapper around a cudarc `CudaSlice`, a candle or tch
/// tensor's storage, memory from `cuMemAlloc`, ...) or wrap a bare address
/// in a [`RawBuffer`].
///
/// Implementing the trait is safe: the addresses are only handed to the GPU
/// by [`Handle::forward`](crate::Handle::forward), which is `unsafe` and whose
/// caller promises that they are valid.
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
    /// [`ALIGNMENT`](crate::ALIGNMENT)-byte aligned for q, k, v, out and the
    /// workspace (4-byte for lse).
    fn device_ptr(&self) -> u64;

    /// How many bytes, from [`device_ptr`](DeviceBuffer::device_ptr) on, the
    /// buffer owns. The builder checks that each tensor fits in its buffer.
    fn byte_len(&self) -> usize;
}

/// A bare device address and length, for memory that has no buffer type of
/// its own (or to call flashcore on raw device pointers).
///
/// ```
/// use flashcore::{DeviceBuffer, RawBuffer};
///
/// // e.g. a `CUdeviceptr` from cuMemAlloc, or `ptr as u64` from cudaMalloc.
/// let q = RawBuffer::new(0x7f00_0000_0000, 1 << 20);
/// assert_eq!(q.device_ptr(), 0x7f00_0000_0000);
/// assert_eq!(q.byte_len(), 1 << 20);
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
