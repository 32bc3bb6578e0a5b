//! Backward attention (the gradients dq, dk and dv, for training):
//! parameters and their builder.

use crate::buffer::{DeviceBuffer, RawBuffer};
use crate::error::{check, Result};
use crate::params::{device_address, ensure_fits, tensor_extent, DType, Layout, Missing, Strides};
use crate::sys;
use std::marker::PhantomData;

/// One of the eight strided tensors of a backward call: the forward's q, k,
/// v and out, the gradient of the loss with respect to out (dout), and the
/// gradients written (dq, dk, dv).
///
/// The shapes below are the dense ones; with
/// [`BackwardParamsBuilder::varlen_q`] the tensors of the queries' rows (q,
/// out, dout, dq) are packed `[total_seqlen_q, num_heads_q, dim]`, and with
/// [`BackwardParamsBuilder::varlen_k`] those of the keys' rows (k, v, dk,
/// dv) `[total_seqlen_k, num_heads_kv, dim]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BackwardTensor {
    /// Queries, `[batch_size, num_heads_q, seqlen_q, head_dim]`.
    Q,
    /// Keys, `[batch_size, num_heads_kv, seqlen_k, head_dim]`.
    K,
    /// Values, `[batch_size, num_heads_kv, seqlen_k, head_dim_v]`.
    V,
    /// The forward's output, `[batch_size, num_heads_q, seqlen_q, head_dim_v]`.
    Out,
    /// The gradient of the loss with respect to out, shaped as out.
    DOut,
    /// The gradient with respect to q (written), shaped as q.
    DQ,
    /// The gradient with respect to k (written), shaped as k.
    DK,
    /// The gradient with respect to v (written), shaped as v.
    DV,
}

const TENSORS: [BackwardTensor; 8] = [
    BackwardTensor::Q,
    BackwardTensor::K,
    BackwardTensor::V,
    BackwardTensor::Out,
    BackwardTensor::DOut,
    BackwardTensor::DQ,
    BackwardTensor::DK,
    BackwardTensor::DV,
];

/// Which rows a tensor has, and which head dim is its width.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Rows {
    /// num_heads_q heads of seqlen_q (or total_seqlen_q) rows.
    Queries,
    /// num_heads_kv heads of seqlen_k (or total_seqlen_k) rows.
    Keys,
}

impl BackwardTensor {
    fn name(self) -> &'static str {
        match self {
            BackwardTensor::Q => "q",
            BackwardTensor::K => "k",
            BackwardTensor::V => "v",
            BackwardTensor::Out => "out",
            BackwardTensor::DOut => "dout",
            BackwardTensor::DQ => "dq",
            BackwardTensor::DK => "dk",
            BackwardTensor::DV => "dv",
        }
    }

    fn rows(self) -> Rows {
        match self {
            BackwardTensor::Q | BackwardTensor::Out | BackwardTensor::DOut | BackwardTensor::DQ => Rows::Queries,
            BackwardTensor::K | BackwardTensor::V | BackwardTensor::DK | BackwardTensor::DV => Rows::Keys,
        }
    }

    /// Whether its rows are head_dim_v wide (v, out and their gradients)
    /// rather than head_dim (q, k and theirs).
    fn is_value_width(self) -> bool {
        matches!(self, BackwardTensor::V | BackwardTensor::Out | BackwardTensor::DOut | BackwardTensor::DV)
    }
}

/// The three stride fields of `tensor` in the C struct, in [`Strides`] order.
fn stride_fields(raw: &mut sys::flashcore_backward_params, tensor: BackwardTensor) -> [&mut i64; 3] {
    match tensor {
        BackwardTensor::Q => [&mut raw.q_batch_stride, &mut raw.q_seq_stride, &mut raw.q_head_stride],
        BackwardTensor::K => [&mut raw.k_batch_stride, &mut raw.k_seq_stride, &mut raw.k_head_stride],
        BackwardTensor::V => [&mut raw.v_batch_stride, &mut raw.v_seq_stride, &mut raw.v_head_stride],
        BackwardTensor::Out => [&mut raw.out_batch_stride, &mut raw.out_seq_stride, &mut raw.out_head_stride],
        BackwardTensor::DOut => [&mut raw.dout_batch_stride, &mut raw.dout_seq_stride, &mut raw.dout_head_stride],
        BackwardTensor::DQ => [&mut raw.dq_batch_stride, &mut raw.dq_seq_stride, &mut raw.dq_head_stride],
        BackwardTensor::DK => [&mut raw.dk_batch_stride, &mut raw.dk_seq_stride, &mut raw.dk_head_stride],
        BackwardTensor::DV => [&mut raw.dv_batch_stride, &mut raw.dv_seq_stride, &mut raw.dv_head_stride],
    }
}

/// A backward params struct holding the library's defaults
/// (`flashcore_backward_params_init`).
fn init_raw() -> Result<sys::flashcore_backward_params> {
    // SAFETY: the struct holds only integers, floats and raw pointers, for
    // which all-zero bytes are valid values; init writes exactly its size.
    let mut raw: sys::flashcore_backward_params = unsafe { std::mem::zeroed() };
    check(unsafe { sys::flashcore_backward_params_init(&mut raw, std::mem::size_of_val(&raw)) })?;
    Ok(raw)
}

/// A validated description of one backward call: the gradients of
/// attention with respect to q, k and v, given the forward's inputs, its
/// output and log-sum-exp, and the gradient of the loss with respect to its
/// output. Ready for [`Handle::backward_workspace_size`] and
/// [`Handle::backward`].
///
/// ```text
/// P  = exp(cap(softmax_scale · Q·Kᵀ) [masked] − lse)        (recomputed, never stored)
/// dV = Pᵀ·dO    dP = dO·Vᵀ    dS = P ∘ (dP − rowsum(dO ∘ O))
/// dQ = softmax_scale · dS·K    dK = softmax_scale · dSᵀ·Q
/// ```
///
/// (with a softcap, dS is multiplied by the derivative of the cap first;
/// with grouped-query heads, dK and dV sum over the query heads sharing each
/// key/value head; with learnable sinks, P is recomputed with the sink in
/// its denominator, and the sinks' gradient is
/// `dsinks[h] = −Σ over h's rows of exp(sinks[h] − lse) · rowsum(dO ∘ O)`).
/// The options must be those of the forward call that produced out and lse
/// (dtype, shapes, head_dim_v, softmax_scale, causal, window,
/// attention_chunk, softcap, sinks, varlen), since P is recomputed from
/// them.
///
/// Made by [`BackwardParams::builder`]. The params borrow their buffers for
/// `'a` (the inputs shared, dq, dk and dv exclusively), so a buffer cannot be
/// dropped or reused as another operand while the params exist.
///
/// [`Handle::backward_workspace_size`]: crate::Handle::backward_workspace_size
/// [`Handle::backward`]: crate::Handle::backward
///
/// ```
/// use flashcore::{BackwardParams, BackwardTensor, Layout, RawBuffer, Strides};
///
/// // Building validates without touching the GPU, so made-up (aligned)
/// // addresses do for this example; real ones come from a CUDA allocator.
/// let bytes = 8 * 512 * 64 * 2; // [1, 8, 512, 64] fp16
/// let buffer = |n: u64| RawBuffer::new(n << 24, bytes);
/// let (q, k, v, out, dout) = (buffer(1), buffer(2), buffer(3), buffer(4), buffer(5));
/// let lse = RawBuffer::new(6 << 24, 8 * 512 * 4); // [1, 8, 512] f32, from the forward
/// let (mut dq, mut dk, mut dv) = (buffer(7), buffer(8), buffer(9));
/// let params = BackwardParams::builder()
///     .batch_size(1)
///     .num_heads_q(8)
///     .num_heads_kv(8)
///     .seqlen_q(512)
///     .seqlen_k(512)
///     .head_dim(64)
///     .causal(true)
///     .layout(Layout::Bshd)
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
/// assert_eq!(params.strides(BackwardTensor::DQ), Strides { batch: 512 * 8 * 64, seq: 8 * 64, head: 64 });
/// # Ok::<(), flashcore::Error>(())
/// ```
///
/// The gradients stay borrowed while the params live:
///
/// ```compile_fail,E0503
/// use flashcore::{BackwardParams, RawBuffer};
/// let input = RawBuffer::new(0x10_0000, 1 << 20);
/// let mut dq = RawBuffer::new(0x20_0000, 1 << 20);
/// let params = BackwardParams::builder().q(&input).dq(&mut dq).build();
/// let copy = dq; // error: `dq` is mutably borrowed by `params`
/// drop(params);
/// ```
#[derive(Debug)]
pub struct BackwardParams<'a> {
    raw: sys::flashcore_backward_params,
    buffers: PhantomData<&'a mut ()>,
}

