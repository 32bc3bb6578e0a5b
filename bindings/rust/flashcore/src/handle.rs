//! The library handle.

use crate::backward::BackwardParams;
use crate::buffer::DeviceBuffer;
use crate::error::{check, Error, Result, Status};
use crate::merge::MergeParams;
use crate::params::ForwardParams;
use crate::sys;
use std::ffi::c_void;
use std::fmt;
use std::ptr::{self, NonNull};

/// A flashcore handle, bound to one CUDA device; destroyed on drop.
///
/// It caches what kernel dispatch needs (compute capability, multiprocessor
/// count, shared-memory limits), so create one per device and reuse it.
///
/// # Threads
///
/// `Handle` is [`Send`] and [`Sync`], exactly as `flashcore.h` allows: every
/// flashcore function may be called from several threads at once, and one
/// handle may be shared by threads calling `flashcore_forward`,
/// `flashcore_forward_workspace_size`, `flashcore_merge_states`,
/// `flashcore_backward_workspace_size` and `flashcore_backward` (the `&self`
/// methods here). The one
/// call that must not race with other uses, `flashcore_destroy`, runs in
/// [`Drop`], which Rust only allows once no reference remains.
///
/// # Example
///
/// Runs with or without a GPU:
///
/// ```
/// use flashcore::{Handle, Status};
///
/// match Handle::new() {
///     Ok(handle) => println!("flashcore on CUDA device {}", handle.device()?),
///     Err(err) if err.status() == Status::NoDevice => println!("no GPU here: {err}"),
///     Err(err) => return Err(err),
/// }
/// # Ok::<(), flashcore::Error>(())
/// ```
pub struct Handle {
    raw: NonNull<sys::flashcore_handle_s>,
}

// SAFETY: see "Threads" above; the handle has no thread affinity and its
// shared-use functions are documented as thread-safe.
unsafe impl Send for Handle {}
// SAFETY: as above.
unsafe impl Sync for Handle {}

impl Handle {
    /// Creates a handle for the CUDA device current on this thread (device 0
    /// if none was set).
    ///
    /// Fails with [`Status::NoDevice`] when no device or driver is present
    /// and [`Status::Unsupported`] for GPUs older than sm_80.
    pub fn new() -> Result<Handle> {
        // SAFETY: `out` is a valid place for the handle.
        Handle::create(|out| unsafe { sys::flashcore_create(out) })
    }

    /// Creates a handle for the CUDA device with ordinal `device`.
    ///
    /// ```
    /// # use flashcore::Handle;
    /// assert!(Handle::for_device(-1).is_err());
    /// ```
    pub fn for_device(device: i32) -> Result<Handle> {
        // SAFETY: as in `new`.
        Handle::create(|out| unsafe { sys::flashcore_create_for_device(out, device) })
    }

    fn create(create: impl FnOnce(*mut sys::flashcore_handle) -> sys::flashcore_status) -> Result<Handle> {
        let mut raw = ptr::null_mut();
        check(create(&mut raw))?;
        match NonNull::new(raw) {
            Some(raw) => Ok(Handle { raw }),
            None => Err(Error::new(Status::Internal, "flashcore_create succeeded but returned a NULL handle")),
        }
    }

    /// The CUDA device ordinal the handle is bound to.
    pub fn device(&self) -> Result<i32> {
        let mut device = -1;
        // SAFETY: live handle, valid out-pointer.
        check(unsafe { sys::flashcore_handle_device(self.as_raw(), &mut device) })?;
        Ok(device)
    }

    /// The C handle, for calling `flashcore-sys` directly. It stays owned by
    /// `self`: do not destroy it.
    pub fn as_raw(&self) -> sys::flashcore_handle {
        self.raw.as_ptr()
    }

    /// Bytes of device workspace [`forward`](Handle::forward) needs for
    /// `params` on this handle's device: 0 unless the call splits its keys
    /// ([`ForwardParamsBuilder::num_splits`](crate::ForwardParamsBuilder::num_splits);
    /// with the default, the library decides, so ask). Depends only on
    /// shapes, dtype, kv_dtype, causal, the window and num_splits (not on pointers,
    /// strides, the softmax scale or the softcap), so one allocation serves
    /// every call of that shape on this device, CUDA graph replays included.
    pub fn workspace_size(&self, params: &ForwardParams<'_>) -> Result<usize> {
        let mut bytes = 0;
        // SAFETY: live handle, valid params and out-pointer.
        check(unsafe { sys::flashcore_forward_workspace_size(self.as_raw(), params.as_raw(), &mut bytes) })?;
        Ok(bytes)
    }