impl<'a> BackwardParams<'a> {
    /// Starts a builder with the C defaults: fp16, not causal, no window, no
    /// softcap, softmax scale 1/sqrt(head_dim), not deterministic, densely
    /// packed [`Layout::Bhsd`].
    pub fn builder() -> BackwardParamsBuilder<'a> {
        BackwardParamsBuilder::default()
    }

    /// The C struct, for calling `flashcore-sys` directly.
    pub fn as_raw(&self) -> &sys::flashcore_backward_params {
        &self.raw
    }

    /// The strides of `tensor`, as given or as derived from the layout.
    pub fn strides(&self, tensor: BackwardTensor) -> Strides {
        let mut raw = self.raw;
        let [batch, seq, head] = stride_fields(&mut raw, tensor);
        Strides { batch: *batch, seq: *seq, head: *head }
    }

    /// Head dimension of q and k (and dq and dk).
    pub fn head_dim(&self) -> i32 {
        self.raw.head_dim
    }

    /// Head dimension of v, out, dout and dv: the one given to
    /// [`BackwardParamsBuilder::head_dim_v`], else [`head_dim`](Self::head_dim).
    pub fn head_dim_v(&self) -> i32 {
        self.raw.head_dim_v
    }

    /// The sliding window `(left, right)` given to
    /// [`BackwardParamsBuilder::window`], or `None` without one.
    pub fn window(&self) -> Option<(i32, i32)> {
        (self.raw.use_window != 0).then_some((self.raw.window_left, self.raw.window_right))
    }

    /// The logit softcap: 0 for none (see [`BackwardParamsBuilder::softcap`]).
    pub fn softcap(&self) -> f32 {
        self.raw.softcap
    }

    /// Whether the call gives bitwise-identical gradients run after run (see
    /// [`BackwardParamsBuilder::deterministic`]).
    pub fn deterministic(&self) -> bool {
        self.raw.deterministic != 0
    }

    /// The forward call's chunk length: 0 for none (see
    /// [`BackwardParamsBuilder::attention_chunk`]).
    pub fn attention_chunk(&self) -> i32 {
        self.raw.attention_chunk
    }

    /// The SMs the call leaves to kernels on other streams: 0 for none (see
    /// [`BackwardParamsBuilder::sm_margin`]).
    pub fn sm_margin(&self) -> i32 {
        self.raw.sm_margin
    }

    /// Whether the call writes the sinks' gradient (see
    /// [`BackwardParamsBuilder::dsinks`]).
    pub fn computes_dsinks(&self) -> bool {
        !self.raw.dsinks.is_null()
    }

    /// Bytes from the start of `tensor`'s buffer to the end of its last element.
    fn extent(&self, tensor: BackwardTensor, element_size: usize) -> i128 {
        let raw = &self.raw;
        // Packed tensors are one batch of their total rows.
        let (heads, batches, seqlen) = match tensor.rows() {
            Rows::Queries if !raw.cu_seqlens_q.is_null() => (raw.num_heads_q, 1, raw.total_seqlen_q),
            Rows::Queries => (raw.num_heads_q, raw.batch_size, raw.seqlen_q),
            Rows::Keys if !raw.cu_seqlens_k.is_null() => (raw.num_heads_kv, 1, raw.total_seqlen_k),
            Rows::Keys => (raw.num_heads_kv, raw.batch_size, raw.seqlen_k),
        };
        let width = if tensor.is_value_width() { self.head_dim_v() } else { self.head_dim() };
        let strides = self.strides(tensor);
        tensor_extent(&[(batches, strides.batch), (seqlen, strides.seq), (heads, strides.head)], width, element_size)
    }
}

/// Setters of the device buffers the call reads, and of those it writes.
macro_rules! buffer_setters {
    ($($(#[$doc:meta])* $name:ident => $tensor:ident: $borrow:ty),* $(,)?) => {$(
        $(#[$doc])*
        pub fn $name<B: DeviceBuffer + ?Sized>(mut self, buffer: $borrow) -> Self {
            self.tensors[BackwardTensor::$tensor as usize] = Some(RawBuffer::new(buffer.device_ptr(), buffer.byte_len()));
            self
        }
    )*};
}

/// Builds [`BackwardParams`], mirroring the C validation.
///
/// [`build`](BackwardParamsBuilder::build) reports every required setting
/// that was never given, then fills the C struct and has the library
/// validate it (`flashcore_backward_check`: sizes, head dims, dtype, scale,
/// window, softcap, alignment, strides, and that dq, dk and dv overlap
/// nothing else), so errors carry the library's own messages; last it
/// checks that each tensor fits in its buffer, which only the Rust side can
/// see (except for an empty call, batch_size or num_heads_q 0, which the
/// library runs without reading or writing anything).
///
/// Required: the six sizes and q, k, v, out, dout, lse, dq, dk, dv.
/// Optional: [`head_dim_v`], [`dtype`], [`causal`], [`window`],
/// [`attention_chunk`], [`softcap`], [`sinks`] and their gradient
/// [`dsinks`], [`softmax_scale`], [`deterministic`], [`sm_margin`],
/// [`layout`] or [`strides`], [`seqused_k`], [`varlen_q`], [`varlen_k`].
///
/// [`attention_chunk`]: BackwardParamsBuilder::attention_chunk
/// [`sm_margin`]: BackwardParamsBuilder::sm_margin
/// [`sinks`]: BackwardParamsBuilder::sinks
/// [`dsinks`]: BackwardParamsBuilder::dsinks
/// [`head_dim_v`]: BackwardParamsBuilder::head_dim_v
/// [`dtype`]: BackwardParamsBuilder::dtype
/// [`causal`]: BackwardParamsBuilder::causal
/// [`window`]: BackwardParamsBuilder::window
/// [`softcap`]: BackwardParamsBuilder::softcap
/// [`softmax_scale`]: BackwardParamsBuilder::softmax_scale
/// [`deterministic`]: BackwardParamsBuilder::deterministic
/// [`layout`]: BackwardParamsBuilder::layout
/// [`strides`]: BackwardParamsBuilder::strides
/// [`seqused_k`]: BackwardParamsBuilder::seqused_k
/// [`varlen_q`]: BackwardParamsBuilder::varlen_q
/// [`varlen_k`]: BackwardParamsBuilder::varlen_k
///
/// ```
/// use flashcore::{BackwardParams, RawBuffer, Status};
///
/// let input = RawBuffer::new(0x10_0000, 1 << 20);
/// let mut dq = RawBuffer::new(0x20_0000, 1 << 20);
/// let err = BackwardParams::builder().dtype(flashcore::DType::BF16).q(&input).dq(&mut dq).build().unwrap_err();
/// assert_eq!(err.status(), Status::InvalidArgument);
/// assert_eq!(
///     err.message(),
///     "not set: batch_size, seqlen_q, seqlen_k, num_heads_q, num_heads_kv, head_dim, k, v, out, dout, lse, dk, dv"
/// );
/// ```
#[derive(Debug, Default)]
#[must_use = "a builder does nothing until build() is called"]
pub struct BackwardParamsBuilder<'a> {
    dtype: DType,
    batch_size: Option<i32>,
    seqlen_q: Option<i32>,
    seqlen_k: Option<i32>,
    num_heads_q: Option<i32>,
    num_heads_kv: Option<i32>,
    head_dim: Option<i32>,
    head_dim_v: Option<i32>,
    causal: bool,
    /// (left, right) bounds; `None`: no window.
    window: Option<(i32, i32)>,
    attention_chunk: i32,
    softcap: f32,
    softmax_scale: f32,
    deterministic: bool,
    sm_margin: i32,
    layout: Layout,
    strides: [Option<Strides>; 8],
    tensors: [Option<RawBuffer>; 8],
    lse: Option<RawBuffer>,
    /// The forward's f32 [num_heads_q] sink logits, and where their
    /// gradient is written; `None`: none.
    sinks: Option<RawBuffer>,
    dsinks: Option<RawBuffer>,
    seqused_k: Option<RawBuffer>,
    /// cu_seqlens_q and total_seqlen_q; `None`: the query rows are not packed.
    varlen_q: Option<(RawBuffer, i32)>,
    /// cu_seqlens_k and total_seqlen_k; `None`: the key rows are not packed.
    varlen_k: Option<(RawBuffer, i32)>,
    buffers: PhantomData<&'a mut ()>,
}

impl<'a> BackwardParamsBuilder<'a> {
    setters! {
        /// Batch size (required), as the forward call's.
        batch_size: i32 => Some;
        /// Query sequence length (required), as the forward call's.
        seqlen_q: i32 => Some;
        /// Key/value sequence length (required), as the forward call's.
        seqlen_k: i32 => Some;
        /// Query heads (required); a multiple of `num_heads_kv`.
        num_heads_q: i32 => Some;
        /// Key/value heads (required). Fewer than `num_heads_q` is
        /// grouped-query attention: dk and dv of key/value head g sum the
        /// gradients of the query heads that read it.
        num_heads_kv: i32 => Some;
        /// Head dimension of q and k (required), as the forward call's.
        head_dim: i32 => Some;
        /// Head dimension of v and out (optional; default `head_dim`, as is
        /// 0), as the forward call's.
        head_dim_v: i32 => Some;
        /// Element type of q, k, v, out, dout, dq, dk and dv (default
        /// [`DType::F16`]; F16 or BF16, and [`build`](Self::build) fails with
        /// [`Status::Unsupported`](crate::Status::Unsupported) for
        /// [`DType::F32`] and [`DType::F8E4M3`]: gradients through fp8
        /// queries or an fp8 KV cache are not computed).
        dtype: DType;
        /// The forward call's causal mask (default off). Rows of queries that
        /// see no key get dq = 0, and keys no query sees dk = dv = 0.
        causal: bool;
        /// The forward call's softmax scale: finite and > 0, or 0 (the
        /// default) for 1/sqrt(head_dim).
        softmax_scale: f32;
        /// The forward call's logit softcap (default 0: off); the gradient
        /// goes through the cap's tanh. Same rules as
        /// [`ForwardParamsBuilder::softcap`](crate::ForwardParamsBuilder::softcap).
        softcap: f32;
        /// Bitwise-identical dq, dk and dv from run to run for the same
        /// inputs (default off). The fp32 dQ accumulator's additions are then
        /// made in a fixed order, which costs some speed; without it they
        /// race, and dq may differ in its last bits between runs (dk and dv
        /// are deterministic either way).
        deterministic: bool;
        /// Derives all strides for densely packed tensors in `layout` (default
        /// [`Layout::Bhsd`]): dq like q, dk like k, dv like v, dout like out.
        /// [`strides`](Self::strides) overrides single tensors.
        layout: Layout;
        /// The forward call's chunk length (default 0: none); the rule is
        /// [`ForwardParamsBuilder::attention_chunk`](crate::ForwardParamsBuilder::attention_chunk)'s.
        /// Keys outside a row's chunk get no gradient from it.
        attention_chunk: i32;
        /// SMs the call leaves to kernels on other streams (default 0), as
        /// [`ForwardParamsBuilder::sm_margin`](crate::ForwardParamsBuilder::sm_margin):
        /// usually the forward call's. The backward's kernels are not
        /// persistent, so it bounds what assumes the whole GPU: the
        /// deterministic schedule that needs a head's key blocks resident
        /// together. Negative: [`Status::InvalidArgument`](crate::Status::InvalidArgument)
        /// from [`build`](Self::build).
        sm_margin: i32;
    }

    /// The forward call's learnable sinks (optional): device memory holding
    /// its `[num_heads_q]` f32 logits, 4-byte aligned, as
    /// [`ForwardParamsBuilder::sinks`](crate::ForwardParamsBuilder::sinks).
    /// Needed whenever the forward had them (P is recomputed with them),
    /// whether or not their gradient is asked for ([`dsinks`](Self::dsinks)).
    pub fn sinks<B: DeviceBuffer + ?Sized>(mut self, sinks: &'a B) -> Self {
        self.sinks = Some(RawBuffer::new(sinks.device_ptr(), sinks.byte_len()));
        self
    }

    /// Device memory the sinks' gradient is written to (optional; default:
    /// not computed): `[num_heads_q]` f32, 4-byte aligned, written, not
    /// accumulated: each head's sum over the batch and its rows,
    /// `dsinks[h] = −Σ exp(sinks[h] − lse) · rowsum(dO ∘ O)`. Needs
    /// [`sinks`](Self::sinks) (the library refuses it alone); bitwise the
    /// same from run to run in both modes. An output as dq, dk and dv are:
    /// it must overlap no other tensor.
    ///
    /// ```
    /// # use flashcore::{BackwardParams, RawBuffer};
    /// # let sinks = RawBuffer::new(0x1000, 8 * 4);
    /// # let mut dsinks = RawBuffer::new(0x2000, 8 * 4);
    /// let builder = BackwardParams::builder().num_heads_q(8).sinks(&sinks).dsinks(&mut dsinks);
    /// ```
    pub fn dsinks<B: DeviceBuffer + ?Sized>(mut self, dsinks: &'a mut B) -> Self {
        self.dsinks = Some(RawBuffer::new(dsinks.device_ptr(), dsinks.byte_len()));
        self
    }

    /// The forward call's sliding window `(left, right)` (default: none);
    /// the rule and the bounds are those of
    /// [`ForwardParamsBuilder::window`](crate::ForwardParamsBuilder::window).
    pub fn window(mut self, left: i32, right: i32) -> Self {
        self.window = Some((left, right));
        self
    }

    /// Explicit element strides for one tensor, replacing the ones derived
    /// from the layout (or packed for varlen). Each tensor has strides of
    /// its own: the gradients need not be laid out as their inputs.
    ///
    /// ```
    /// # use flashcore::{BackwardParams, BackwardTensor, Strides};
    /// // dq written into a [1, 128, 2, 64] (BSHD) view whose rows are padded to 256 elements.
    /// let builder = BackwardParams::builder().strides(BackwardTensor::DQ, Strides { batch: 128 * 256, seq: 256, head: 64 });
    /// ```
    pub fn strides(mut self, tensor: BackwardTensor, strides: Strides) -> Self {
        self.strides[tensor as usize] = Some(strides);
        self
    }

    buffer_setters! {
        /// Device memory holding the forward call's queries (required).
        q => Q: &'a B,
        /// Device memory holding the forward call's keys (required).
        k => K: &'a B,
        /// Device memory holding the forward call's values (required).
        v => V: &'a B,
        /// Device memory holding the forward call's output (required).
        out => Out: &'a B,
        /// Device memory holding the gradient of the loss with respect to out
        /// (required).
        dout => DOut: &'a B,
        /// Device memory dq is written to (required). It also serves the call
        /// as scratch between its kernels, so its contents before the call do
        /// not matter.
        dq => DQ: &'a mut B,
        /// Device memory dk is written to (required).
        dk => DK: &'a mut B,
        /// Device memory dv is written to (required).
        dv => DV: &'a mut B,
    }

    /// Device memory holding the forward call's log-sum-exp (required):
    /// `[batch_size, num_heads_q, seqlen_q]` f32, contiguous, as the forward
    /// wrote it through
    /// [`ForwardParamsBuilder::lse`](crate::ForwardParamsBuilder::lse);
    /// `[num_heads_q, total_seqlen_q]` with packed queries.
    pub fn lse<B: DeviceBuffer + ?Sized>(mut self, lse: &'a B) -> Self {
        self.lse = Some(RawBuffer::new(lse.device_ptr(), lse.byte_len()));
        self
    }

    /// The forward call's per-sequence key counts (optional): device memory
    /// holding `batch_size` i32 values, 4-byte aligned, as
    /// [`ForwardParamsBuilder::seqused_k`](crate::ForwardParamsBuilder::seqused_k).
    /// Keys past a sequence's count get dk = dv = 0.
    pub fn seqused_k<B: DeviceBuffer + ?Sized>(mut self, seqused_k: &'a B) -> Self {
        self.seqused_k = Some(RawBuffer::new(seqused_k.device_ptr(), seqused_k.byte_len()));
        self
    }

    /// Variable-length queries, as the forward call's
    /// [`ForwardParamsBuilder::varlen_q`](crate::ForwardParamsBuilder::varlen_q):
    /// q, out, dout and dq packed `[total_seqlen_q, num_heads_q,
    /// head_dim(_v)]` (dense packed strides whatever the layout, unless
    /// [`strides`](Self::strides) says otherwise), `batch_size + 1` i32
    /// prefix sums in device memory, [`seqlen_q`](Self::seqlen_q) the longest
    /// sequence, lse `[num_heads_q, total_seqlen_q]`. Rows of dq after the
    /// last sequence are not written.
    pub fn varlen_q<B: DeviceBuffer + ?Sized>(mut self, cu_seqlens_q: &'a B, total_seqlen_q: i32) -> Self {
        self.varlen_q = Some((RawBuffer::new(cu_seqlens_q.device_ptr(), cu_seqlens_q.byte_len()), total_seqlen_q));
        self
    }

    /// Variable-length keys: k, v, dk and dv packed `[total_seqlen_k,
    /// num_heads_kv, head_dim(_v)]`, as [`varlen_q`](Self::varlen_q) for the
    /// queries and the forward call's
    /// [`ForwardParamsBuilder::varlen_k`](crate::ForwardParamsBuilder::varlen_k).
    /// Rows of dk and dv after the last sequence are not written.
    pub fn varlen_k<B: DeviceBuffer + ?Sized>(mut self, cu_seqlens_k: &'a B, total_seqlen_k: i32) -> Self {
        self.varlen_k = Some((RawBuffer::new(cu_seqlens_k.device_ptr(), cu_seqlens_k.byte_len()), total_seqlen_k));
        self
    }

    /// Dense packed strides `[total, heads, dim]` of the packed tensors, in
    /// place of the layout's. Explicit [`strides`](Self::strides) are
    /// applied after.
    fn pack_strides(&self, raw: &mut sys::flashcore_backward_params) {
        let (hq, hkv) = (i64::from(raw.num_heads_q), i64::from(raw.num_heads_kv));
        let (d, dv) = (i64::from(raw.head_dim), i64::from(raw.head_dim_v));
        for tensor in TENSORS {
            let packed = match tensor.rows() {
                Rows::Queries => self.varlen_q.is_some(),
                Rows::Keys => self.varlen_k.is_some(),
            };
            if !packed {
                continue;
            }
            let heads = if tensor.rows() == Rows::Queries { hq } else { hkv };
            let width = if tensor.is_value_width() { dv } else { d };
            let [batch, seq, head] = stride_fields(raw, tensor);
            (*batch, *seq, *head) = (0, heads * width, width);
        }
    }

    /// Validates everything and returns the params; see the type's
    /// documentation for the order of checks. Touches no GPU.
    pub fn build(self) -> Result<BackwardParams<'a>> {
        let mut missing = Missing::default();
        let mut raw = init_raw()?;
        raw.batch_size = missing.size("batch_size", self.batch_size);
        raw.seqlen_q = missing.size("seqlen_q", self.seqlen_q);
        raw.seqlen_k = missing.size("seqlen_k", self.seqlen_k);
        raw.num_heads_q = missing.size("num_heads_q", self.num_heads_q);
        raw.num_heads_kv = missing.size("num_heads_kv", self.num_heads_kv);
        raw.head_dim = missing.size("head_dim", self.head_dim);
        // Stored resolved (0 means head_dim to the library too), so the
        // strides derived here and the extents need no special case for it.
        raw.head_dim_v = self.head_dim_v.filter(|&dv| dv != 0).unwrap_or(raw.head_dim);
        // In the order of the C struct: the inputs, lse, then the outputs.
        for (tensor, buffer) in TENSORS.iter().zip(&self.tensors).take(5) {
            missing.buffer(tensor.name(), buffer);
        }
        missing.buffer("lse", &self.lse);
        for (tensor, buffer) in TENSORS.iter().zip(&self.tensors).skip(5) {
            missing.buffer(tensor.name(), buffer);
        }
        missing.check()?;

        raw.dtype = self.dtype.to_raw();
        raw.causal = i32::from(self.causal);
        raw.softmax_scale = self.softmax_scale;
        if let Some((left, right)) = self.window {
            (raw.use_window, raw.window_left, raw.window_right) = (1, left, right);
        }
        raw.softcap = self.softcap;
        raw.attention_chunk = self.attention_chunk;
        raw.sm_margin = self.sm_margin;
        raw.deterministic = i32::from(self.deterministic);
        // SAFETY: `raw` is a valid params struct with its own struct_size.
        check(unsafe { sys::flashcore_backward_set_contiguous_strides(&mut raw, self.layout.to_raw()) })?;
        self.pack_strides(&mut raw);
        for (&tensor, strides) in TENSORS.iter().zip(&self.strides) {
            if let Some(strides) = strides {
                let [batch, seq, head] = stride_fields(&mut raw, tensor);
                (*batch, *seq, *head) = (strides.batch, strides.seq, strides.head);
            }
        }
        let [q, k, v, out, dout, dq, dk, dv] = self.tensors;
        (raw.q, raw.k, raw.v) = (device_address(q), device_address(k), device_address(v));
        (raw.out, raw.dout) = (device_address(out), device_address(dout));
        (raw.dq, raw.dk, raw.dv) = (device_address(dq), device_address(dk), device_address(dv));
        raw.lse = device_address(self.lse).cast();
        raw.sinks = device_address(self.sinks).cast();
        raw.dsinks = device_address(self.dsinks).cast();
        raw.seqused_k = device_address(self.seqused_k).cast();
        let int32s = |buffer: RawBuffer| device_address(Some(buffer)).cast();
        if let Some((cu_seqlens, total)) = self.varlen_q {
            (raw.cu_seqlens_q, raw.total_seqlen_q) = (int32s(cu_seqlens), total);
        }
        if let Some((cu_seqlens, total)) = self.varlen_k {
            (raw.cu_seqlens_k, raw.total_seqlen_k) = (int32s(cu_seqlens), total);
        }
        // SAFETY: reads the struct only.
        check(unsafe { sys::flashcore_backward_check(&raw) })?;

        let params = BackwardParams { raw, buffers: PhantomData };
        if raw.batch_size == 0 || raw.num_heads_q == 0 {
            // An empty call: the library reads and writes nothing.
            return Ok(params);
        }
        for (&tensor, buffer) in TENSORS.iter().zip(&self.tensors) {
            let buffer = buffer.as_ref().expect("checked above");
            ensure_fits(tensor.name(), params.extent(tensor, self.dtype.size_of()), buffer)?;
        }
        // [num_heads_q, total_seqlen_q] for packed queries.
        let lse_rows = match self.varlen_q {
            Some(_) => i128::from(raw.num_heads_q) * i128::from(raw.total_seqlen_q),
            None => i128::from(raw.batch_size) * i128::from(raw.num_heads_q) * i128::from(raw.seqlen_q),
        };
        let lse = self.lse.as_ref().expect("checked above");
        ensure_fits("lse", lse_rows * std::mem::size_of::<f32>() as i128, lse)?;
        let per_head = i128::from(raw.num_heads_q) * std::mem::size_of::<f32>() as i128;
        for (name, buffer) in [("sinks", &self.sinks), ("dsinks", &self.dsinks)] {
            if let Some(buffer) = buffer {
                ensure_fits(name, per_head, buffer)?;
            }
        }
        let int32_bytes = |count: i128| count * std::mem::size_of::<i32>() as i128;
        if let Some(seqused_k) = &self.seqused_k {
            ensure_fits("seqused_k", int32_bytes(i128::from(raw.batch_size)), seqused_k)?;
        }
        for (name, varlen) in [("cu_seqlens_q", &self.varlen_q), ("cu_seqlens_k", &self.varlen_k)] {
            if let Some((cu_seqlens, _)) = varlen {
                ensure_fits(name, int32_bytes(i128::from(raw.batch_size) + 1), cu_seqlens)?;
            }
        }
        Ok(params)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{Error, Status};

    // Standard test shape: grouped-query, seqlen_q != seqlen_k, head_dim_v
    // equal to head_dim unless a test says otherwise.
    const B: i64 = 2;
    const HQ: i64 = 4;
    const HKV: i64 = 2;
    const SQ: i64 = 128;
    const SK: i64 = 96;
    const D: i64 = 64;

    /// Made-up, aligned, disjoint device addresses (256 MiB apart, so that no
    /// two overlap), each exactly the size of its dense fp16 tensor: building
    /// never dereferences them. In [`TENSORS`] order.
    struct Buffers {
        tensors: [RawBuffer; 8],
        lse: RawBuffer,
    }

    /// The address of the `slot`th made-up buffer.
    fn address(slot: u64) -> u64 {
        (slot + 1) << 28
    }

    impl Buffers {
        /// Dense buffers for head dims `d` and `dv` over `q_rows` query and
        /// `k_rows` key rows per head.
        fn sized(d: i64, dv: i64, q_rows: i64, k_rows: i64, lse_rows: i64) -> Buffers {
            let tensors = TENSORS.map(|tensor| {
                let width = if tensor.is_value_width() { dv } else { d };
                let rows = match tensor.rows() {
                    Rows::Queries => HQ * q_rows,
                    Rows::Keys => HKV * k_rows,
                };
                RawBuffer::new(address(tensor as u64), (rows * width * 2) as usize)
            });
            Buffers { tensors, lse: RawBuffer::new(address(8), (HQ * lse_rows * 4) as usize) }
        }

        fn dense() -> Buffers {
            Buffers::sized(D, D, B * SQ, B * SK, B * SQ)
        }

        /// Packed buffers of `total_q` query and `total_k` key rows.
        fn packed(total_q: i64, total_k: i64) -> Buffers {
            Buffers::sized(D, D, total_q, total_k, total_q)
        }

        fn get(&self, tensor: BackwardTensor) -> RawBuffer {
            self.tensors[tensor as usize]
        }

        fn set(&mut self, tensor: BackwardTensor, buffer: RawBuffer) {
            self.tensors[tensor as usize] = buffer;
        }
    }

    /// The standard shape on `buffers`, every buffer given.
    fn standard(buffers: &mut Buffers) -> BackwardParamsBuilder<'_> {
        with_head_dims(D, None, buffers)
    }

    fn with_head_dims(d: i64, dv: Option<i64>, buffers: &mut Buffers) -> BackwardParamsBuilder<'_> {
        let [q, k, v, out, dout, dq, dk, dv_buffer] = &mut buffers.tensors;
        let builder = BackwardParams::builder()
            .batch_size(B as i32)
            .num_heads_q(HQ as i32)
            .num_heads_kv(HKV as i32)
            .seqlen_q(SQ as i32)
            .seqlen_k(SK as i32)
            .head_dim(d as i32)
            .q(q)
            .k(k)
            .v(v)
            .out(out)
            .dout(dout)
            .lse(&buffers.lse)
            .dq(dq)
            .dk(dk)
            .dv(dv_buffer);
        match dv {
            Some(dv) => builder.head_dim_v(dv as i32),
            None => builder,
        }
    }

    fn rejected(builder: BackwardParamsBuilder<'_>) -> Error {
        builder.build().expect_err("the builder accepted invalid params")
    }

    /// Whether this build of the library has a kernel at least (d, dv) wide;
    /// otherwise says that the test steps aside (a build for fewer head dims,
    /// -DFLASHCORE_HEAD_DIMS, as the forward's head_dim_v test does).
    fn has_kernel_for(d: i64, dv: i64) -> bool {
        let pairs = crate::supported_head_dims().expect("the library's head dims");
        let covered = pairs.iter().any(|&(kd, kdv)| i64::from(kd) >= d && i64::from(kdv) >= dv);
        if !covered {
            eprintln!("skipped: this build has no kernel covering head dims ({d}, {dv}): {pairs:?}");
        }
        covered
    }

    #[test]
    fn defaults_come_from_the_library() {
        let mut buffers = Buffers::dense();
        let params = standard(&mut buffers).build().expect("valid params");
        let raw = params.as_raw();
        assert_eq!(raw.struct_size, std::mem::size_of::<sys::flashcore_backward_params>());
        assert_eq!((raw.dtype, raw.causal, raw.deterministic), (sys::FLASHCORE_DTYPE_FP16 as i32, 0, 0));
        assert_eq!(raw.softmax_scale, sys::FLASHCORE_SOFTMAX_SCALE_DEFAULT as f32);
        assert_eq!((raw.use_window, raw.window_left, raw.window_right, raw.softcap), (0, 0, 0, 0.0));
        assert_eq!((params.window(), params.softcap(), params.deterministic()), (None, 0.0, false));
        assert!(raw.seqused_k.is_null() && raw.cu_seqlens_q.is_null() && raw.cu_seqlens_k.is_null());
        assert_eq!((raw.total_seqlen_q, raw.total_seqlen_k), (0, 0));
    }

    #[test]
    fn chunk_sinks_dsinks_and_sm_margin_reach_the_c_struct() {
        let mut buffers = Buffers::dense();
        let params = standard(&mut buffers).build().expect("valid params");
        let raw = params.as_raw();
        assert!(raw.sinks.is_null() && raw.dsinks.is_null());
        assert_eq!((raw.attention_chunk, params.attention_chunk(), params.computes_dsinks()), (0, 0, false));
        assert_eq!((raw.sm_margin, params.sm_margin()), (0, 0));
        let sinks = RawBuffer::new(address(9), HQ as usize * 4);
        let mut dsinks = RawBuffer::new(address(10), HQ as usize * 4);
        let mut buffers = Buffers::dense();
        let params = standard(&mut buffers)
            .causal(true)
            .attention_chunk(48)
            .sinks(&sinks)
            .dsinks(&mut dsinks)
            .deterministic(true)
            .sm_margin(16)
            .build()
            .expect("valid params");
        let raw = params.as_raw();
        assert_eq!((raw.attention_chunk, raw.sinks as u64, raw.dsinks as u64), (48, address(9), address(10)));
        assert_eq!((raw.sm_margin, params.sm_margin()), (16, 16));
        assert_eq!((params.attention_chunk(), params.computes_dsinks()), (48, true));
        // Sinks without their gradient (sinks that need none).
        let mut buffers = Buffers::dense();
        let params = standard(&mut buffers).sinks(&sinks).build().expect("valid params");
        assert!(!params.as_raw().sinks.is_null() && !params.computes_dsinks());
    }

    #[test]
    fn chunk_sinks_dsinks_and_sm_margin_refusals() {
        let sinks = RawBuffer::new(address(9), HQ as usize * 4);
        let mut buffers = Buffers::dense();
        let err = rejected(standard(&mut buffers).attention_chunk(-2));
        assert!(err.status() == Status::InvalidArgument && err.message().contains("attention_chunk (-2)"), "{err}");
        let mut buffers = Buffers::dense();
        let err = rejected(standard(&mut buffers).sm_margin(-3));
        assert!(err.status() == Status::InvalidArgument && err.message().contains("sm_margin (-3)"), "{err}");
        // dsinks needs sinks: the library's rule, in its words.
        let mut dsinks = RawBuffer::new(address(10), HQ as usize * 4);
        let mut buffers = Buffers::dense();
        let err = rejected(standard(&mut buffers).dsinks(&mut dsinks));
        assert!(err.status() == Status::InvalidArgument && err.message().contains("dsinks"), "{err}");
        // Each must hold a float per query head.
        for (name, sinks_bytes, dsinks_bytes) in [("sinks", HQ * 4 - 1, HQ * 4), ("dsinks", HQ * 4, HQ * 4 - 4)] {
            let short_sinks = RawBuffer::new(address(9), sinks_bytes as usize);
            let mut short_dsinks = RawBuffer::new(address(10), dsinks_bytes as usize);
            let mut buffers = Buffers::dense();
            let err = rejected(standard(&mut buffers).sinks(&short_sinks).dsinks(&mut short_dsinks));
            assert!(err.message().starts_with(&format!("{name}: the tensor spans {} bytes", HQ * 4)), "{err}");
        }
        // An output: overlapping dq is refused, naming both.
        let mut buffers = Buffers::dense();
        let mut over_dq = RawBuffer::new(buffers.get(BackwardTensor::DQ).device_ptr(), HQ as usize * 4);
        let err = rejected(standard(&mut buffers).sinks(&sinks).dsinks(&mut over_dq));
        assert!(err.message().contains("dsinks") && err.message().contains("overlaps dq"), "{err}");
    }

    #[test]
    fn every_missing_setting_is_named() {
        let err = rejected(BackwardParams::builder());
        assert_eq!(err.status(), Status::InvalidArgument);
        assert_eq!(
            err.message(),
            "not set: batch_size, seqlen_q, seqlen_k, num_heads_q, num_heads_kv, head_dim, \
             q, k, v, out, dout, lse, dq, dk, dv"
        );
        let mut buffers = Buffers::dense();
        let [_, _, _, out, _, _, dk, _] = &mut buffers.tensors;
        let some = BackwardParams::builder().head_dim(64).seqlen_k(5).out(out).dk(dk);
        assert_eq!(
            rejected(some).message(),
            "not set: batch_size, seqlen_q, num_heads_q, num_heads_kv, q, k, v, dout, lse, dq, dv"
        );
    }

    #[test]
    fn every_pointer_reaches_its_field() {
        let mut buffers = Buffers::dense();
        let addresses = buffers.tensors.map(|b| b.device_ptr());
        let lse_address = buffers.lse.device_ptr();
        let params = standard(&mut buffers).build().expect("valid params");
        let raw = params.as_raw();
        let fields = [
            raw.q as u64,
            raw.k as u64,
            raw.v as u64,
            raw.out as u64,
            raw.dout as u64,
            raw.dq as u64,
            raw.dk as u64,
            raw.dv as u64,
        ];
        assert_eq!(fields, addresses);
        assert_eq!(raw.lse as u64, lse_address);
    }

    #[test]
    fn options_reach_the_c_struct() {
        let mut buffers = Buffers::dense();
        let params = standard(&mut buffers)
            .dtype(DType::BF16)
            .causal(true)
            .softmax_scale(0.25)
            .window(32, 0)
            .softcap(30.0)
            .deterministic(true)
            .build()
            .expect("valid params");
        let raw = params.as_raw();
        assert_eq!((raw.dtype, raw.causal, raw.softmax_scale), (sys::FLASHCORE_DTYPE_BF16 as i32, 1, 0.25));
        assert_eq!((raw.use_window, raw.window_left, raw.window_right, raw.softcap), (1, 32, 0, 30.0));
        assert_eq!((params.window(), params.softcap(), params.deterministic()), (Some((32, 0)), 30.0, true));
        assert_eq!(raw.deterministic, 1);
        assert_eq!((raw.batch_size, raw.num_heads_q, raw.num_heads_kv), (B as i32, HQ as i32, HKV as i32));
        assert_eq!((raw.seqlen_q, raw.seqlen_k, raw.head_dim), (SQ as i32, SK as i32, D as i32));
        assert_eq!((raw.head_dim_v, params.head_dim(), params.head_dim_v()), (D as i32, D as i32, D as i32));
    }

    #[test]
    fn strides_follow_the_layout_gradients_like_their_inputs() {
        let q_like = |layout| match layout {
            Layout::Bhsd => Strides { batch: HQ * SQ * D, seq: D, head: SQ * D },
            Layout::Bshd => Strides { batch: SQ * HQ * D, seq: HQ * D, head: D },
        };
        let k_like = |layout| match layout {
            Layout::Bhsd => Strides { batch: HKV * SK * D, seq: D, head: SK * D },
            Layout::Bshd => Strides { batch: SK * HKV * D, seq: HKV * D, head: D },
        };
        for layout in [Layout::Bhsd, Layout::Bshd] {
            let mut buffers = Buffers::dense();
            let params = standard(&mut buffers).layout(layout).build().expect("valid params");
            for tensor in TENSORS {
                let want = match tensor.rows() {
                    Rows::Queries => q_like(layout),
                    Rows::Keys => k_like(layout),
                };
                assert_eq!(params.strides(tensor), want, "{layout:?} {tensor:?}");
            }
        }
    }

    #[test]
    fn head_dim_v_shapes_v_out_dout_and_dv() {
        let (d, dv) = (192, 128);
        if !has_kernel_for(d, dv) {
            return;
        }
        let mut buffers = Buffers::sized(d, dv, B * SQ, B * SK, B * SQ);
        let params = with_head_dims(d, Some(dv), &mut buffers).layout(Layout::Bshd).build().expect("valid params");
        assert_eq!((params.head_dim(), params.head_dim_v()), (d as i32, dv as i32));
        for tensor in TENSORS {
            let (heads, width) = match tensor.rows() {
                Rows::Queries => (HQ, if tensor.is_value_width() { dv } else { d }),
                Rows::Keys => (HKV, if tensor.is_value_width() { dv } else { d }),
            };
            let seqlen = if tensor.rows() == Rows::Queries { SQ } else { SK };
            let want = Strides { batch: seqlen * heads * width, seq: heads * width, head: width };
            assert_eq!(params.strides(tensor), want, "{tensor:?}");
        }
        // Each head_dim_v tensor one element short is refused, naming it.
        for tensor in [BackwardTensor::V, BackwardTensor::Out, BackwardTensor::DOut, BackwardTensor::DV] {
            let mut buffers = Buffers::sized(d, dv, B * SQ, B * SK, B * SQ);
            let full = buffers.get(tensor);
            buffers.set(tensor, RawBuffer::new(full.device_ptr(), full.byte_len() - 2));
            let err = rejected(with_head_dims(d, Some(dv), &mut buffers));
            assert!(err.message().starts_with(&format!("{}: ", tensor.name())), "{tensor:?}: {err}");
        }
        // head_dim_v 0 is head_dim: the head_dim_v-sized buffers are then too small.
        let mut buffers = Buffers::sized(d, dv, B * SQ, B * SK, B * SQ);
        let err = rejected(with_head_dims(d, Some(0), &mut buffers));
        assert!(err.message().starts_with("v: "), "{err}");
        let mut buffers = Buffers::sized(d, d, B * SQ, B * SK, B * SQ);
        let params = with_head_dims(d, Some(0), &mut buffers).build().expect("valid params");
        assert_eq!((params.head_dim_v(), params.as_raw().head_dim_v), (d as i32, d as i32));
    }

    #[test]
    fn explicit_strides_replace_derived_ones_and_bound_the_buffer() {
        // dq written into a BSHD view with rows padded to 512 elements,
        // while q stays dense BHSD: each tensor has strides of its own.
        let padded = Strides { batch: SQ * 512, seq: 512, head: D };
        let needed = (((B - 1) * padded.batch + (SQ - 1) * padded.seq + (HQ - 1) * padded.head + D) * 2) as usize;
        let mut buffers = Buffers::dense();
        buffers.set(BackwardTensor::DQ, RawBuffer::new(address(BackwardTensor::DQ as u64), needed));
        let params = standard(&mut buffers).strides(BackwardTensor::DQ, padded).build().expect("valid params");
        assert_eq!(params.strides(BackwardTensor::DQ), padded);
        assert_eq!(params.strides(BackwardTensor::Q), Strides { batch: HQ * SQ * D, seq: D, head: SQ * D });

        buffers.set(BackwardTensor::DQ, RawBuffer::new(address(BackwardTensor::DQ as u64), needed - 1));
        let err = rejected(standard(&mut buffers).strides(BackwardTensor::DQ, padded));
        assert_eq!(err.status(), Status::InvalidArgument);
        assert!(err.message().starts_with("dq: "), "{err}");
    }

    #[test]
    fn buffers_must_hold_their_tensors() {
        for tensor in TENSORS {
            let mut buffers = Buffers::dense();
            let full = buffers.get(tensor);
            buffers.set(tensor, RawBuffer::new(full.device_ptr(), full.byte_len() - 2));
            let err = rejected(standard(&mut buffers));
            assert_eq!(err.status(), Status::InvalidArgument, "{tensor:?}");
            let want = format!(
                "{}: the tensor spans {} bytes but its buffer holds {}",
                tensor.name(),
                full.byte_len(),
                full.byte_len() - 2
            );
            assert_eq!(err.message(), want);
        }
        let mut buffers = Buffers::dense();
        buffers.lse = RawBuffer::new(buffers.lse.device_ptr(), buffers.lse.byte_len() - 4);
        let err = rejected(standard(&mut buffers));
        assert!(err.message().starts_with("lse: the tensor spans"), "{err}");
    }

    #[test]
    fn varlen_packs_the_rows_of_queries_and_keys() {
        let (total_q, total_k) = (200, 150);
        let cu_q = RawBuffer::new(0x9000_0000, (B as usize + 1) * 4);
        let cu_k = RawBuffer::new(0x9100_0000, (B as usize + 1) * 4);
        let mut buffers = Buffers::packed(total_q, total_k);
        let params = standard(&mut buffers)
            .varlen_q(&cu_q, total_q as i32)
            .varlen_k(&cu_k, total_k as i32)
            .build()
            .expect("valid params");
        let raw = params.as_raw();
        assert_eq!((raw.cu_seqlens_q as u64, raw.total_seqlen_q), (cu_q.device_ptr(), total_q as i32));
        assert_eq!((raw.cu_seqlens_k as u64, raw.total_seqlen_k), (cu_k.device_ptr(), total_k as i32));
        // Packed rows whatever the layout (the default is BHSD), gradients included.
        for tensor in TENSORS {
            let heads = if tensor.rows() == Rows::Queries { HQ } else { HKV };
            assert_eq!(params.strides(tensor), Strides { batch: 0, seq: heads * D, head: D }, "{tensor:?}");
        }
        // Only the packed side is packed.
        let mut buffers = Buffers::sized(D, D, total_q, B * SK, total_q);
        let params = standard(&mut buffers).varlen_q(&cu_q, total_q as i32).build().expect("valid params");
        assert_eq!(params.strides(BackwardTensor::DOut), Strides { batch: 0, seq: HQ * D, head: D });
        assert_eq!(params.strides(BackwardTensor::DK), Strides { batch: HKV * SK * D, seq: D, head: SK * D });

        // Every packed tensor must hold the totals, lse [num_heads_q, total_seqlen_q].
        for tensor in TENSORS {
            let mut buffers = Buffers::packed(total_q, total_k);
            let full = buffers.get(tensor);
            buffers.set(tensor, RawBuffer::new(full.device_ptr(), full.byte_len() - 2));
            let err = rejected(standard(&mut buffers).varlen_q(&cu_q, total_q as i32).varlen_k(&cu_k, total_k as i32));
            assert!(err.message().starts_with(&format!("{}: the tensor spans", tensor.name())), "{err}");
        }
        let mut buffers = Buffers::packed(total_q, total_k);
        buffers.lse = RawBuffer::new(buffers.lse.device_ptr(), buffers.lse.byte_len() - 4);
        let err = rejected(standard(&mut buffers).varlen_q(&cu_q, total_q as i32).varlen_k(&cu_k, total_k as i32));
        assert!(err.message().starts_with("lse: the tensor spans"), "{err}");
        // And batch_size + 1 prefix sums.
        let short = RawBuffer::new(0x9100_0000, B as usize * 4);
        let mut buffers = Buffers::packed(total_q, total_k);
        let err = rejected(standard(&mut buffers).varlen_q(&cu_q, total_q as i32).varlen_k(&short, total_k as i32));
        assert_eq!(
            err.message(),
            format!("cu_seqlens_k: the tensor spans {} bytes but its buffer holds {}", (B + 1) * 4, B * 4)
        );
    }

    #[test]
    fn seqused_k_reaches_the_c_struct_and_must_hold_a_count_per_sequence() {
        let counts = RawBuffer::new(0x9200_0000, B as usize * 4);
        let mut buffers = Buffers::dense();
        let params = standard(&mut buffers).seqused_k(&counts).build().expect("valid params");
        assert_eq!(params.as_raw().seqused_k as u64, counts.device_ptr());
        let short = RawBuffer::new(0x9200_0000, B as usize * 4 - 1);
        let mut buffers = Buffers::dense();
        let err = rejected(standard(&mut buffers).seqused_k(&short));
        assert!(err.message().starts_with("seqused_k: the tensor spans"), "{err}");
        let misaligned = RawBuffer::new(0x9200_0002, B as usize * 4);
        let mut buffers = Buffers::dense();
        assert_eq!(rejected(standard(&mut buffers).seqused_k(&misaligned)).status(), Status::Misaligned);
    }

    #[test]
    fn library_verdicts_pass_through() {
        type Edit = fn(BackwardParamsBuilder<'_>) -> BackwardParamsBuilder<'_>;
        let cases: [(&str, Edit, Status); 16] = [
            ("head_dim 100, not a multiple of 8", |b| b.head_dim(100), Status::Unsupported),
            ("head_dim 520, wider than every kernel", |b| b.head_dim(520), Status::Unsupported),
            ("12 q heads on 5 kv heads", |b| b.num_heads_q(12).num_heads_kv(5), Status::InvalidArgument),
            ("negative batch_size", |b| b.batch_size(-2), Status::InvalidArgument),
            ("negative seqlen_q", |b| b.seqlen_q(-3), Status::InvalidArgument),
            ("negative softmax_scale", |b| b.softmax_scale(-1.0), Status::InvalidArgument),
            ("NaN softmax_scale", |b| b.softmax_scale(f32::NAN), Status::InvalidArgument),
            ("f32, a merge-only dtype", |b| b.dtype(DType::F32), Status::Unsupported),
            ("fp8 e4m3, which has no backward pass", |b| b.dtype(DType::F8E4M3), Status::Unsupported),
            ("window left bound below -1", |b| b.window(-2, 0), Status::InvalidArgument),
            ("window past the diagonal with causal", |b| b.causal(true).window(16, 1), Status::InvalidArgument),
            ("negative softcap", |b| b.softcap(-1.0), Status::InvalidArgument),
            ("infinite softcap", |b| b.softcap(f32::INFINITY), Status::InvalidArgument),
            (
                "negative dout stride",
                |b| b.strides(BackwardTensor::DOut, Strides { batch: 0, seq: -64, head: 64 }),
                Status::InvalidArgument,
            ),
            (
                "dk stride not a multiple of 8",
                |b| b.strides(BackwardTensor::DK, Strides { batch: 0, seq: 68, head: 68 * SK }),
                Status::Misaligned,
            ),
            (
                "dv stride not a multiple of 8",
                |b| b.strides(BackwardTensor::DV, Strides { batch: HKV * SK * D, seq: D, head: SK * D + 4 }),
                Status::Misaligned,
            ),
        ];
        for (what, edit, expected) in cases {
            let mut buffers = Buffers::dense();
            let err = rejected(edit(standard(&mut buffers)));
            assert_eq!(err.status(), expected, "{what}: {err}");
            assert!(!err.message().is_empty() && !err.message().starts_with("not set"), "{what}: {err}");
        }
        // What the builder cannot express, straight through flashcore_backward_check:
        // a total without its prefix sums.
        let mut buffers = Buffers::dense();
        let mut raw = standard(&mut buffers).build().expect("valid params").raw;
        raw.total_seqlen_q = 7;
        // SAFETY: reads the struct only.
        let err = check(unsafe { sys::flashcore_backward_check(&raw) }).unwrap_err();
        assert_eq!(err.status(), Status::InvalidArgument, "{err}");
        assert!(names(err.message(), "total_seqlen_q"), "{err}");
    }

    /// Whether `message` names `tensor` as the library's messages do, as
    /// `name (...)`: not in a list of names, and `q` not in `dq (...)`.
    fn names(message: &str, tensor: &str) -> bool {
        let identifier = |c: char| c.is_alphanumeric() || c == '_';
        message
            .match_indices(tensor)
            .any(|(at, _)| !message[..at].ends_with(identifier) && message[at + tensor.len()..].starts_with(" ("))
    }

    #[test]
    fn every_window_softcap_and_mode_in_range_is_accepted() {
        let windows = [(0, 0, false), (1, -1, false), (-1, -1, false), (17, 9, false), (63, 0, true), (63, -1, true)];
        for (left, right, causal) in windows {
            for deterministic in [false, true] {
                let mut buffers = Buffers::dense();
                let params = standard(&mut buffers)
                    .causal(causal)
                    .window(left, right)
                    .deterministic(deterministic)
                    .build()
                    .expect("valid window");
                assert_eq!((params.window(), params.deterministic()), (Some((left, right)), deterministic));
                assert_eq!(params.as_raw().causal, i32::from(causal));
            }
        }
        for softcap in [0.0, 0.5, 30.0, 1e30] {
            let mut buffers = Buffers::dense();
            let params = standard(&mut buffers).softcap(softcap).build().expect("valid softcap");
            assert_eq!((params.softcap(), params.as_raw().softcap), (softcap, softcap));
        }
    }

    #[test]
    fn misaligned_pointers_are_reported_by_the_library() {
        for tensor in TENSORS {
            let mut buffers = Buffers::dense();
            let full = buffers.get(tensor);
            buffers.set(tensor, RawBuffer::new(full.device_ptr() + 8, full.byte_len()));
            let err = rejected(standard(&mut buffers));
            assert_eq!(err.status(), Status::Misaligned, "{tensor:?}: {err}");
            assert!(names(err.message(), tensor.name()), "{tensor:?}: {err}");
        }
        let mut buffers = Buffers::dense();
        buffers.lse = RawBuffer::new(buffers.lse.device_ptr() + 2, buffers.lse.byte_len());
        let err = rejected(standard(&mut buffers));
        assert_eq!(err.status(), Status::Misaligned, "lse: {err}");
    }

    #[test]
    fn gradients_must_not_overlap_what_the_call_reads_or_each_other() {
        // The inputs may share memory: q, k and v all one buffer (a fused
        // projection's output), out and dout too.
        let mut buffers = Buffers::dense();
        let shared = RawBuffer::new(address(0), buffers.get(BackwardTensor::Q).byte_len() * 3);
        for tensor in [BackwardTensor::Q, BackwardTensor::K, BackwardTensor::V] {
            buffers.set(tensor, shared);
        }
        buffers.set(BackwardTensor::DOut, buffers.get(BackwardTensor::Out));
        assert!(standard(&mut buffers).build().is_ok(), "inputs sharing memory were refused");

        // A written tensor overlapping an input or another written tensor is
        // refused, the message naming both.
        let written = [BackwardTensor::DQ, BackwardTensor::DK, BackwardTensor::DV];
        for &output in &written {
            for other in TENSORS {
                if other == output {
                    continue;
                }
                let mut buffers = Buffers::dense();
                let other_address = buffers.get(other).device_ptr();
                let full = buffers.get(output);
                buffers.set(output, RawBuffer::new(other_address, full.byte_len()));
                let err = rejected(standard(&mut buffers));
                assert_eq!(err.status(), Status::InvalidArgument, "{output:?} on {other:?}: {err}");
                let message = err.message();
                assert!(
                    names(message, output.name()) && names(message, other.name()),
                    "{output:?} on {other:?}: {message}"
                );
            }
            let mut buffers = Buffers::dense();
            let lse_address = buffers.lse.device_ptr();
            let full = buffers.get(output);
            buffers.set(output, RawBuffer::new(lse_address, full.byte_len()));
            let err = rejected(standard(&mut buffers));
            assert_eq!(err.status(), Status::InvalidArgument, "{output:?} on lse: {err}");
        }
    }

    #[test]
    fn empty_calls_build() {
        // batch_size 0 or num_heads_q 0: nothing is read or written, so no
        // buffer needs to hold anything.
        for (batch, heads_q) in [(0, HQ), (B, 0)] {
            let mut buffers = Buffers::sized(D, D, 0, 0, 0);
            let params = standard(&mut buffers)
                .batch_size(batch as i32)
                .num_heads_q(heads_q as i32)
                .build()
                .expect("an empty call is valid");
            assert_eq!((params.as_raw().batch_size, params.as_raw().num_heads_q), (batch as i32, heads_q as i32));
        }
    }
}