    /// Queues `out = softmax(cap(scale · Q·Kᵀ) [+ causal/window mask]) · V`
    /// on `stream` (cap: the [softcap](crate::ForwardParamsBuilder::softcap),
    /// if any) and returns without waiting.
    ///
    /// `workspace` must hold at least [`workspace_size`](Handle::workspace_size)
    /// bytes ([`Status::WorkspaceTooSmall`] otherwise) and be
    /// [`ALIGNMENT`](crate::ALIGNMENT)-byte aligned ([`Status::Misaligned`]);
    /// `None` is fine when that size is 0 (otherwise it is
    /// [`Status::WorkspaceTooSmall`], and a buffer at address 0
    /// [`Status::InvalidArgument`]). Its contents do not matter. `stream` is
    /// a `cudaStream_t` (equivalently a `CUstream`, such as cudarc's
    /// `stream.cu_stream().cast()`) of the handle's device, or null for the
    /// legacy default stream. The call uses the handle's device whatever
    /// device is current, and results are bitwise deterministic.
    ///
    /// # Safety
    ///
    /// flashcore cannot check device memory or streams, and the work runs
    /// after this call returns. The caller promises that:
    /// - every buffer given to the params and `workspace` is device memory
    ///   usable from the handle's device, holding at least its
    ///   [`byte_len`](DeviceBuffer::byte_len) bytes at its
    ///   [`device_ptr`](DeviceBuffer::device_ptr);
    /// - those buffers stay allocated until the queued work has completed
    ///   (synchronize `stream`, or order later work after it), the inputs (q,
    ///   k, v and any seqused_k, cu_seqlens, block_table, q_descale,
    ///   k_descale or v_descale) are not written,
    ///   and out, lse and the workspace not otherwise used, until then;
    /// - `stream` is null or a live stream of the handle's device.
    ///
    /// # Example
    ///
    /// ```no_run
    /// use flashcore::{DeviceBuffer, ForwardParams, Handle, RawBuffer};
    /// # fn device_alloc(bytes: usize) -> RawBuffer { unimplemented!() }
    /// # fn synchronize(stream: *mut std::ffi::c_void) {}
    ///
    /// let handle = Handle::new()?;
    /// let bytes = 8 * 1024 * 128 * 2; // [1, 8, 1024, 128] bf16
    /// let (q, k, v) = (device_alloc(bytes), device_alloc(bytes), device_alloc(bytes));
    /// let mut out = device_alloc(bytes);
    /// let params = ForwardParams::builder()
    ///     .dtype(flashcore::DType::BF16)
    ///     .batch_size(1)
    ///     .num_heads_q(8)
    ///     .num_heads_kv(8)
    ///     .seqlen_q(1024)
    ///     .seqlen_k(1024)
    ///     .head_dim(128)
    ///     .causal(true)
    ///     .q(&q)
    ///     .k(&k)
    ///     .v(&v)
    ///     .out(&mut out)
    ///     .build()?;
    /// let mut workspace = device_alloc(handle.workspace_size(&params)?);
    /// let stream = std::ptr::null_mut(); // the default stream
    /// // SAFETY: the buffers are live device allocations of the stated sizes
    /// // and are kept until the stream is synchronized below.
    /// unsafe { handle.forward(&params, Some(&mut workspace), stream)? };
    /// synchronize(stream);
    /// # Ok::<(), flashcore::Error>(())
    /// ```
    pub unsafe fn forward(
        &self,
        params: &ForwardParams<'_>,
        workspace: Option<&mut dyn DeviceBuffer>,
        stream: *mut c_void,
    ) -> Result<()> {
        let (workspace, workspace_bytes) = match workspace {
            Some(buffer) => (buffer.device_ptr() as usize as *mut c_void, buffer.byte_len()),
            None => (ptr::null_mut(), 0),
        };
        check(sys::flashcore_forward(self.as_raw(), params.as_raw(), workspace, workspace_bytes, stream))
    }

    /// Queues the merge of partial attention results described by `params`
    /// (`lse = ln Σₛ exp(lseₛ)`, `out = Σₛ exp(lseₛ − lse) · outₛ`, see
    /// [`MergeParams`]) on `stream` and returns without waiting.
    ///
    /// Needs no workspace. `stream` is as for [`forward`](Handle::forward);
    /// the call uses the handle's device, can be captured into a CUDA graph
    /// and is bitwise deterministic. The library validates the params here
    /// (sizes >= 1, dtypes, head_dim a multiple of 8, alignment, strides,
    /// overlaps): a call it refuses queues nothing and returns its status
    /// with the library's message.
    ///
    /// # Safety
    ///
    /// As for [`forward`](Handle::forward): every buffer given to the params
    /// is device memory usable from the handle's device, holding at least its
    /// [`byte_len`](DeviceBuffer::byte_len) bytes; the buffers stay allocated,
    /// the partials unwritten and out and lse otherwise unused, until the
    /// queued work has completed; `stream` is null or a live stream of the
    /// handle's device.
    ///
    /// # Example
    ///
    /// Attention over a shared prefix and over a request's own keys, each
    /// computed by [`forward`](Handle::forward) into one slot of the
    /// partial buffers, then merged:
    ///
    /// ```no_run
    /// use flashcore::{DType, MergeParams, Handle, RawBuffer};
    /// # fn device_alloc(bytes: usize) -> RawBuffer { unimplemented!() }
    /// # fn synchronize(stream: *mut std::ffi::c_void) {}
    ///
    /// let handle = Handle::new()?;
    /// let (batch, heads, seqlen, head_dim) = (1, 32, 16, 128);
    /// let rows = batch * heads * seqlen;
    /// // [2, B, H, S, D] bf16 partial outputs and [2, B, H, S] f32 lse, written by two forward calls.
    /// let (partial_out, partial_lse) = (device_alloc(2 * rows * head_dim * 2), device_alloc(2 * rows * 4));
    /// let (mut out, mut lse) = (device_alloc(rows * head_dim * 2), device_alloc(rows * 4));
    /// let params = MergeParams::builder()
    ///     .num_states(2)
    ///     .batch_size(batch as i32)
    ///     .num_heads(heads as i32)
    ///     .seqlen(seqlen as i32)
    ///     .head_dim(head_dim as i32)
    ///     .partial_dtype(DType::BF16)
    ///     .partial_out(&partial_out)
    ///     .partial_lse(&partial_lse)
    ///     .out(&mut out)
    ///     .lse(&mut lse)
    ///     .build()?;
    /// let stream = std::ptr::null_mut(); // the default stream
    /// // SAFETY: live device allocations of the stated sizes, kept until the
    /// // stream is synchronized below.
    /// unsafe { handle.merge_states(&params, stream)? };
    /// synchronize(stream);
    /// # Ok::<(), flashcore::Error>(())
    /// ```
    pub unsafe fn merge_states(&self, params: &MergeParams<'_>, stream: *mut c_void) -> Result<()> {
        check(sys::flashcore_merge_states(self.as_raw(), params.as_raw(), stream))
    }

    /// Bytes of device workspace [`backward`](Handle::backward) needs for
    /// `params`: the fp32 dQ accumulator, 4 · num_heads_q · head_dim bytes
    /// per query row (rows: batch_size · seqlen_q, or total_seqlen_q with
    /// [`varlen_q`](crate::BackwardParamsBuilder::varlen_q)), rounded up to
    /// [`ALIGNMENT`](crate::ALIGNMENT); 0 for an empty call. Depends only on
    /// the shapes (not on pointers, strides or options), so one allocation
    /// serves every call of those shapes, CUDA graph replays included.
    pub fn backward_workspace_size(&self, params: &BackwardParams<'_>) -> Result<usize> {
        let mut bytes = 0;
        // SAFETY: live handle, valid params and out-pointer.
        check(unsafe { sys::flashcore_backward_workspace_size(self.as_raw(), params.as_raw(), &mut bytes) })?;
        Ok(bytes)
    }

    /// Queues the gradients of attention (dq, dk and dv, see
    /// [`BackwardParams`]) on `stream` and returns without waiting: three
    /// kernels (the row sums of dO ∘ O, the main kernel over blocks of keys,
    /// dq's conversion), P recomputed from q, k and the forward's lse, nothing
    /// of size seqlen_q × seqlen_k stored.
    ///
    /// `workspace` must hold at least
    /// [`backward_workspace_size`](Handle::backward_workspace_size) bytes
    /// ([`Status::WorkspaceTooSmall`] otherwise) and be
    /// [`ALIGNMENT`](crate::ALIGNMENT)-byte aligned ([`Status::Misaligned`]);
    /// `None` is fine when that size is 0 (an empty call). Its contents do
    /// not matter.
    /// `stream` is as for [`forward`](Handle::forward); the call uses the
    /// handle's device whatever device is current and can be captured into a
    /// CUDA graph. dk and dv are bitwise deterministic; dq is too with
    /// [`deterministic`](crate::BackwardParamsBuilder::deterministic), and
    /// may otherwise differ in its last bits between runs. Bad parameters
    /// return a status having queued nothing.
    ///
    /// # Safety
    ///
    /// As for [`forward`](Handle::forward): every buffer given to the params
    /// and `workspace` is device memory usable from the handle's device,
    /// holding at least its [`byte_len`](DeviceBuffer::byte_len) bytes; the
    /// buffers stay allocated, the inputs (q, k, v, out, dout, lse and any
    /// seqused_k or cu_seqlens) unwritten, and dq, dk, dv and the workspace
    /// otherwise unused, until the queued work has completed; `stream` is
    /// null or a live stream of the handle's device.
    ///
    /// # Example
    ///
    /// A forward call that keeps its lse, then the backward call with the
    /// gradient of the loss with respect to its output:
    ///
    /// ```no_run
    /// use flashcore::{BackwardParams, ForwardParams, Handle, RawBuffer};
    /// # fn device_alloc(bytes: usize) -> RawBuffer { unimplemented!() }
    /// # fn synchronize(stream: *mut std::ffi::c_void) {}
    ///
    /// let handle = Handle::new()?;
    /// let (heads, seqlen, head_dim) = (8, 1024, 128);
    /// let bytes = heads * seqlen * head_dim * 2; // [1, 8, 1024, 128] bf16
    /// let (q, k, v) = (device_alloc(bytes), device_alloc(bytes), device_alloc(bytes));
    /// let (mut out, mut lse) = (device_alloc(bytes), device_alloc(heads * seqlen * 4));
    /// let stream = std::ptr::null_mut(); // the default stream
    /// let forward = ForwardParams::builder()
    ///     .dtype(flashcore::DType::BF16)
    ///     .batch_size(1)
    ///     .num_heads_q(heads as i32)
    ///     .num_heads_kv(heads as i32)
    ///     .seqlen_q(seqlen as i32)
    ///     .seqlen_k(seqlen as i32)
    ///     .head_dim(head_dim as i32)
    ///     .causal(true)
    ///     .q(&q)
    ///     .k(&k)
    ///     .v(&v)
    ///     .out(&mut out)
    ///     .lse(&mut lse)
    ///     .build()?;
    /// let mut workspace = device_alloc(handle.workspace_size(&forward)?);
    /// // SAFETY: live device allocations of the stated sizes, kept until the
    /// // stream is synchronized below.
    /// unsafe { handle.forward(&forward, Some(&mut workspace), stream)? };
    /// drop(forward); // releases out and lse for the backward call to read
    ///
    /// let dout = device_alloc(bytes); // filled by the layers after attention
    /// let (mut dq, mut dk, mut dv) = (device_alloc(bytes), device_alloc(bytes), device_alloc(bytes));
    /// let backward = BackwardParams::builder()
    ///     .dtype(flashcore::DType::BF16) // the same options as the forward call
    ///     .batch_size(1)
    ///     .num_heads_q(heads as i32)
    ///     .num_heads_kv(heads as i32)
    ///     .seqlen_q(seqlen as i32)
    ///     .seqlen_k(seqlen as i32)
    ///     .head_dim(head_dim as i32)
    ///     .causal(true)
    ///     .q(&q)
    ///     .k(&k)
    ///     .v(&v)
    ///     .out(&out)
    ///     .dout(&dout)
    ///     .lse(&lse)
    ///     .dq(&mut dq)
    ///     .dk(&mut dk)
    ///     .dv(&mut dv)
    ///     .build()?;
    /// let mut workspace = device_alloc(handle.backward_workspace_size(&backward)?);
    /// // SAFETY: as above.
    /// unsafe { handle.backward(&backward, Some(&mut workspace), stream)? };
    /// synchronize(stream);
    /// # Ok::<(), flashcore::Error>(())
    /// ```
    pub unsafe fn backward(
        &self,
        params: &BackwardParams<'_>,
        workspace: Option<&mut dyn DeviceBuffer>,
        stream: *mut c_void,
    ) -> Result<()> {
        let (workspace, workspace_bytes) = match workspace {
            Some(buffer) => (buffer.device_ptr() as usize as *mut c_void, buffer.byte_len()),
            None => (ptr::null_mut(), 0),
        };
        check(sys::flashcore_backward(self.as_raw(), params.as_raw(), workspace, workspace_bytes, stream))
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: the handle is live and no reference to it remains. Destroying
        // a valid handle has no failure the caller could act on.
        unsafe { sys::flashcore_destroy(self.as_raw()) };
    }
}

impl fmt::Debug for Handle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Handle").field(&self.raw).finish()
    }
}
