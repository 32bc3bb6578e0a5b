//! Forward-attention parameters and their builder.

use crate::buffer::{DeviceBuffer, RawBuffer};
use crate::error::{check, Error, Result, Status};
use crate::sys;
use std::ffi::c_void;
use std::marker::PhantomData;

/// Element type of q, k, v and out of a forward call ([`DType::F16`] or
/// [`DType::BF16`]; k and v may instead be [`DType::F8E4M3`], a quantized
/// KV cache: see [`ForwardParamsBuilder::kv_dtype`]; or q, k and v all
/// F8E4M3 with a BF16 out, fp8 prefill: see [`ForwardParamsBuilder::dtype`]),
/// and of the partial and merged outputs of
/// [`Handle::merge_states`](crate::Handle::merge_states) (F16, BF16 or F32).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum DType {
    /// IEEE 754 half precision (CUDA `__half`). The default.
    #[default]
    F16,
    /// bfloat16 (CUDA `__nv_bfloat16`).
    BF16,
    /// IEEE 754 single precision (`f32`): merging only. A forward call with
    /// it fails with [`Status::Unsupported`].
    F32,
    /// 8-bit float with 4 exponent and 3 mantissa bits, no infinities,
    /// largest 448 (CUDA `__nv_fp8_e4m3`, PyTorch `torch.float8_e4m3fn`):
    /// the [`kv_dtype`](ForwardParamsBuilder::kv_dtype) of a forward call
    /// with 16-bit q and out (a quantized KV cache), or a forward call's
    /// [`dtype`](ForwardParamsBuilder::dtype): fp8 queries, keys and values
    /// with a 16-bit output ([`out_dtype`](ForwardParamsBuilder::out_dtype),
    /// BF16), on compute capability 9.0 GPUs. As a merge's or a backward
    /// call's dtype, the library refuses it.
    F8E4M3,
}

impl DType {
    /// Bytes per element.
    ///
    /// ```
    /// assert_eq!(flashcore::DType::BF16.size_of(), 2);
    /// assert_eq!(flashcore::DType::F32.size_of(), 4);
    /// assert_eq!(flashcore::DType::F8E4M3.size_of(), 1);
    /// ```
    pub const fn size_of(self) -> usize {
        match self {
            DType::F8E4M3 => 1,
            DType::F16 | DType::BF16 => 2,
            DType::F32 => 4,
        }
    }

    pub(crate) fn to_raw(self) -> i32 {
        let raw = match self {
            DType::F16 => sys::FLASHCORE_DTYPE_FP16,
            DType::BF16 => sys::FLASHCORE_DTYPE_BF16,
            DType::F32 => sys::FLASHCORE_DTYPE_FP32,
            DType::F8E4M3 => sys::FLASHCORE_DTYPE_FP8_E4M3,
        };
        raw as i32
    }

    /// The dtype of a `flashcore_dtype` value; `None` for any other.
    pub(crate) fn from_raw(raw: i32) -> Option<DType> {
        [DType::F16, DType::BF16, DType::F32, DType::F8E4M3].into_iter().find(|dtype| dtype.to_raw() == raw)
    }
}

/// Storage order of densely packed tensors, used to derive the strides.
///
/// Any other order (padding, a slice of a larger tensor) works through
/// [`ForwardParamsBuilder::strides`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Layout {
    /// `[batch, heads, seqlen, head_dim]`, as PyTorch's SDPA. The default.
    #[default]
    Bhsd,
    /// `[batch, seqlen, heads, head_dim]`, as FlashAttention.
    Bshd,
}

impl Layout {
    pub(crate) fn to_raw(self) -> sys::flashcore_layout {
        match self {
            Layout::Bhsd => sys::FLASHCORE_LAYOUT_BHSD,
            Layout::Bshd => sys::FLASHCORE_LAYOUT_BSHD,
        }
    }
}

/// One of the four strided tensors of a forward call.
///
/// q holds [`dtype`](ForwardParamsBuilder::dtype) elements, k and v
/// [`kv_dtype`](ForwardParamsBuilder::kv_dtype) ones (dtype's by default)
/// and out [`out_dtype`](ForwardParamsBuilder::out_dtype) ones (dtype's by
/// default, BF16 for fp8 queries).
/// The shapes below are the dense ones; q and out are `[total_seqlen_q,
/// num_heads_q, dim]` with [`ForwardParamsBuilder::varlen_q`], k and v
/// `[total_seqlen_k, num_heads_kv, dim]` with
/// [`ForwardParamsBuilder::varlen_k`] and `[num_pages, page_size,
/// num_heads_kv, dim]` pools with [`ForwardParamsBuilder::paged_kv`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tensor {
    /// Queries, `[batch_size, num_heads_q, seqlen_q, head_dim]`.
    Q,
    /// Keys, `[batch_size, num_heads_kv, seqlen_k, head_dim]`.
    K,
    /// Values, `[batch_size, num_heads_kv, seqlen_k, head_dim_v]`.
    V,
    /// The output, `[batch_size, num_heads_q, seqlen_q, head_dim_v]`.
    Out,
}

const TENSORS: [Tensor; 4] = [Tensor::Q, Tensor::K, Tensor::V, Tensor::Out];

impl Tensor {
    fn name(self) -> &'static str {
        match self {
            Tensor::Q => "q",
            Tensor::K => "k",
            Tensor::V => "v",
            Tensor::Out => "out",
        }
    }
}

/// Element strides (not bytes) of one tensor; the last dimension (head_dim,
/// or head_dim_v for v and out) is always contiguous.
///
/// The library requires them to be >= 0 and multiples of
/// [`ALIGNMENT`](crate::ALIGNMENT) / element size (8 for fp16 and bf16
/// tensors, 16 for [`DType::F8E4M3`] ones: k and v of an fp8 cache, q, k
/// and v of fp8 queries).
///
/// ```
/// use flashcore::Strides;
/// // [batch, seqlen, heads, head_dim] with 8 heads of 64, rows padded to 1024.
/// let padded = Strides { batch: 4096 * 1024, seq: 1024, head: 64 };
/// assert_eq!(padded.seq, 1024);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Strides {
    /// Elements from one batch entry to the next.
    pub batch: i64,
    /// Elements from one sequence position to the next.
    pub seq: i64,
    /// Elements from one head to the next.
    pub head: i64,
}

/// Where the descale factor of each (batch, K/V head) is in a descale
/// array (see [`ForwardParamsBuilder::k_descale`] and
/// [`ForwardParamsBuilder::q_descale`]): the factor of batch entry
/// (sequence) b and K/V head h is element
/// `b * batch + h * head` of the f32 array. Both strides are in elements and
/// must be >= 0.
///
/// ```
/// use flashcore::DescaleStrides;
/// // One factor for the whole tensor (vLLM's per-tensor k_scale / v_scale); also the default.
/// assert_eq!(DescaleStrides::PER_TENSOR, DescaleStrides { batch: 0, head: 0 });
/// assert_eq!(DescaleStrides::default(), DescaleStrides::PER_TENSOR);
/// // A contiguous [batch_size, num_heads_kv] array, here of 8 K/V heads.
/// assert_eq!(DescaleStrides::per_head(8), DescaleStrides { batch: 8, head: 1 });
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct DescaleStrides {
    /// Elements from one batch entry's factors to the next's.
    pub batch: i64,
    /// Elements from one K/V head's factor to the next's.
    pub head: i64,
}

impl DescaleStrides {
    /// One factor for every batch entry and head: a one-element array.
    pub const PER_TENSOR: DescaleStrides = DescaleStrides { batch: 0, head: 0 };

    /// A factor per (batch, K/V head) in a contiguous `[batch_size,
    /// num_heads_kv]` array.
    pub const fn per_head(num_heads_kv: i32) -> DescaleStrides {
        DescaleStrides { batch: num_heads_kv as i64, head: 1 }
    }
}

/// The three stride fields of `tensor` in the C struct, in [`Strides`] order.
fn stride_fields(raw: &mut sys::flashcore_forward_params, tensor: Tensor) -> [&mut i64; 3] {
    match tensor {
        Tensor::Q => [&mut raw.q_batch_stride, &mut raw.q_seq_stride, &mut raw.q_head_stride],
        Tensor::K => [&mut raw.k_batch_stride, &mut raw.k_seq_stride, &mut raw.k_head_stride],
        Tensor::V => [&mut raw.v_batch_stride, &mut raw.v_seq_stride, &mut raw.v_head_stride],
        Tensor::Out => [&mut raw.out_batch_stride, &mut raw.out_seq_stride, &mut raw.out_head_stride],
    }
}

/// A params struct holding the library's defaults (`flashcore_forward_params_init`).
fn init_raw() -> Result<sys::flashcore_forward_params> {
    // SAFETY: the struct holds only integers, floats and raw pointers, for
    // which all-zero bytes are valid values; init writes exactly its size.
    let mut raw: sys::flashcore_forward_params = unsafe { std::mem::zeroed() };
    check(unsafe { sys::flashcore_forward_params_init(&mut raw, std::mem::size_of_val(&raw)) })?;
    Ok(raw)
}

/// A validated description of one attention call: shapes, options, strides
/// and the device buffers, ready for [`Handle::workspace_size`] and
/// [`Handle::forward`].
///
/// Made by [`ForwardParams::builder`]. The params borrow their buffers for
/// `'a` (q, k and v shared, out and lse exclusively), so a buffer cannot be
/// dropped or reused as another operand while the params exist.
///
/// [`Handle::workspace_size`]: crate::Handle::workspace_size
/// [`Handle::forward`]: crate::Handle::forward
///
/// ```
/// use flashcore::{ForwardParams, Layout, RawBuffer, Strides, Tensor};
///
/// // Building validates without touching the GPU, so made-up (aligned)
/// // addresses do for this example; real ones come from a CUDA allocator.
/// let bytes = 8 * 512 * 64 * 2; // [1, 8, 512, 64] fp16
/// let (q, k, v) = (RawBuffer::new(0x10_0000, bytes), RawBuffer::new(0x20_0000, bytes), RawBuffer::new(0x30_0000, bytes));
/// let mut out = RawBuffer::new(0x40_0000, bytes);
/// let params = ForwardParams::builder()
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
///     .out(&mut out)
///     .build()?;
/// assert_eq!(params.strides(Tensor::Q), Strides { batch: 512 * 8 * 64, seq: 8 * 64, head: 64 });
/// # Ok::<(), flashcore::Error>(())
/// ```
///
/// The output stays borrowed while the params live:
///
/// ```compile_fail,E0503
/// use flashcore::{ForwardParams, RawBuffer};
/// let q = RawBuffer::new(0x10_0000, 1 << 20);
/// let mut out = RawBuffer::new(0x20_0000, 1 << 20);
/// let params = ForwardParams::builder().q(&q).k(&q).v(&q).out(&mut out).build();
/// let copy = out; // error: `out` is mutably borrowed by `params`
/// drop(params);
/// ```
#[derive(Debug)]
pub struct ForwardParams<'a> {
    raw: sys::flashcore_forward_params,
    buffers: PhantomData<&'a mut ()>,
}

impl<'a> ForwardParams<'a> {
    /// Starts a builder with the C defaults: fp16, not causal, no window, no
    /// softcap, softmax scale 1/sqrt(head_dim), densely packed
    /// [`Layout::Bhsd`], no lse.
    pub fn builder() -> ForwardParamsBuilder<'a> {
        ForwardParamsBuilder::default()
    }

    /// The C struct, for calling `flashcore-sys` directly.
    pub fn as_raw(&self) -> &sys::flashcore_forward_params {
        &self.raw
    }

    /// The strides of `tensor`, as given or as derived from the layout.
    pub fn strides(&self, tensor: Tensor) -> Strides {
        let mut raw = self.raw;
        let [batch, seq, head] = stride_fields(&mut raw, tensor);
        Strides { batch: *batch, seq: *seq, head: *head }
    }

    /// Head dimension of q and k.
    pub fn head_dim(&self) -> i32 {
        self.raw.head_dim
    }

    /// Head dimension of v and out: the one given to
    /// [`ForwardParamsBuilder::head_dim_v`], else [`head_dim`](Self::head_dim).
    pub fn head_dim_v(&self) -> i32 {
        self.raw.head_dim_v
    }

    /// The split-KV setting: 0 for the library's choice, else the number of
    /// parts (see [`ForwardParamsBuilder::num_splits`]).
    pub fn num_splits(&self) -> i32 {
        self.raw.num_splits
    }

    /// The sliding window `(left, right)` given to
    /// [`ForwardParamsBuilder::window`], or `None` without one.
    pub fn window(&self) -> Option<(i32, i32)> {
        (self.raw.use_window != 0).then_some((self.raw.window_left, self.raw.window_right))
    }

    /// The logit softcap: 0 for none (see [`ForwardParamsBuilder::softcap`]).
    pub fn softcap(&self) -> f32 {
        self.raw.softcap
    }

    /// The chunk length of chunked attention: 0 for none (see
    /// [`ForwardParamsBuilder::attention_chunk`]).
    pub fn attention_chunk(&self) -> i32 {
        self.raw.attention_chunk
    }

    /// The SMs the call leaves to kernels on other streams: 0 for none (see
    /// [`ForwardParamsBuilder::sm_margin`]).
    pub fn sm_margin(&self) -> i32 {
        self.raw.sm_margin
    }

    /// Whether the call has learnable sinks (see
    /// [`ForwardParamsBuilder::sinks`]).
    pub fn has_sinks(&self) -> bool {
        !self.raw.sinks.is_null()
    }

    /// Element type of k and v: the one given to
    /// [`ForwardParamsBuilder::kv_dtype`], else the call's dtype.
    pub fn kv_dtype(&self) -> DType {
        let raw = if self.raw.kv_dtype == 0 { self.raw.dtype } else { self.raw.kv_dtype };
        DType::from_raw(raw).expect("a dtype the library accepted")
    }

    /// Element type of out: the one given to
    /// [`ForwardParamsBuilder::out_dtype`], else the library's default for
    /// the call's dtype ([`DType::BF16`] for [`DType::F8E4M3`] queries,
    /// dtype itself otherwise).
    pub fn out_dtype(&self) -> DType {
        let raw = match (self.raw.out_dtype, self.raw.dtype) {
            (0, dtype) if dtype == DType::F8E4M3.to_raw() => DType::BF16.to_raw(),
            (0, dtype) => dtype,
            (out_dtype, _) => out_dtype,
        };
        DType::from_raw(raw).expect("a dtype the library accepted")
    }

    /// Element type of `tensor`'s buffer: dtype for q, [`kv_dtype`](Self::kv_dtype)
    /// for k and v, [`out_dtype`](Self::out_dtype) for out.
    fn element_dtype(&self, tensor: Tensor) -> DType {
        match tensor {
            Tensor::Q => DType::from_raw(self.raw.dtype).expect("a dtype the library accepted"),
            Tensor::K | Tensor::V => self.kv_dtype(),
            Tensor::Out => self.out_dtype(),
        }
    }

    /// Bytes from the start of `tensor`'s buffer to the end of its last
    /// element, of its [`element_dtype`](Self::element_dtype).
    fn extent(&self, tensor: Tensor) -> i128 {
        let raw = &self.raw;
        // Packed tensors are one batch of their total rows; a paged pool is
        // num_pages batches of page_size rows.
        let (heads, batches, seqlen) = match tensor {
            Tensor::Q | Tensor::Out if !raw.cu_seqlens_q.is_null() => (raw.num_heads_q, 1, raw.total_seqlen_q),
            Tensor::Q | Tensor::Out => (raw.num_heads_q, raw.batch_size, raw.seqlen_q),
            Tensor::K | Tensor::V if !raw.block_table.is_null() => (raw.num_heads_kv, raw.num_pages, raw.page_size),
            Tensor::K | Tensor::V if !raw.cu_seqlens_k.is_null() => (raw.num_heads_kv, 1, raw.total_seqlen_k),
            Tensor::K | Tensor::V => (raw.num_heads_kv, raw.batch_size, raw.seqlen_k),
        };
        let width = match tensor {
            Tensor::Q | Tensor::K => self.head_dim(),
            Tensor::V | Tensor::Out => self.head_dim_v(),
        };
        let strides = self.strides(tensor);
        let element_size = self.element_dtype(tensor).size_of();
        tensor_extent(&[(batches, strides.batch), (seqlen, strides.seq), (heads, strides.head)], width, element_size)
    }
}

/// Bytes from the start of a buffer to the end of the last element of a
/// tensor with these (count, stride) dimensions and `width` contiguous
/// elements last, of `element_size` bytes each.
pub(crate) fn tensor_extent(counts_and_strides: &[(i32, i64)], width: i32, element_size: usize) -> i128 {
    let last =
        counts_and_strides.iter().map(|&(count, stride)| (i128::from(count) - 1) * i128::from(stride)).sum::<i128>()
            + i128::from(width)
            - 1;
    (last + 1) * element_size as i128
}

/// The required settings a builder was never given, named together in one
/// "not set: ..." error.
#[derive(Default)]
pub(crate) struct Missing(Vec<&'static str>);

impl Missing {
    /// `value`, or 0 with `name` noted where it was never given.
    pub(crate) fn size(&mut self, name: &'static str, value: Option<i32>) -> i32 {
        value.unwrap_or_else(|| {
            self.0.push(name);
            0
        })
    }

    /// Notes `name` where `buffer` was never given.
    pub(crate) fn buffer<T>(&mut self, name: &'static str, buffer: &Option<T>) {
        if buffer.is_none() {
            self.0.push(name);
        }
    }

    /// INVALID_ARGUMENT naming every setting noted, if any.
    pub(crate) fn check(self) -> Result<()> {
        if self.0.is_empty() {
            return Ok(());
        }
        Err(Error::new(Status::InvalidArgument, format!("not set: {}", self.0.join(", "))))
    }
}

/// Fails unless `needed` bytes fit in `buffer`.
pub(crate) fn ensure_fits(name: &str, needed: i128, buffer: &RawBuffer) -> Result<()> {
    if needed <= buffer.byte_len() as i128 {
        return Ok(());
    }
    Err(Error::new(
        Status::InvalidArgument,
        format!("{name}: the tensor spans {needed} bytes but its buffer holds {}", buffer.byte_len()),
    ))
}

pub(crate) fn device_address(buffer: Option<RawBuffer>) -> *mut c_void {
    buffer.map_or(std::ptr::null_mut(), |b| b.device_ptr() as usize as *mut c_void)
}

/// Setters that store their argument (wrapped in `Some` for required fields).
macro_rules! setters {
    ($($(#[$doc:meta])* $field:ident: $type:ty $(=> $wrap:ident)?;)*) => {$(
        $(#[$doc])*
        pub fn $field(mut self, value: $type) -> Self {
            self.$field = $($wrap)?(value);
            self
        }
    )*};
}

macro_rules! input_setters {
    ($($(#[$doc:meta])* $name:ident => $tensor:ident),* $(,)?) => {$(
        $(#[$doc])*
        pub fn $name<B: DeviceBuffer + ?Sized>(self, buffer: &'a B) -> Self {
            self.tensor(Tensor::$tensor, buffer)
        }
    )*};
}

/// Builds [`ForwardParams`], mirroring the C validation.
///
/// [`build`](ForwardParamsBuilder::build) reports every required setting that
/// was never given, then fills the C struct and has the library validate it
/// (`flashcore_forward_check`), so errors carry the library's own messages;
/// last it checks that each tensor fits in its buffer, which only the Rust
/// side can see.
///
/// Required: the six sizes and q, k, v, out. Optional: [`head_dim_v`],
/// [`dtype`], [`causal`], [`window`], [`attention_chunk`], [`softcap`],
/// [`sinks`], [`softmax_scale`], [`layout`] or [`strides`], [`lse`],
/// [`num_splits`], [`sm_margin`], [`seqused_k`], [`varlen_q`], [`varlen_k`],
/// [`paged_kv`], for an fp8 KV cache [`kv_dtype`], [`k_descale`],
/// [`v_descale`], and for fp8 queries (dtype [`DType::F8E4M3`])
/// [`q_descale`], [`k_descale`], [`v_descale`] and [`out_dtype`].
///
/// [`attention_chunk`]: ForwardParamsBuilder::attention_chunk
/// [`sm_margin`]: ForwardParamsBuilder::sm_margin
/// [`sinks`]: ForwardParamsBuilder::sinks
/// [`kv_dtype`]: ForwardParamsBuilder::kv_dtype
/// [`out_dtype`]: ForwardParamsBuilder::out_dtype
/// [`q_descale`]: ForwardParamsBuilder::q_descale
/// [`k_descale`]: ForwardParamsBuilder::k_descale
/// [`v_descale`]: ForwardParamsBuilder::v_descale
/// [`seqused_k`]: ForwardParamsBuilder::seqused_k
/// [`varlen_q`]: ForwardParamsBuilder::varlen_q
/// [`varlen_k`]: ForwardParamsBuilder::varlen_k
/// [`paged_kv`]: ForwardParamsBuilder::paged_kv
/// [`head_dim_v`]: ForwardParamsBuilder::head_dim_v
/// [`num_splits`]: ForwardParamsBuilder::num_splits
/// [`window`]: ForwardParamsBuilder::window
/// [`softcap`]: ForwardParamsBuilder::softcap
/// [`dtype`]: ForwardParamsBuilder::dtype
/// [`causal`]: ForwardParamsBuilder::causal
/// [`softmax_scale`]: ForwardParamsBuilder::softmax_scale
/// [`layout`]: ForwardParamsBuilder::layout
/// [`strides`]: ForwardParamsBuilder::strides
/// [`lse`]: ForwardParamsBuilder::lse
///
/// ```
/// use flashcore::{ForwardParams, RawBuffer, Status};
///
/// let buffer = RawBuffer::new(0x10_0000, 1 << 20);
/// let mut out = RawBuffer::new(0x20_0000, 1 << 20);
/// let err = ForwardParams::builder()
///     .batch_size(1)
///     .num_heads_q(12)
///     .num_heads_kv(5) // 12 query heads cannot share 5 key/value heads
///     .seqlen_q(128)
///     .seqlen_k(128)
///     .head_dim(64)
///     .q(&buffer)
///     .k(&buffer)
///     .v(&buffer)
///     .out(&mut out)
///     .build()
///     .unwrap_err();
/// assert_eq!(err.status(), Status::InvalidArgument);
/// println!("{err}"); // the library's explanation
/// ```
#[derive(Debug, Default)]
#[must_use = "a builder does nothing until build() is called"]
pub struct ForwardParamsBuilder<'a> {
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
    num_splits: i32,
    sm_margin: i32,
    layout: Layout,
    strides: [Option<Strides>; 4],
    tensors: [Option<RawBuffer>; 4],
    lse: Option<RawBuffer>,
    /// The f32 [num_heads_q] sink logits; `None`: no sinks.
    sinks: Option<RawBuffer>,
    seqused_k: Option<RawBuffer>,
    /// cu_seqlens_q and total_seqlen_q; `None`: q and out are not packed.
    varlen_q: Option<(RawBuffer, i32)>,
    /// cu_seqlens_k and total_seqlen_k; `None`: k and v are not packed.
    varlen_k: Option<(RawBuffer, i32)>,
    /// block_table, its batch stride, page_size and num_pages; `None`: no pages.
    paged_kv: Option<(RawBuffer, i64, i32, i32)>,
    /// `None`: dtype's.
    kv_dtype: Option<DType>,
    /// `None`: the library's default (0): dtype's, BF16 for fp8 queries.
    out_dtype: Option<DType>,
    /// The f32 factors and their strides; `None`: 1.
    q_descale: Option<(RawBuffer, DescaleStrides)>,
    k_descale: Option<(RawBuffer, DescaleStrides)>,
    v_descale: Option<(RawBuffer, DescaleStrides)>,
    buffers: PhantomData<&'a mut ()>,
}

impl<'a> ForwardParamsBuilder<'a> {
    setters! {
        /// Batch size (required).
        batch_size: i32 => Some;
        /// Query (and output) sequence length (required).
        seqlen_q: i32 => Some;
        /// Key/value sequence length (required).
        seqlen_k: i32 => Some;
        /// Query (and output) heads (required); a multiple of `num_heads_kv`.
        num_heads_q: i32 => Some;
        /// Key/value heads (required). Fewer than `num_heads_q` gives
        /// grouped-query attention: query head h reads key/value head
        /// h / (num_heads_q / num_heads_kv).
        num_heads_kv: i32 => Some;
        /// Head dimension of q and k (required): a multiple of 8 (of 16 with
        /// an fp8 [`kv_dtype`](Self::kv_dtype) or fp8 queries) that one of
        /// the pairs of [`supported_head_dims`](crate::supported_head_dims)
        /// covers (kernels exist for each listed pair; any other head dim runs
        /// on the first listed pair at least as wide, or is
        /// [`Status::Unsupported`]). fp8 queries have kernels of their own,
        /// for (64, 64), (128, 128) and (256, 256) only.
        head_dim: i32 => Some;
        /// Head dimension of v and out, when it differs from `head_dim`
        /// (optional; default `head_dim`, as is 0): e.g. 128 with head_dim
        /// 192, as in DeepSeek-style prefill. The same rules as `head_dim`
        /// apply to the pair.
        head_dim_v: i32 => Some;
        /// Element type of q, of k and v unless [`kv_dtype`](Self::kv_dtype)
        /// says otherwise, and of out unless [`out_dtype`](Self::out_dtype)
        /// does (default [`DType::F16`]). F16 and BF16 run on every GPU flashcore supports;
        /// [`DType::F32`] is refused ([`Status::Unsupported`] from
        /// [`build`](Self::build)).
        ///
        /// [`DType::F8E4M3`] is fp8 prefill, as FlashAttention 3's e4m3
        /// forward: q, k and v all hold one-byte e4m3 elements (kv_dtype
        /// unset or F8E4M3; 16-bit k and v under fp8 queries are
        /// refused), their values are the elements times the factors of
        /// [`q_descale`](Self::q_descale), [`k_descale`](Self::k_descale)
        /// and [`v_descale`](Self::v_descale) (1 without them), and out is
        /// written in BF16 (see [`out_dtype`](Self::out_dtype)), two bytes
        /// an element, which is what [`build`](Self::build) sizes out's
        /// buffer by. q, k and v strides count one-byte elements and must be
        /// multiples of 16, as must head_dim and head_dim_v; lse keeps its
        /// units (the natural log of the sum of the exponentiated scaled
        /// scores of the dequantized inputs). It runs on compute capability
        /// 9.0 GPUs (H100, H200) with a library built with the sm_90a
        /// kernels, with causal, window, grouped-query heads, lse,
        /// num_splits, varlen, seqused_k and paged K/V; not with a softcap,
        /// and there is no backward pass. The library refuses what it does
        /// not support ([`Status::Unsupported`], from [`build`](Self::build)
        /// or, for the GPU, from the handle's calls).
        ///
        /// ```
        /// use flashcore::{DType, DescaleStrides, ForwardParams, Layout, RawBuffer};
        ///
        /// // [1, 2048, 16, 128] e4m3 q, k and v (FlashAttention's layout), one descale
        /// // factor per tensor, out [1, 2048, 16, 128] bf16.
        /// let elements = 2048 * 16 * 128;
        /// let (q, k, v) = (RawBuffer::new(0x1000_0000, elements), RawBuffer::new(0x2000_0000, elements), RawBuffer::new(0x3000_0000, elements));
        /// let mut out = RawBuffer::new(0x4000_0000, elements * 2);
        /// let scales = [0x5000_0000, 0x5000_0100, 0x5000_0200].map(|address| RawBuffer::new(address, 4));
        /// let builder = ForwardParams::builder()
        ///     .dtype(DType::F8E4M3)
        ///     .batch_size(1)
        ///     .num_heads_q(16)
        ///     .num_heads_kv(16)
        ///     .seqlen_q(2048)
        ///     .seqlen_k(2048)
        ///     .head_dim(128)
        ///     .causal(true)
        ///     .layout(Layout::Bshd)
        ///     .q(&q)
        ///     .k(&k)
        ///     .v(&v)
        ///     .out(&mut out)
        ///     .q_descale(&scales[0], DescaleStrides::PER_TENSOR)
        ///     .k_descale(&scales[1], DescaleStrides::PER_TENSOR)
        ///     .v_descale(&scales[2], DescaleStrides::PER_TENSOR);
        /// // A library without fp8 queries (or without kernels for them) refuses.
        /// if let Ok(params) = builder.build() {
        ///     assert_eq!(params.out_dtype(), DType::BF16);
        /// }
        /// ```
        dtype: DType;
        /// Causal mask aligned to the bottom-right corner (default off): query i
        /// sees key j iff j <= i + seqlen_k - seqlen_q. Rows that see no key give
        /// out = 0 and lse = -inf.
        causal: bool;
        /// Multiplies Q·Kᵀ before the softmax: finite and > 0, or 0 (the
        /// default) for 1/sqrt(head_dim).
        softmax_scale: f32;
        /// Logit softcapping, as in Gemma 2 (default 0: off): with softcap > 0
        /// each score s = softmax_scale · q·k becomes softcap · tanh(s / softcap)
        /// before the mask and the softmax (lse is of the capped scores). It
        /// must be finite and >= 0, with softcap · log2(e) a finite f32 and
        /// softmax_scale / softcap not 0; otherwise [`build`](Self::build)
        /// fails with [`Status::InvalidArgument`].
        softcap: f32;
        /// Split-KV (default 0: the library chooses from the grid, the GPU's
        /// multiprocessor count and seqlen_k, splitting calls too small to
        /// fill the GPU, such as decoding). 1 never splits; N, from 2 to
        /// [`MAX_NUM_SPLITS`](crate::MAX_NUM_SPLITS), splits the keys each
        /// query block sees into exactly N parts, computed in parallel into
        /// the workspace and merged (the math of
        /// [`Handle::merge_states`](crate::Handle::merge_states)). A call that
        /// splits needs the workspace [`Handle::workspace_size`](crate::Handle::workspace_size)
        /// reports (0 when it does not split). Results are deterministic for
        /// a given num_splits; different num_splits round differently. Out of
        /// range: [`Status::InvalidArgument`] from [`build`](Self::build).
        num_splits: i32;
        /// Derives all strides for densely packed tensors in `layout` (default
        /// [`Layout::Bhsd`]); [`strides`](Self::strides) overrides single tensors.
        layout: Layout;
        /// Chunked attention, as Llama 4's and FlashAttention 3's
        /// `attention_chunk` (default 0: off): with a chunk length > 0, query
        /// i sees key j only where j and i's diagonal key i + seqlen_k -
        /// seqlen_q (aligned as for [`causal`](Self::causal)) lie in the same
        /// chunk `[c · attention_chunk, (c + 1) · attention_chunk)`. It
        /// combines with causal and the [`window`](Self::window): a key must
        /// pass every mask (Llama 4: `causal(true).attention_chunk(8192)`).
        /// Key tiles outside a query block's chunks are skipped, not
        /// computed; rows that see no key give out = 0 and lse = -inf (the
        /// sink, with [`sinks`](Self::sinks)). Negative:
        /// [`Status::InvalidArgument`] from [`build`](Self::build).
        ///
        /// ```
        /// # use flashcore::ForwardParams;
        /// // Llama 4's local layers: causal within chunks of 8192 keys.
        /// let builder = ForwardParams::builder().causal(true).attention_chunk(8192);
        /// ```
        attention_chunk: i32;
        /// SMs the call leaves to kernels on other streams, as
        /// FlashAttention 3's `sm_margin` (default 0: every SM of the
        /// handle's device): a context-parallel ring sets it so that the
        /// NCCL transfer of the next K/V slice runs beside the attention.
        /// Persistent kernels (the sm_90a forward) launch at most
        /// (SMs − sm_margin) CTAs, and the split-KV choice counts those SMs
        /// only: it changes the plan, not the arithmetic. Negative:
        /// [`Status::InvalidArgument`] from [`build`](Self::build); one that
        /// leaves the device no SM, from the handle's calls (the SM count is
        /// the handle's).
        sm_margin: i32;
    }

    /// Learnable attention sinks, as gpt-oss's (FlashAttention 4's
    /// `learnable_sink`; default: none): device memory holding one f32
    /// logit per query head, `[num_heads_q]`, 4-byte aligned. Head h's
    /// `sinks[h]`, in the units of the scaled (and capped) scores, joins
    /// the softmax denominator of each of its rows and attends to nothing:
    /// `out = Σⱼ exp(sⱼ)·vⱼ / (exp(sinks[h]) + Σⱼ exp(sⱼ))`, and lse is
    /// `ln(exp(sinks[h]) + Σⱼ exp(sⱼ))`. A row that sees no key gives
    /// out = 0 and lse = `sinks[h]`; −∞ is no sink for that head. Works with
    /// every other setting (a split-KV call counts the sink once, in its
    /// merge). Read on the GPU, unchecked: NaN gives NaN rows.
    /// [`build`](Self::build) checks that the buffer holds num_heads_q
    /// floats. Their gradient is [`BackwardParamsBuilder::dsinks`](crate::BackwardParamsBuilder::dsinks).
    ///
    /// ```
    /// # use flashcore::{ForwardParams, RawBuffer};
    /// # let sinks = RawBuffer::new(0x1000, 64 * 4);
    /// // gpt-oss's sliding layers: causal over 128 keys, one sink per query head (64 of them).
    /// let builder = ForwardParams::builder().num_heads_q(64).causal(true).window(127, 0).sinks(&sinks);
    /// ```
    pub fn sinks<B: DeviceBuffer + ?Sized>(mut self, sinks: &'a B) -> Self {
        self.sinks = Some(RawBuffer::new(sinks.device_ptr(), sinks.byte_len()));
        self
    }

    /// Sliding window (local attention), as FlashAttention's
    /// `window_size = (left, right)` (default: none): query i sees key j only
    /// where `i + d - left <= j <= i + d + right`, d = seqlen_k - seqlen_q
    /// (the diagonal, bottom-right aligned as for [`causal`](Self::causal)).
    /// Each bound is -1 (unbounded on that side) or >= 0: `window(0, 0)` sees
    /// the diagonal key only, `causal(true).window(left, 0)` the diagonal and
    /// the `left` keys before it. Causal is a right bound of 0, so with it
    /// `right` must be -1 or 0. Key tiles outside every row's window are
    /// skipped, not computed; rows that see no key give out = 0 and
    /// lse = -inf. A bound below -1, or `right` > 0 with causal:
    /// [`Status::InvalidArgument`] from [`build`](Self::build).
    ///
    /// ```
    /// # use flashcore::ForwardParams;
    /// // Mistral-style: causal, each query sees itself and the 4095 keys before it.
    /// let builder = ForwardParams::builder().causal(true).window(4095, 0);
    /// ```
    pub fn window(mut self, left: i32, right: i32) -> Self {
        self.window = Some((left, right));
        self
    }

    /// Explicit element strides for one tensor, replacing the ones derived
    /// from the layout.
    ///
    /// ```
    /// # use flashcore::{ForwardParams, Strides, Tensor};
    /// // q is a [1, 128, 2, 64] (BSHD) view whose rows are padded to 256 elements.
    /// let builder = ForwardParams::builder().strides(Tensor::Q, Strides { batch: 128 * 256, seq: 256, head: 64 });
    /// ```
    pub fn strides(mut self, tensor: Tensor, strides: Strides) -> Self {
        self.strides[tensor as usize] = Some(strides);
        self
    }

    input_setters! {
        /// Device memory holding the queries (required).
        q => Q,
        /// Device memory holding the keys (required).
        k => K,
        /// Device memory holding the values (required).
        v => V,
    }

    /// Device memory the output is written to (required).
    pub fn out<B: DeviceBuffer + ?Sized>(self, out: &'a mut B) -> Self {
        self.tensor(Tensor::Out, out)
    }

    /// Device memory for the natural-log log-sum-exp of each score row,
    /// `[batch_size, num_heads_q, seqlen_q]` f32, contiguous (optional; not
    /// written when absent); `[num_heads_q, total_seqlen_q]` with packed
    /// queries ([`varlen_q`](Self::varlen_q)).
    pub fn lse<B: DeviceBuffer + ?Sized>(mut self, lse: &'a mut B) -> Self {
        self.lse = Some(RawBuffer::new(lse.device_ptr(), lse.byte_len()));
        self
    }

    /// Per-sequence key counts, FlashAttention's `seqused_k` (its kv-cache
    /// call's `cache_seqlens`): device memory holding `batch_size` i32
    /// values, 4-byte aligned (optional; default: every sequence has
    /// `seqlen_k` keys). Sequence b then attends to its first
    /// `seqused_k[b]` keys of k and v, whose `seqlen_k` is the cache's
    /// capacity; causal and the window align to that count, a count of 0
    /// gives out = 0 and lse = -inf, and the keys past it may hold anything,
    /// NaN included. The values are read on the GPU, clamped into
    /// `[0, seqlen_k]`.
    pub fn seqused_k<B: DeviceBuffer + ?Sized>(mut self, seqused_k: &'a B) -> Self {
        self.seqused_k = Some(RawBuffer::new(seqused_k.device_ptr(), seqused_k.byte_len()));
        self
    }

    /// Variable-length queries, as FlashAttention's varlen call: q and out
    /// are packed `[total_seqlen_q, num_heads_q, head_dim(_v)]`, sequence b's
    /// query i being row `cu_seqlens_q[b] + i`. `cu_seqlens_q` is device
    /// memory holding `batch_size + 1` i32 prefix sums, 4-byte aligned;
    /// [`seqlen_q`](Self::seqlen_q) is then the longest sequence
    /// (FlashAttention's max_seqlen_q) and lse, if given, is
    /// `[num_heads_q, total_seqlen_q]`. Unless [`strides`](Self::strides)
    /// says otherwise, q and out get dense packed strides whatever the
    /// layout. Causal and the window align to each sequence's own lengths;
    /// rows of out after the last sequence are not written. The prefix sums
    /// are read on the GPU and clamped into the tensors.
    ///
    /// ```
    /// # use flashcore::ForwardParams;
    /// # let (cu_q, cu_k) = (flashcore::RawBuffer::new(0x1000, 12), flashcore::RawBuffer::new(0x2000, 12));
    /// // Two sequences of 100 and 28 tokens, self-attention: cu_seqlens [0, 100, 128].
    /// let builder = ForwardParams::builder().batch_size(2).seqlen_q(100).seqlen_k(100)
    ///     .varlen_q(&cu_q, 128).varlen_k(&cu_k, 128).causal(true);
    /// ```
    pub fn varlen_q<B: DeviceBuffer + ?Sized>(mut self, cu_seqlens_q: &'a B, total_seqlen_q: i32) -> Self {
        self.varlen_q = Some((RawBuffer::new(cu_seqlens_q.device_ptr(), cu_seqlens_q.byte_len()), total_seqlen_q));
        self
    }

    /// Variable-length keys: k and v packed `[total_seqlen_k, num_heads_kv,
    /// head_dim(_v)]` with `batch_size + 1` i32 prefix sums, as
    /// [`varlen_q`](Self::varlen_q) for the queries; [`seqlen_k`](Self::seqlen_k)
    /// is the longest key sequence. With [`seqused_k`](Self::seqused_k) too,
    /// sequence b uses the first `min(seqused_k[b], its length)` keys. Not
    /// with [`paged_kv`](Self::paged_kv).
    pub fn varlen_k<B: DeviceBuffer + ?Sized>(mut self, cu_seqlens_k: &'a B, total_seqlen_k: i32) -> Self {
        self.varlen_k = Some((RawBuffer::new(cu_seqlens_k.device_ptr(), cu_seqlens_k.byte_len()), total_seqlen_k));
        self
    }

    /// A paged KV cache (FlashAttention's `block_table`, vLLM's paged
    /// attention): k and v are pools `[num_pages, page_size, num_heads_kv,
    /// head_dim(_v)]` and row b of `block_table` (device memory of i32 page
    /// indices, 4-byte aligned, rows `block_table_batch_stride` apart) lists
    /// sequence b's pages in key order. [`seqlen_k`](Self::seqlen_k) is the
    /// longest sequence, each table row holds at least
    /// `ceil(seqlen_k / page_size)` entries, and the sequences' lengths come
    /// from [`seqused_k`](Self::seqused_k) (every sequence has `seqlen_k`
    /// keys without it). `page_size` is a multiple of 16. Unless
    /// [`strides`](Self::strides) says otherwise, k and v get dense pool
    /// strides (the batch stride is the page stride). Entries are clamped
    /// into the pool on the GPU. Packed queries ([`varlen_q`](Self::varlen_q))
    /// may be combined with it (chunked prefill on a paged cache).
    ///
    /// ```
    /// # use flashcore::ForwardParams;
    /// # let (table, lengths) = (flashcore::RawBuffer::new(0x1000, 4 * 64), flashcore::RawBuffer::new(0x2000, 16));
    /// // Decode for 4 sequences of up to 1024 keys in pages of 16: 64 entries per table row.
    /// let builder = ForwardParams::builder().batch_size(4).seqlen_q(1).seqlen_k(1024)
    ///     .paged_kv(&table, 64, 16, 256).seqused_k(&lengths);
    /// ```
    pub fn paged_kv<B: DeviceBuffer + ?Sized>(
        mut self,
        block_table: &'a B,
        block_table_batch_stride: i64,
        page_size: i32,
        num_pages: i32,
    ) -> Self {
        let table = RawBuffer::new(block_table.device_ptr(), block_table.byte_len());
        self.paged_kv = Some((table, block_table_batch_stride, page_size, num_pages));
        self
    }

    /// Element type of k and v when it is not [`dtype`](Self::dtype)'s
    /// (default: dtype's): [`DType::F8E4M3`] with dtype F16 or BF16 reads a
    /// quantized KV cache, as vLLM's `kv_cache_dtype="fp8"` and FlashInfer's
    /// fp8 decode. k and v then hold one-byte e4m3 elements, and their
    /// strides ([`strides`](Self::strides), or those derived from the
    /// layout, the packing or the pages) count those bytes: they must be
    /// multiples of 16, and head_dim and head_dim_v multiples of 16 too.
    /// q and out keep dtype. The values of k and v are their elements
    /// times the factors of [`k_descale`](Self::k_descale) and
    /// [`v_descale`](Self::v_descale) (1 without them); the kernels widen
    /// each K/V tile to dtype on the GPU, so the result is that of the
    /// dequantized cache in dtype. Works with every other option (split-KV,
    /// grouped-query heads, seqused_k, varlen, paged caches, window,
    /// softcap); any other pairing is refused by [`build`](Self::build).
    /// Under fp8 queries ([`dtype`](Self::dtype) F8E4M3) k and v are e4m3
    /// too: leave kv_dtype unset or give F8E4M3.
    ///
    /// ```
    /// use flashcore::{DType, DescaleStrides, ForwardParams, RawBuffer};
    ///
    /// // Decode over an fp8 cache: [2, 4096, 8, 64] e4m3 k and v, bf16 q and out,
    /// // one k and one v factor per (sequence, K/V head).
    /// let (q, mut out) = (RawBuffer::new(0x100_0000, 2 * 32 * 64 * 2), RawBuffer::new(0x200_0000, 2 * 32 * 64 * 2));
    /// let (k, v) = (RawBuffer::new(0x1000_0000, 2 * 4096 * 8 * 64), RawBuffer::new(0x2000_0000, 2 * 4096 * 8 * 64));
    /// let (k_descale, v_descale) = (RawBuffer::new(0x300_0000, 2 * 8 * 4), RawBuffer::new(0x300_1000, 2 * 8 * 4));
    /// let params = ForwardParams::builder()
    ///     .dtype(DType::BF16)
    ///     .kv_dtype(DType::F8E4M3)
    ///     .batch_size(2)
    ///     .num_heads_q(32)
    ///     .num_heads_kv(8)
    ///     .seqlen_q(1)
    ///     .seqlen_k(4096)
    ///     .head_dim(64)
    ///     .layout(flashcore::Layout::Bshd)
    ///     .q(&q)
    ///     .k(&k)
    ///     .v(&v)
    ///     .out(&mut out)
    ///     .k_descale(&k_descale, DescaleStrides::per_head(8))
    ///     .v_descale(&v_descale, DescaleStrides::per_head(8))
    ///     .build()?;
    /// assert_eq!(params.kv_dtype(), DType::F8E4M3);
    /// assert_eq!(params.strides(flashcore::Tensor::K).seq, 8 * 64); // elements of one byte
    /// # Ok::<(), flashcore::Error>(())
    /// ```
    pub fn kv_dtype(mut self, kv_dtype: DType) -> Self {
        self.kv_dtype = Some(kv_dtype);
        self
    }

    /// Descale factors of fp8 keys (an fp8 cache, [`kv_dtype`](Self::kv_dtype)
    /// [`DType::F8E4M3`], or fp8 queries, [`dtype`](Self::dtype) F8E4M3),
    /// as FlashAttention 3's `k_descale` and vLLM's `k_scale`: the key
    /// values are k's elements times the
    /// factor, and the scores are computed as
    /// `softmax_scale · k_descale · (q · k)`. `k_descale` is device memory
    /// of f32 factors, 4-byte aligned, one per (batch entry, K/V head) where
    /// `strides` put them ([`DescaleStrides::per_head`] for a contiguous
    /// `[batch_size, num_heads_kv]` array; the query heads of a group share
    /// their K/V head's factor), or a single factor for the whole tensor
    /// with [`DescaleStrides::PER_TENSOR`]. [`build`](Self::build) checks
    /// that the buffer holds every factor the strides reach. Optional
    /// (default: 1); refused unless k and v are fp8. The factors are read
    /// on the GPU, unchecked: they must be finite and > 0, otherwise the
    /// results are wrong.
    ///
    /// ```
    /// # use flashcore::{DescaleStrides, ForwardParams, RawBuffer};
    /// # let (k_scale, v_scale) = (RawBuffer::new(0x1000, 4), RawBuffer::new(0x2000, 4));
    /// // vLLM-style per-tensor scales, one f32 each.
    /// let builder = ForwardParams::builder()
    ///     .kv_dtype(flashcore::DType::F8E4M3)
    ///     .k_descale(&k_scale, DescaleStrides::PER_TENSOR)
    ///     .v_descale(&v_scale, DescaleStrides::PER_TENSOR);
    /// ```
    pub fn k_descale<B: DeviceBuffer + ?Sized>(mut self, k_descale: &'a B, strides: DescaleStrides) -> Self {
        self.k_descale = Some((RawBuffer::new(k_descale.device_ptr(), k_descale.byte_len()), strides));
        self
    }

    /// Descale factors of fp8 values, as [`k_descale`](Self::k_descale)
    /// for the keys (vLLM's `v_scale`): the values are v's elements times
    /// the factor, i.e. each output row is multiplied by its K/V head's
    /// factor.
    pub fn v_descale<B: DeviceBuffer + ?Sized>(mut self, v_descale: &'a B, strides: DescaleStrides) -> Self {
        self.v_descale = Some((RawBuffer::new(v_descale.device_ptr(), v_descale.byte_len()), strides));
        self
    }

    /// Descale factors of fp8 queries ([`dtype`](Self::dtype)
    /// [`DType::F8E4M3`]), as FlashAttention 3's `q_descale`: the query
    /// values are q's elements times the factor, so the scores are
    /// `softmax_scale · q_descale · k_descale · (q · k)`. The factors are
    /// indexed as [`k_descale`](Self::k_descale)'s, by (batch entry, K/V
    /// head), not by query head: the query heads of a group share one
    /// factor (FlashAttention 3's `[batch_size, num_heads_kv]`;
    /// [`DescaleStrides::per_head`] with num_heads_kv, or
    /// [`DescaleStrides::PER_TENSOR`] for one factor for the whole tensor).
    /// Device memory of f32 factors, 4-byte aligned; [`build`](Self::build)
    /// checks that the buffer holds every factor the strides reach.
    /// Optional (default: 1); refused for 16-bit queries. The factors are
    /// read on the GPU, unchecked: they must be finite and > 0.
    ///
    /// ```
    /// # use flashcore::{DescaleStrides, ForwardParams, RawBuffer};
    /// # let (q_scales, k_scales, v_scales) = (RawBuffer::new(0x1000, 64), RawBuffer::new(0x2000, 64), RawBuffer::new(0x3000, 64));
    /// // fp8 prefill with FlashAttention 3's descales: f32 [batch_size 2, num_heads_kv 8] each.
    /// let builder = ForwardParams::builder()
    ///     .dtype(flashcore::DType::F8E4M3)
    ///     .batch_size(2)
    ///     .num_heads_q(32)
    ///     .num_heads_kv(8)
    ///     .q_descale(&q_scales, DescaleStrides::per_head(8))
    ///     .k_descale(&k_scales, DescaleStrides::per_head(8))
    ///     .v_descale(&v_scales, DescaleStrides::per_head(8));
    /// ```
    pub fn q_descale<B: DeviceBuffer + ?Sized>(mut self, q_descale: &'a B, strides: DescaleStrides) -> Self {
        self.q_descale = Some((RawBuffer::new(q_descale.device_ptr(), q_descale.byte_len()), strides));
        self
    }

    /// Element type of out (default: the library's choice for the call's
    /// [`dtype`](Self::dtype): [`DType::BF16`] for fp8 queries, as
    /// FlashAttention 3, dtype itself otherwise). The library accepts
    /// dtype itself for 16-bit queries and BF16 for fp8 ones; anything
    /// else fails [`build`](Self::build) with [`Status::Unsupported`].
    /// [`build`](Self::build) sizes out's buffer at this type's element
    /// size (two bytes for BF16 under one-byte fp8 queries), as does
    /// [`ForwardParams::out_dtype`], which reads the type back.
    pub fn out_dtype(mut self, out_dtype: DType) -> Self {
        self.out_dtype = Some(out_dtype);
        self
    }

    fn tensor<B: DeviceBuffer + ?Sized>(mut self, tensor: Tensor, buffer: &B) -> Self {
        self.tensors[tensor as usize] = Some(RawBuffer::new(buffer.device_ptr(), buffer.byte_len()));
        self
    }

    /// Dense strides of packed and paged tensors, in place of the layout's:
    /// packed rows `[total, heads, dim]`, pools `[num_pages, page_size,
    /// heads, dim]`. Explicit [`strides`](Self::strides) are applied after.
    fn pack_strides(&self, raw: &mut sys::flashcore_forward_params) {
        let (hq, hkv) = (i64::from(raw.num_heads_q), i64::from(raw.num_heads_kv));
        let (d, dv) = (i64::from(raw.head_dim), i64::from(raw.head_dim_v));
        let page_rows = self.paged_kv.map(|(_, _, page_size, _)| i64::from(page_size));
        let mut set = |tensor: Tensor, heads: i64, width: i64, rows_per_batch: i64| {
            let [batch, seq, head] = stride_fields(raw, tensor);
            (*batch, *seq, *head) = (rows_per_batch * heads * width, heads * width, width);
        };
        if self.varlen_q.is_some() {
            set(Tensor::Q, hq, d, 0);
            set(Tensor::Out, hq, dv, 0);
        }
        if self.varlen_k.is_some() || page_rows.is_some() {
            set(Tensor::K, hkv, d, page_rows.unwrap_or(0));
            set(Tensor::V, hkv, dv, page_rows.unwrap_or(0));
        }
    }

    /// Validates everything and returns the params; see the type's
    /// documentation for the order of checks. Touches no GPU.
    pub fn build(self) -> Result<ForwardParams<'a>> {
        let params = self.assemble()?;
        // SAFETY: reads the struct only.
        check(unsafe { sys::flashcore_forward_check(&params.raw) })?;
        self.check_buffers(&params)?;
        Ok(params)
    }

    /// The C struct of these settings, not yet validated by the library:
    /// fails only for required settings never given (and for what
    /// `flashcore_set_contiguous_strides` refuses).
    fn assemble(&self) -> Result<ForwardParams<'a>> {
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
        for (tensor, buffer) in TENSORS.iter().zip(&self.tensors) {
            missing.buffer(tensor.name(), buffer);
        }
        missing.check()?;

        raw.dtype = self.dtype.to_raw();
        raw.causal = i32::from(self.causal);
        raw.softmax_scale = self.softmax_scale;
        raw.num_splits = self.num_splits;
        if let Some((left, right)) = self.window {
            (raw.use_window, raw.window_left, raw.window_right) = (1, left, right);
        }
        raw.softcap = self.softcap;
        raw.attention_chunk = self.attention_chunk;
        raw.sm_margin = self.sm_margin;
        raw.kv_dtype = self.kv_dtype.map_or(0, DType::to_raw);
        raw.out_dtype = self.out_dtype.map_or(0, DType::to_raw);
        // SAFETY: `raw` is a valid params struct with its own struct_size.
        check(unsafe { sys::flashcore_set_contiguous_strides(&mut raw, self.layout.to_raw()) })?;
        self.pack_strides(&mut raw);
        for (&tensor, strides) in TENSORS.iter().zip(&self.strides) {
            if let Some(strides) = strides {
                let [batch, seq, head] = stride_fields(&mut raw, tensor);
                (*batch, *seq, *head) = (strides.batch, strides.seq, strides.head);
            }
        }
        let [q, k, v, out] = self.tensors;
        (raw.q, raw.k, raw.v) = (device_address(q), device_address(k), device_address(v));
        raw.out = device_address(out);
        raw.lse = device_address(self.lse).cast();
        raw.sinks = device_address(self.sinks).cast();
        raw.seqused_k = device_address(self.seqused_k).cast();
        let int32s = |buffer: RawBuffer| device_address(Some(buffer)).cast();
        if let Some((cu_seqlens, total)) = self.varlen_q {
            (raw.cu_seqlens_q, raw.total_seqlen_q) = (int32s(cu_seqlens), total);
        }
        if let Some((cu_seqlens, total)) = self.varlen_k {
            (raw.cu_seqlens_k, raw.total_seqlen_k) = (int32s(cu_seqlens), total);
        }
        if let Some((table, stride, page_size, num_pages)) = self.paged_kv {
            raw.block_table = int32s(table);
            (raw.block_table_batch_stride, raw.page_size, raw.num_pages) = (stride, page_size, num_pages);
        }
        if let Some((factors, strides)) = self.q_descale {
            raw.q_descale = device_address(Some(factors)).cast();
            (raw.q_descale_batch_stride, raw.q_descale_head_stride) = (strides.batch, strides.head);
        }
        if let Some((factors, strides)) = self.k_descale {
            raw.k_descale = device_address(Some(factors)).cast();
            (raw.k_descale_batch_stride, raw.k_descale_head_stride) = (strides.batch, strides.head);
        }
        if let Some((factors, strides)) = self.v_descale {
            raw.v_descale = device_address(Some(factors)).cast();
            (raw.v_descale_batch_stride, raw.v_descale_head_stride) = (strides.batch, strides.head);
        }
        Ok(ForwardParams { raw, buffers: PhantomData })
    }

    /// Fails unless each buffer holds everything of it that `params` (these
    /// settings, assembled) reach, each tensor at the element size of its
    /// own dtype ([`ForwardParams::element_dtype`]).
    fn check_buffers(&self, params: &ForwardParams<'a>) -> Result<()> {
        let raw = &params.raw;
        for (&tensor, buffer) in TENSORS.iter().zip(&self.tensors) {
            let buffer = buffer.as_ref().expect("checked by assemble");
            ensure_fits(tensor.name(), params.extent(tensor), buffer)?;
        }
        let descales = [("q_descale", &self.q_descale), ("k_descale", &self.k_descale), ("v_descale", &self.v_descale)];
        for (name, descale) in descales {
            if let Some((factors, strides)) = descale {
                // One f32 at [b * batch + h * head] for each (batch entry, K/V head).
                let dims = [(raw.batch_size, strides.batch), (raw.num_heads_kv, strides.head)];
                ensure_fits(name, tensor_extent(&dims, 1, std::mem::size_of::<f32>()), factors)?;
            }
        }
        if let Some(lse) = &self.lse {
            // [num_heads_q, total_seqlen_q] for packed queries.
            let rows = match self.varlen_q {
                Some(_) => i128::from(raw.num_heads_q) * i128::from(raw.total_seqlen_q),
                None => i128::from(raw.batch_size) * i128::from(raw.num_heads_q) * i128::from(raw.seqlen_q),
            };
            ensure_fits("lse", rows * std::mem::size_of::<f32>() as i128, lse)?;
        }
        if let Some(sinks) = &self.sinks {
            ensure_fits("sinks", i128::from(raw.num_heads_q) * std::mem::size_of::<f32>() as i128, sinks)?;
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
        if let Some((table, stride, page_size, _)) = &self.paged_kv {
            let per_row = (i128::from(raw.seqlen_k) + i128::from(*page_size) - 1) / i128::from(*page_size);
            ensure_fits(
                "block_table",
                int32_bytes((i128::from(raw.batch_size) - 1) * i128::from(*stride) + per_row),
                table,
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Standard test shape: grouped-query, seqlen_q != seqlen_k.
    const B: i64 = 2;
    const HQ: i64 = 4;
    const HKV: i64 = 2;
    const SQ: i64 = 128;
    const SK: i64 = 96;
    const D: i64 = 64;

    /// Made-up, aligned, disjoint device addresses, each exactly the size of
    /// its dense tensor: building never dereferences them.
    struct Buffers {
        q: RawBuffer,
        k: RawBuffer,
        v: RawBuffer,
        out: RawBuffer,
    }

    fn dense_lse() -> RawBuffer {
        RawBuffer::new(0x5000_0000, (B * HQ * SQ * 4) as usize)
    }

    impl Buffers {
        fn dense() -> Buffers {
            let q_bytes = (B * HQ * SQ * D * 2) as usize;
            let kv_bytes = (B * HKV * SK * D * 2) as usize;
            Buffers {
                q: RawBuffer::new(0x1000_0000, q_bytes),
                k: RawBuffer::new(0x2000_0000, kv_bytes),
                v: RawBuffer::new(0x3000_0000, kv_bytes),
                out: RawBuffer::new(0x4000_0000, q_bytes),
            }
        }
    }

    fn standard(buffers: &mut Buffers) -> ForwardParamsBuilder<'_> {
        with_head_dims(D, None, [&buffers.q, &buffers.k, &buffers.v], &mut buffers.out)
    }

    /// The standard shape with head dims `d` and `dv` (`None`: head_dim_v not
    /// given) on the given buffers.
    fn with_head_dims<'a>(
        d: i64,
        dv: Option<i64>,
        [q, k, v]: [&'a RawBuffer; 3],
        out: &'a mut RawBuffer,
    ) -> ForwardParamsBuilder<'a> {
        let builder = ForwardParams::builder()
            .batch_size(B as i32)
            .num_heads_q(HQ as i32)
            .num_heads_kv(HKV as i32)
            .seqlen_q(SQ as i32)
            .seqlen_k(SK as i32)
            .head_dim(d as i32)
            .q(q)
            .k(k)
            .v(v)
            .out(out);
        match dv {
            Some(dv) => builder.head_dim_v(dv as i32),
            None => builder,
        }
    }

    fn rejected(builder: ForwardParamsBuilder<'_>) -> Error {
        builder.build().expect_err("the builder accepted invalid params")
    }

    #[test]
    fn defaults_come_from_the_library() {
        let mut buffers = Buffers::dense();
        let params = standard(&mut buffers).build().expect("valid params");
        let raw = params.as_raw();
        assert_eq!(raw.struct_size, std::mem::size_of::<sys::flashcore_forward_params>());
        assert_eq!((raw.dtype, raw.causal), (sys::FLASHCORE_DTYPE_FP16 as i32, 0));
        assert_eq!(raw.softmax_scale, sys::FLASHCORE_SOFTMAX_SCALE_DEFAULT as f32);
        assert!(raw.lse.is_null());
        assert_eq!((raw.num_splits, params.num_splits()), (0, 0));
        assert_eq!((raw.use_window, raw.window_left, raw.window_right, raw.softcap), (0, 0, 0, 0.0));
        assert_eq!((params.window(), params.softcap()), (None, 0.0));
        assert!(raw.seqused_k.is_null());
        assert_eq!(
            (raw.kv_dtype, raw.out_dtype, params.kv_dtype(), params.out_dtype()),
            (0, 0, DType::F16, DType::F16)
        );
        assert!(raw.q_descale.is_null() && raw.k_descale.is_null() && raw.v_descale.is_null());
        let descale_strides = [
            raw.q_descale_batch_stride,
            raw.q_descale_head_stride,
            raw.k_descale_batch_stride,
            raw.k_descale_head_stride,
            raw.v_descale_batch_stride,
            raw.v_descale_head_stride,
        ];
        assert_eq!(descale_strides, [0; 6]);
    }

    #[test]
    fn dtypes_map_to_the_c_enum() {
        let all = [
            (DType::F16, sys::FLASHCORE_DTYPE_FP16, 2),
            (DType::BF16, sys::FLASHCORE_DTYPE_BF16, 2),
            (DType::F32, sys::FLASHCORE_DTYPE_FP32, 4),
            (DType::F8E4M3, sys::FLASHCORE_DTYPE_FP8_E4M3, 1),
        ];
        for (dtype, raw, bytes) in all {
            assert_eq!((dtype.to_raw(), dtype.size_of()), (raw as i32, bytes), "{dtype:?}");
            assert_eq!(DType::from_raw(raw as i32), Some(dtype));
        }
        assert_eq!((DType::from_raw(0), DType::from_raw(5)), (None, None));
    }

    /// The standard shape with fp8 k and v (one byte per element) on
    /// `buffers`, bf16 q and out.
    fn fp8(buffers: &mut Buffers) -> ForwardParamsBuilder<'_> {
        standard(buffers).dtype(DType::BF16).kv_dtype(DType::F8E4M3)
    }

    /// Dense buffers of the standard shape with one-byte k and v.
    fn fp8_buffers() -> Buffers {
        let kv_bytes = (B * HKV * SK * D) as usize;
        Buffers {
            k: RawBuffer::new(0x2000_0000, kv_bytes),
            v: RawBuffer::new(0x3000_0000, kv_bytes),
            ..Buffers::dense()
        }
    }

    #[test]
    fn fp8_kv_dtype_reaches_the_c_struct_and_sizes_k_and_v_in_bytes() {
        let mut buffers = fp8_buffers();
        let params = fp8(&mut buffers).build().expect("valid params");
        let raw = params.as_raw();
        assert_eq!((raw.dtype, raw.kv_dtype), (sys::FLASHCORE_DTYPE_BF16 as i32, sys::FLASHCORE_DTYPE_FP8_E4M3 as i32));
        assert_eq!((params.kv_dtype(), raw.out_dtype), (DType::F8E4M3, 0));
        // Strides are in elements whatever their size.
        assert_eq!(params.strides(Tensor::K), Strides { batch: HKV * SK * D, seq: D, head: SK * D });
        // k and v one element (byte) short, and q, out still 2 bytes an element.
        for (name, edit) in [
            ("k", (|b: &mut Buffers| b.k = RawBuffer::new(b.k.device_ptr(), b.k.byte_len() - 1)) as fn(&mut Buffers)),
            ("v", |b| b.v = RawBuffer::new(b.v.device_ptr(), b.v.byte_len() - 1)),
            ("q", |b| b.q = RawBuffer::new(b.q.device_ptr(), b.q.byte_len() / 2)),
            ("out", |b| b.out = RawBuffer::new(b.out.device_ptr(), b.out.byte_len() - 1)),
        ] {
            let mut buffers = fp8_buffers();
            edit(&mut buffers);
            let err = rejected(fp8(&mut buffers));
            assert!(err.message().starts_with(&format!("{name}: the tensor spans")), "{name}: {err}");
        }
        // kv_dtype given as dtype's is dtype's.
        let mut buffers = Buffers::dense();
        let params = standard(&mut buffers).kv_dtype(DType::F16).build().expect("valid params");
        assert_eq!((params.kv_dtype(), params.as_raw().kv_dtype), (DType::F16, sys::FLASHCORE_DTYPE_FP16 as i32));
        // Not given: dtype's, whatever dtype is.
        let mut buffers = Buffers::dense();
        let params = standard(&mut buffers).dtype(DType::BF16).build().expect("valid params");
        assert_eq!((params.kv_dtype(), params.as_raw().kv_dtype), (DType::BF16, 0));
    }

    #[test]
    fn fp8_paged_and_packed_pools_are_sized_in_bytes() {
        let (page_size, num_pages, per_row) = (16, 20, 6); // ceil(96 / 16) pages per sequence
        let pool = RawBuffer::new(0x2000_0000, (num_pages * page_size * HKV * D) as usize);
        let table = RawBuffer::new(0x6000_0000, (B * per_row * 4) as usize);
        let mut buffers = Buffers { k: pool, v: RawBuffer::new(0x3000_0000, pool.byte_len()), ..Buffers::dense() };
        let params = fp8(&mut buffers)
            .paged_kv(&table, per_row, page_size as i32, num_pages as i32)
            .build()
            .expect("valid params");
        assert_eq!(params.strides(Tensor::V), Strides { batch: page_size * HKV * D, seq: HKV * D, head: D });
        let short = RawBuffer::new(0x3000_0000, pool.byte_len() - 1);
        let mut buffers = Buffers { k: pool, v: short, ..Buffers::dense() };
        let err = rejected(fp8(&mut buffers).paged_kv(&table, per_row, page_size as i32, num_pages as i32));
        assert!(err.message().starts_with("v: the tensor spans"), "{err}");

        let total_k = 150;
        let cu_k = RawBuffer::new(0x6100_0000, (B as usize + 1) * 4);
        let packed = RawBuffer::new(0x2000_0000, (total_k * HKV * D) as usize);
        let mut buffers = Buffers { k: packed, v: RawBuffer::new(0x3000_0000, packed.byte_len()), ..Buffers::dense() };
        let params = fp8(&mut buffers).varlen_k(&cu_k, total_k as i32).build().expect("valid params");
        assert_eq!(params.strides(Tensor::K), Strides { batch: 0, seq: HKV * D, head: D });
    }

    #[test]
    fn descales_reach_the_c_struct_and_must_hold_every_factor() {
        let factors = |address: u64, count: i64| RawBuffer::new(address, count as usize * 4);
        // [B, HKV] for k; [HKV, B] for v (transposed), each exactly big enough.
        let (k_scales, v_scales) = (factors(0x7000_0000, B * HKV), factors(0x7100_0000, B * HKV));
        let mut buffers = fp8_buffers();
        let params = fp8(&mut buffers)
            .k_descale(&k_scales, DescaleStrides::per_head(HKV as i32))
            .v_descale(&v_scales, DescaleStrides { batch: 1, head: B })
            .build()
            .expect("valid params");
        let raw = params.as_raw();
        assert_eq!((raw.k_descale as usize, raw.v_descale as usize), (0x7000_0000, 0x7100_0000));
        assert_eq!((raw.k_descale_batch_stride, raw.k_descale_head_stride), (HKV, 1));
        assert_eq!((raw.v_descale_batch_stride, raw.v_descale_head_stride), (1, B));
        assert!(raw.q_descale.is_null());
        assert_eq!((raw.q_descale_batch_stride, raw.q_descale_head_stride), (0, 0));

        // Per tensor: one f32 each.
        let (k_scale, v_scale) = (factors(0x7000_0000, 1), factors(0x7100_0000, 1));
        let mut buffers = fp8_buffers();
        let params = fp8(&mut buffers)
            .k_descale(&k_scale, DescaleStrides::PER_TENSOR)
            .v_descale(&v_scale, DescaleStrides::default())
            .build()
            .expect("valid params");
        let raw = params.as_raw();
        assert_eq!([raw.k_descale_batch_stride, raw.k_descale_head_stride], [0, 0]);
        assert_eq!([raw.v_descale_batch_stride, raw.v_descale_head_stride], [0, 0]);
        assert!(!raw.k_descale.is_null() && !raw.v_descale.is_null());

        // Only k's: v's stays NULL (1).
        let mut buffers = fp8_buffers();
        let params = fp8(&mut buffers).k_descale(&k_scale, DescaleStrides::PER_TENSOR).build().expect("valid params");
        assert!(params.as_raw().v_descale.is_null());

        // Padded rows: the last factor is at (B - 1) * (HKV + 3) + HKV - 1.
        let padded = DescaleStrides { batch: HKV + 3, head: 1 };
        let needed = (B - 1) * (HKV + 3) + HKV;
        let mut buffers = fp8_buffers();
        let exact = factors(0x7000_0000, needed);
        assert!(fp8(&mut buffers).k_descale(&exact, padded).build().is_ok());
        for (name, short_k, short_v) in [("k_descale", needed - 1, needed), ("v_descale", needed, needed - 1)] {
            let (k_scales, v_scales) = (factors(0x7000_0000, short_k), factors(0x7100_0000, short_v));
            let mut buffers = fp8_buffers();
            let err = rejected(fp8(&mut buffers).k_descale(&k_scales, padded).v_descale(&v_scales, padded));
            assert_eq!(err.status(), Status::InvalidArgument);
            assert_eq!(
                err.message(),
                format!("{name}: the tensor spans {} bytes but its buffer holds {}", needed * 4, (needed - 1) * 4)
            );
        }
        // A single factor does not serve per-head strides.
        let mut buffers = fp8_buffers();
        let err = rejected(fp8(&mut buffers).v_descale(&v_scale, DescaleStrides::per_head(HKV as i32)));
        assert!(err.message().starts_with("v_descale: the tensor spans"), "{err}");
    }

    #[test]
    fn fp8_refusals_come_from_the_library() {
        let scales = RawBuffer::new(0x7000_0000, (B * HKV * 4) as usize);
        let per_head = DescaleStrides::per_head(HKV as i32);
        // k strides of 72 one-byte elements: aligned for fp16, not for fp8.
        let odd = Strides { batch: 0, seq: 72, head: 72 * SK };
        let mut buffers = Buffers { k: RawBuffer::new(0x2000_0000, (72 * SK * HKV * 2) as usize), ..Buffers::dense() };
        assert!(standard(&mut buffers).strides(Tensor::K, odd).build().is_ok());
        let mut buffers = Buffers { k: RawBuffer::new(0x2000_0000, (72 * SK * HKV) as usize), ..fp8_buffers() };
        assert_eq!(rejected(fp8(&mut buffers).strides(Tensor::K, odd)).status(), Status::Misaligned);
        // A head dim that is a multiple of 8 but not of 16: fine in 16 bits.
        let mut buffers = Buffers::dense();
        assert!(standard(&mut buffers).head_dim(56).build().is_ok());
        let mut buffers = fp8_buffers();
        let err = rejected(fp8(&mut buffers).head_dim(56));
        assert!(matches!(err.status(), Status::Unsupported | Status::InvalidArgument), "{err}");
        let mut buffers = fp8_buffers();
        let err = rejected(fp8(&mut buffers).head_dim_v(56));
        assert!(matches!(err.status(), Status::Unsupported | Status::InvalidArgument), "{err}");
        // Descales need an fp8 kv_dtype.
        for kv_dtype in [None, Some(DType::F16)] {
            let mut buffers = Buffers::dense();
            let builder = standard(&mut buffers).k_descale(&scales, per_head);
            let builder = match kv_dtype {
                Some(kv_dtype) => builder.kv_dtype(kv_dtype),
                None => builder,
            };
            let err = rejected(builder);
            assert!(err.message().contains("descale"), "kv_dtype {kv_dtype:?}: {err}");
        }
        // fp8 queries take fp8 k and v only; no f32 k and v.
        let mut buffers = Buffers::dense();
        let err = rejected(standard(&mut buffers).dtype(DType::F8E4M3).kv_dtype(DType::BF16));
        assert_eq!(err.status(), Status::Unsupported, "{err}");
        let mut buffers = Buffers::dense();
        let err = rejected(standard(&mut buffers).kv_dtype(DType::F32));
        assert!(err.message().contains("kv_dtype"), "{err}");
        // Descale arrays: 4-byte aligned, strides >= 0, each named.
        let misaligned = RawBuffer::new(0x7000_0002, scales.byte_len());
        let mut buffers = fp8_buffers();
        assert_eq!(rejected(fp8(&mut buffers).k_descale(&misaligned, per_head)).status(), Status::Misaligned);
        for (name, strides) in [
            ("v_descale_batch_stride", DescaleStrides { batch: -1, head: 1 }),
            ("v_descale_head_stride", DescaleStrides { batch: HKV, head: -1 }),
        ] {
            let mut buffers = fp8_buffers();
            let err = rejected(fp8(&mut buffers).v_descale(&scales, strides));
            assert_eq!(err.status(), Status::InvalidArgument, "{name}: {err}");
            assert!(err.message().contains(name), "{name}: {err}");
        }
    }

    /// Dense buffers of the standard shape for fp8 queries: one-byte q, k
    /// and v, a two-byte (bf16) out.
    fn fp8_prefill_buffers() -> Buffers {
        let (q_bytes, kv_bytes) = ((B * HQ * SQ * D) as usize, (B * HKV * SK * D) as usize);
        Buffers {
            q: RawBuffer::new(0x1000_0000, q_bytes),
            k: RawBuffer::new(0x2000_0000, kv_bytes),
            v: RawBuffer::new(0x3000_0000, kv_bytes),
            out: RawBuffer::new(0x4000_0000, q_bytes * 2),
        }
    }

    /// The standard shape with fp8 queries (and so k and v) on `buffers`.
    fn fp8_prefill(buffers: &mut Buffers) -> ForwardParamsBuilder<'_> {
        standard(buffers).dtype(DType::F8E4M3)
    }

    /// What `build` does but the library's check: the settings assembled
    /// and the buffers checked against them. Shows the crate's own sizes
    /// whatever the loaded library supports.
    fn assembled(builder: ForwardParamsBuilder<'_>) -> Result<ForwardParams<'_>> {
        let params = builder.assemble()?;
        builder.check_buffers(&params)?;
        Ok(params)
    }

    /// Shortens the buffer of `buffers` named `name` by `bytes`.
    fn shorten(name: &str, buffers: &mut Buffers, bytes: usize) {
        let buffer = match name {
            "q" => &mut buffers.q,
            "k" => &mut buffers.k,
            "v" => &mut buffers.v,
            _ => &mut buffers.out,
        };
        *buffer = RawBuffer::new(buffer.device_ptr(), buffer.byte_len() - bytes);
    }

    #[test]
    fn fp8_queries_size_q_k_v_in_bytes_and_out_by_its_own_dtype() {
        // Without the library's verdict: these sizes are the crate's alone.
        let mut buffers = fp8_prefill_buffers();
        let params = assembled(fp8_prefill(&mut buffers)).expect("buffers that fit");
        let raw = params.as_raw();
        assert_eq!((raw.dtype, raw.kv_dtype, raw.out_dtype), (sys::FLASHCORE_DTYPE_FP8_E4M3 as i32, 0, 0));
        // out_dtype 0 is bf16 for fp8 queries; k and v are q's e4m3.
        assert_eq!((params.kv_dtype(), params.out_dtype()), (DType::F8E4M3, DType::BF16));
        let element_dtypes = TENSORS.map(|tensor| params.element_dtype(tensor));
        assert_eq!(element_dtypes, [DType::F8E4M3, DType::F8E4M3, DType::F8E4M3, DType::BF16]);
        // Strides count elements, whatever their size.
        assert_eq!(params.strides(Tensor::Q), Strides { batch: HQ * SQ * D, seq: D, head: SQ * D });
        assert_eq!(params.strides(Tensor::Out), Strides { batch: HQ * SQ * D, seq: D, head: SQ * D });
        assert_eq!(params.extent(Tensor::Q), (B * HQ * SQ * D) as i128);
        assert_eq!(params.extent(Tensor::Out), (B * HQ * SQ * D * 2) as i128);
        // One byte short of q, k, v or out is refused, naming the tensor.
        for name in ["q", "k", "v", "out"] {
            let mut buffers = fp8_prefill_buffers();
            shorten(name, &mut buffers, 1);
            let err = assembled(fp8_prefill(&mut buffers)).expect_err("a short buffer accepted");
            assert_eq!(err.status(), Status::InvalidArgument);
            assert!(err.message().starts_with(&format!("{name}: the tensor spans")), "{name}: {err}");
        }
        // An out buffer sized at q's one byte an element holds half of out.
        let mut buffers =
            Buffers { out: RawBuffer::new(0x4000_0000, (B * HQ * SQ * D) as usize), ..fp8_prefill_buffers() };
        let err = assembled(fp8_prefill(&mut buffers)).expect_err("out sized by q's dtype accepted");
        assert_eq!(
            err.message(),
            format!("out: the tensor spans {} bytes but its buffer holds {}", B * HQ * SQ * D * 2, B * HQ * SQ * D)
        );
        // The same with every dtype given: kv_dtype and out_dtype reach the struct.
        let mut buffers = fp8_prefill_buffers();
        let params = assembled(fp8_prefill(&mut buffers).kv_dtype(DType::F8E4M3).out_dtype(DType::BF16))
            .expect("buffers that fit");
        let raw = params.as_raw();
        let e4m3 = sys::FLASHCORE_DTYPE_FP8_E4M3 as i32;
        assert_eq!((raw.dtype, raw.kv_dtype, raw.out_dtype), (e4m3, e4m3, sys::FLASHCORE_DTYPE_BF16 as i32));
        assert_eq!((params.kv_dtype(), params.out_dtype()), (DType::F8E4M3, DType::BF16));

        // Packed queries: q [total, HQ, D] bytes, out [total, HQ, D] bf16, either layout.
        let total_q = 200;
        let cu_q = RawBuffer::new(0x6000_0000, (B as usize + 1) * 4);
        let packed = |q_short: usize, out_short: usize| Buffers {
            q: RawBuffer::new(0x1000_0000, (total_q * HQ * D) as usize - q_short),
            out: RawBuffer::new(0x4000_0000, (total_q * HQ * D * 2) as usize - out_short),
            ..fp8_prefill_buffers()
        };
        let mut buffers = packed(0, 0);
        let params = assembled(fp8_prefill(&mut buffers).layout(Layout::Bshd).varlen_q(&cu_q, total_q as i32))
            .expect("buffers that fit");
        assert_eq!(params.strides(Tensor::Out), Strides { batch: 0, seq: HQ * D, head: D });
        for (name, mut buffers) in [("q", packed(1, 0)), ("out", packed(0, 1))] {
            let err = assembled(fp8_prefill(&mut buffers).varlen_q(&cu_q, total_q as i32)).expect_err("short");
            assert!(err.message().starts_with(&format!("{name}: the tensor spans")), "{name}: {err}");
        }

        // A 16-bit call's out stays dtype's, given or not.
        let mut buffers = Buffers::dense();
        let params = assembled(standard(&mut buffers).dtype(DType::BF16)).expect("buffers that fit");
        assert_eq!((params.out_dtype(), params.as_raw().out_dtype), (DType::BF16, 0));
        let mut buffers = Buffers::dense();
        let params = assembled(standard(&mut buffers).out_dtype(DType::F16)).expect("buffers that fit");
        assert_eq!((params.out_dtype(), params.as_raw().out_dtype), (DType::F16, sys::FLASHCORE_DTYPE_FP16 as i32));
    }

    #[test]
    fn q_descale_reaches_the_c_struct_and_must_hold_every_factor() {
        let factors = |address: u64, count: i64| RawBuffer::new(address, count as usize * 4);
        let q_scales = factors(0x7200_0000, B * HKV);
        let mut buffers = fp8_prefill_buffers();
        let params = assembled(fp8_prefill(&mut buffers).q_descale(&q_scales, DescaleStrides::per_head(HKV as i32)))
            .expect("factors that fit");
        let raw = params.as_raw();
        assert_eq!(raw.q_descale as usize, 0x7200_0000);
        assert_eq!((raw.q_descale_batch_stride, raw.q_descale_head_stride), (HKV, 1));
        assert!(raw.k_descale.is_null() && raw.v_descale.is_null());

        // Indexed by (batch, K/V head), as k's and v's: [B, HKV] factors, not [B, HQ].
        let short = factors(0x7200_0000, B * HKV - 1);
        let mut buffers = fp8_prefill_buffers();
        let err = assembled(fp8_prefill(&mut buffers).q_descale(&short, DescaleStrides::per_head(HKV as i32)))
            .expect_err("a short q_descale accepted");
        assert_eq!(
            err.message(),
            format!("q_descale: the tensor spans {} bytes but its buffer holds {}", B * HKV * 4, (B * HKV - 1) * 4)
        );
        // Per tensor: one f32.
        let one = factors(0x7200_0000, 1);
        let mut buffers = fp8_prefill_buffers();
        let params = assembled(fp8_prefill(&mut buffers).q_descale(&one, DescaleStrides::PER_TENSOR))
            .expect("one factor for the tensor");
        assert_eq!((params.as_raw().q_descale_batch_stride, params.as_raw().q_descale_head_stride), (0, 0));
        assert!(!params.as_raw().q_descale.is_null());
        // All three, each checked under its own name.
        let (k_scales, v_scales) = (factors(0x7000_0000, B * HKV), factors(0x7100_0000, B * HKV));
        let mut buffers = fp8_prefill_buffers();
        let err = assembled(
            fp8_prefill(&mut buffers)
                .q_descale(&one, DescaleStrides::per_head(HKV as i32))
                .k_descale(&k_scales, DescaleStrides::per_head(HKV as i32))
                .v_descale(&v_scales, DescaleStrides::per_head(HKV as i32)),
        )
        .expect_err("one factor for per-head strides accepted");
        assert!(err.message().starts_with("q_descale: the tensor spans"), "{err}");

        // 16-bit queries take no q_descale: the library says so.
        let mut buffers = Buffers::dense();
        let err = rejected(standard(&mut buffers).q_descale(&q_scales, DescaleStrides::per_head(HKV as i32)));
        assert!(matches!(err.status(), Status::Unsupported | Status::InvalidArgument), "{err}");
        assert!(err.message().contains("q_descale"), "{err}");
    }

    #[test]
    fn fp8_queries_through_the_library() {
        let q_scales = RawBuffer::new(0x7200_0000, (B * HKV * 4) as usize);
        let mut buffers = fp8_prefill_buffers();
        let built = fp8_prefill(&mut buffers).q_descale(&q_scales, DescaleStrides::per_head(HKV as i32)).build();
        let params = match built {
            Ok(params) => params,
            // A library from before fp8 queries, or one whose build has no
            // kernels for them (they run on sm_90a kernels only).
            Err(err) if err.status() == Status::Unsupported => {
                eprintln!("skipped: this library refuses fp8 queries: {err}");
                return;
            }
            Err(err) => panic!("fp8 queries refused: {err}"),
        };
        assert_eq!((params.kv_dtype(), params.out_dtype()), (DType::F8E4M3, DType::BF16));
        assert_eq!(params.as_raw().out_dtype, 0);
        // After the library's check, the crate's: out must hold bf16 elements.
        for (name, bytes) in [("q", 1), ("k", 1), ("v", 1), ("out", 1), ("out", (B * HQ * SQ * D) as usize)] {
            let mut buffers = fp8_prefill_buffers();
            shorten(name, &mut buffers, bytes);
            let err = rejected(fp8_prefill(&mut buffers));
            assert!(err.message().starts_with(&format!("{name}: the tensor spans")), "{name} short by {bytes}: {err}");
        }
        // The library's own rules for fp8 queries.
        let mut buffers = fp8_prefill_buffers();
        assert!(fp8_prefill(&mut buffers).out_dtype(DType::BF16).build().is_ok());
        let mut buffers = fp8_prefill_buffers();
        assert_eq!(rejected(fp8_prefill(&mut buffers).softcap(30.0)).status(), Status::Unsupported);
        // Strides of 72 one-byte elements: not whole 16-byte vectors.
        let odd = Strides { batch: 0, seq: 72, head: 72 * SQ };
        let mut buffers = Buffers { q: RawBuffer::new(0x1000_0000, (72 * SQ * HQ) as usize), ..fp8_prefill_buffers() };
        assert_eq!(rejected(fp8_prefill(&mut buffers).strides(Tensor::Q, odd)).status(), Status::Misaligned);
    }

    /// Packed [total, heads, dim] buffers of `total_q` query and `total_k`
    /// key rows of the standard heads and head dim.
    fn packed(total_q: i64, total_k: i64) -> Buffers {
        let (q_bytes, kv_bytes) = ((total_q * HQ * D * 2) as usize, (total_k * HKV * D * 2) as usize);
        Buffers {
            q: RawBuffer::new(0x1000_0000, q_bytes),
            k: RawBuffer::new(0x2000_0000, kv_bytes),
            v: RawBuffer::new(0x3000_0000, kv_bytes),
            out: RawBuffer::new(0x4000_0000, q_bytes),
        }
    }

    #[test]
    fn varlen_packs_strides_and_reaches_the_c_struct() {
        let (total_q, total_k) = (200, 150);
        let mut buffers = packed(total_q, total_k);
        let (cu_q, cu_k) = (RawBuffer::new(0x6000_0000, (B as usize + 1) * 4), RawBuffer::new(0x6100_0000, 12));
        let mut lse = RawBuffer::new(0x5000_0000, (HQ * total_q * 4) as usize);
        let params = standard(&mut buffers)
            .varlen_q(&cu_q, total_q as i32)
            .varlen_k(&cu_k, total_k as i32)
            .lse(&mut lse)
            .build()
            .expect("valid params");
        let raw = params.as_raw();
        assert_eq!((raw.cu_seqlens_q as usize, raw.total_seqlen_q), (0x6000_0000, total_q as i32));
        assert_eq!((raw.cu_seqlens_k as usize, raw.total_seqlen_k), (0x6100_0000, total_k as i32));
        // Packed rows whatever the layout (the default is BHSD).
        assert_eq!([raw.q_seq_stride, raw.q_head_stride], [HQ * D, D]);
        assert_eq!([raw.k_seq_stride, raw.k_head_stride], [HKV * D, D]);
        // Buffers must hold the totals and batch_size + 1 prefix sums.
        let mut short = packed(total_q - 1, total_k);
        let err = rejected(standard(&mut short).varlen_q(&cu_q, total_q as i32).varlen_k(&cu_k, total_k as i32));
        assert!(err.message().starts_with("q: the tensor spans"), "{}", err.message());
        let mut buffers = packed(total_q, total_k);
        let short_cu = RawBuffer::new(0x6000_0000, B as usize * 4);
        let err = rejected(standard(&mut buffers).varlen_q(&short_cu, total_q as i32).varlen_k(&cu_k, total_k as i32));
        assert!(err.message().starts_with("cu_seqlens_q: the tensor spans"), "{}", err.message());
        let mut buffers = packed(total_q, total_k);
        let mut short_lse = RawBuffer::new(0x5000_0000, (HQ * total_q * 4 - 4) as usize);
        let err = rejected(
            standard(&mut buffers).varlen_q(&cu_q, total_q as i32).varlen_k(&cu_k, total_k as i32).lse(&mut short_lse),
        );
        assert!(err.message().starts_with("lse: the tensor spans"), "{}", err.message());
        // The library's own checks: a total without its prefix sums.
        let mut buffers = Buffers::dense();
        let mut raw = standard(&mut buffers).build().expect("valid params").raw;
        raw.total_seqlen_q = 7;
        // SAFETY: reads the struct only.
        assert_eq!(check(unsafe { sys::flashcore_forward_check(&raw) }).unwrap_err().status(), Status::InvalidArgument);
    }

    #[test]
    fn paged_kv_strides_pool_and_table_extent() {
        let (page_size, num_pages) = (16, 20);
        let pool_bytes = (num_pages * page_size * HKV * D * 2) as usize;
        let q_bytes = (B * HQ * SQ * D * 2) as usize;
        let mut buffers = Buffers {
            q: RawBuffer::new(0x1000_0000, q_bytes),
            k: RawBuffer::new(0x2000_0000, pool_bytes),
            v: RawBuffer::new(0x3000_0000, pool_bytes),
            out: RawBuffer::new(0x4000_0000, q_bytes),
        };
        let per_row = (SK + page_size - 1) / page_size; // 6 pages of 16 for 96 keys
        let table = RawBuffer::new(0x6000_0000, ((B - 1) * per_row + per_row) as usize * 4);
        let params = standard(&mut buffers)
            .paged_kv(&table, per_row, page_size as i32, num_pages as i32)
            .build()
            .expect("valid params");
        let raw = params.as_raw();
        assert_eq!((raw.block_table as usize, raw.block_table_batch_stride), (0x6000_0000, per_row));
        assert_eq!((raw.page_size, raw.num_pages), (page_size as i32, num_pages as i32));
        assert_eq!([raw.k_batch_stride, raw.k_seq_stride, raw.k_head_stride], [page_size * HKV * D, HKV * D, D]);
        // A table row short of ceil(seqlen_k / page_size) entries.
        let mut pooled = Buffers { k: buffers.k, v: buffers.v, ..Buffers::dense() };
        let short = RawBuffer::new(0x6000_0000, table.byte_len() - 4);
        let err = rejected(standard(&mut pooled).paged_kv(&short, per_row, page_size as i32, num_pages as i32));
        assert!(err.message().starts_with("block_table: the tensor spans"), "{}", err.message());
        // Pages of 24 keys: the library refuses them, saying why.
        let err = rejected(standard(&mut pooled).paged_kv(&table, per_row, 24, num_pages as i32));
        assert_eq!(err.status(), Status::Unsupported);
        assert!(err.message().contains("page_size (24) is not supported"), "{}", err.message());
    }

    #[test]
    fn varlen_and_paged_extents_follow_totals_pools_and_head_dim_v() {
        let (total_q, total_k, dv) = (200, 150, 32);
        let cu = RawBuffer::new(0x6000_0000, (B as usize + 1) * 4);
        let cu_k = RawBuffer::new(0x6100_0000, (B as usize + 1) * 4);
        // Packed v and out are [total, heads, head_dim_v], in either layout.
        let (q_bytes, k_bytes) = ((total_q * HQ * D * 2) as usize, (total_k * HKV * D * 2) as usize);
        let (v_bytes, out_bytes) = ((total_k * HKV * dv * 2) as usize, (total_q * HQ * dv * 2) as usize);
        let (q, k, v) = (
            RawBuffer::new(0x1000_0000, q_bytes),
            RawBuffer::new(0x2000_0000, k_bytes),
            RawBuffer::new(0x3000_0000, v_bytes),
        );
        let mut out = RawBuffer::new(0x4000_0000, out_bytes);
        let params = with_head_dims(D, Some(dv), [&q, &k, &v], &mut out)
            .layout(Layout::Bshd)
            .varlen_q(&cu, total_q as i32)
            .varlen_k(&cu_k, total_k as i32)
            .build()
            .expect("valid params");
        assert_eq!(params.strides(Tensor::V), Strides { batch: 0, seq: HKV * dv, head: dv });
        assert_eq!(params.strides(Tensor::Out), Strides { batch: 0, seq: HQ * dv, head: dv });
        // One element short of the totals, for each packed tensor.
        let short = |len: usize| RawBuffer::new(0x7000_0000, len - 2);
        let cases: [(&str, [&RawBuffer; 3], RawBuffer); 4] = [
            ("q", [&short(q_bytes), &k, &v], out),
            ("k", [&q, &short(k_bytes), &v], out),
            ("v", [&q, &k, &short(v_bytes)], out),
            ("out", [&q, &k, &v], short(out_bytes)),
        ];
        for (name, inputs, mut out) in cases {
            let builder = with_head_dims(D, Some(dv), inputs, &mut out);
            let err = rejected(builder.varlen_q(&cu, total_q as i32).varlen_k(&cu_k, total_k as i32));
            assert!(err.message().starts_with(&format!("{name}: the tensor spans")), "{name}: {}", err.message());
        }
        // cu_seqlens_k must hold batch_size + 1 entries too.
        let short_cu_k = RawBuffer::new(0x6100_0000, B as usize * 4);
        let err = rejected(
            with_head_dims(D, Some(dv), [&q, &k, &v], &mut out)
                .varlen_q(&cu, total_q as i32)
                .varlen_k(&short_cu_k, total_k as i32),
        );
        assert_eq!(err.status(), Status::InvalidArgument);
        assert_eq!(
            err.message(),
            format!("cu_seqlens_k: the tensor spans {} bytes but its buffer holds {}", (B + 1) * 4, B * 4)
        );

        // A paged pool of num_pages * page_size rows, with packed queries
        // (chunked prefill on a paged cache); one element short is refused.
        let (page_size, num_pages, per_row) = (32, 7, 3); // ceil(96 / 32) pages per sequence
        let pool = |width: i64| (num_pages * page_size * HKV * width * 2) as usize;
        let table = RawBuffer::new(0x6200_0000, (B * per_row * 4) as usize);
        let (k_pool, v_pool) = (RawBuffer::new(0x2000_0000, pool(D)), RawBuffer::new(0x3000_0000, pool(dv)));
        let params = with_head_dims(D, Some(dv), [&q, &k_pool, &v_pool], &mut out)
            .varlen_q(&cu, total_q as i32)
            .paged_kv(&table, per_row, page_size as i32, num_pages as i32)
            .build()
            .expect("valid params");
        assert_eq!(params.strides(Tensor::V), Strides { batch: page_size * HKV * dv, seq: HKV * dv, head: dv });
        assert!(params.as_raw().cu_seqlens_k.is_null() && params.as_raw().cu_seqlens_q as usize == 0x6000_0000);
        let short_pool = short(pool(dv));
        let err =
            rejected(
                with_head_dims(D, Some(dv), [&q, &k_pool, &short_pool], &mut out)
                    .varlen_q(&cu, total_q as i32)
                    .paged_kv(&table, per_row, page_size as i32, num_pages as i32),
            );
        assert!(err.message().starts_with("v: the tensor spans"), "{}", err.message());
        // The table's last row needs only ceil(seqlen_k / page_size) entries,
        // whatever the row stride.
        let wide = RawBuffer::new(0x6200_0000, ((B - 1) * 10 + per_row) as usize * 4);
        let built = with_head_dims(D, Some(dv), [&q, &k_pool, &v_pool], &mut out)
            .varlen_q(&cu, total_q as i32)
            .paged_kv(&wide, 10, page_size as i32, num_pages as i32)
            .build();
        assert!(built.is_ok(), "{:?}", built.err());

        // The library's refusals come back with its messages, before any
        // extent is computed (page_size 0 divides nothing).
        for (page_size, status, needle) in [
            (0, Status::InvalidArgument, "page_size (0) must be >= 1"),
            (24, Status::Unsupported, "page_size (24) is not supported"),
            (-16, Status::InvalidArgument, "page_size (-16) must be >= 1"),
        ] {
            let err = rejected(
                with_head_dims(D, Some(dv), [&q, &k_pool, &v_pool], &mut out).paged_kv(&table, per_row, page_size, 7),
            );
            assert_eq!(err.status(), status, "page_size {page_size}");
            assert!(err.message().contains(needle), "{}", err.message());
        }
        let err = rejected(
            with_head_dims(D, Some(dv), [&q, &k_pool, &v_pool], &mut out).varlen_k(&cu_k, total_k as i32).paged_kv(
                &table,
                per_row,
                page_size as i32,
                num_pages as i32,
            ),
        );
        assert_eq!(err.status(), Status::InvalidArgument);
        assert!(err.message().contains("cu_seqlens_k and block_table cannot be combined"), "{}", err.message());
        let err = rejected(with_head_dims(D, Some(dv), [&q, &k_pool, &v_pool], &mut out).paged_kv(
            &table,
            per_row,
            page_size as i32,
            0,
        ));
        assert!(err.message().contains("num_pages (0) must be >= 1"), "{}", err.message());
    }

    #[test]
    fn seqused_k_reaches_the_c_struct_and_must_hold_a_count_per_sequence() {
        let mut buffers = Buffers::dense();
        let counts = RawBuffer::new(0x5000_0000, B as usize * 4);
        let params = standard(&mut buffers).seqused_k(&counts).build().expect("valid params");
        assert_eq!(params.as_raw().seqused_k as usize, 0x5000_0000);
        let mut buffers = Buffers::dense();
        let short = RawBuffer::new(0x5000_0000, B as usize * 4 - 1);
        let err = rejected(standard(&mut buffers).seqused_k(&short));
        assert_eq!(err.status(), Status::InvalidArgument);
        assert!(err.message().starts_with("seqused_k: the tensor spans"), "{}", err.message());
        let mut buffers = Buffers::dense();
        let misaligned = RawBuffer::new(0x5000_0002, B as usize * 4);
        assert_eq!(rejected(standard(&mut buffers).seqused_k(&misaligned)).status(), Status::Misaligned);
    }

    #[test]
    fn chunk_sinks_and_sm_margin_reach_the_c_struct() {
        let mut buffers = Buffers::dense();
        let params = standard(&mut buffers).build().expect("valid params");
        assert_eq!((params.attention_chunk(), params.has_sinks(), params.sm_margin()), (0, false, 0));
        assert!(params.as_raw().sinks.is_null());
        let mut buffers = Buffers::dense();
        let sinks = RawBuffer::new(0x5000_0000, HQ as usize * 4);
        let params = standard(&mut buffers)
            .causal(true)
            .window(100, 0)
            .attention_chunk(32)
            .sinks(&sinks)
            .sm_margin(16)
            .build()
            .expect("valid params");
        let raw = params.as_raw();
        assert_eq!((raw.attention_chunk, raw.sinks as usize, raw.causal), (32, 0x5000_0000, 1));
        assert_eq!((raw.sm_margin, params.sm_margin()), (16, 16));
        assert_eq!((params.attention_chunk(), params.has_sinks(), params.window()), (32, true, Some((100, 0))));
    }

    #[test]
    fn chunk_sinks_and_sm_margin_refusals() {
        // A negative chunk, in the library's words.
        let mut buffers = Buffers::dense();
        let err = rejected(standard(&mut buffers).attention_chunk(-1));
        assert_eq!(err.status(), Status::InvalidArgument);
        assert!(err.message().contains("attention_chunk (-1)"), "{err}");
        // A negative sm_margin too; whether it leaves an SM is the handle's to say.
        let mut buffers = Buffers::dense();
        let err = rejected(standard(&mut buffers).sm_margin(-1));
        assert!(err.status() == Status::InvalidArgument && err.message().contains("sm_margin (-1)"), "{err}");
        // The sinks: one f32 per query head, 4-byte aligned, overlapping no output.
        let mut buffers = Buffers::dense();
        let short = RawBuffer::new(0x5000_0000, HQ as usize * 4 - 1);
        let err = rejected(standard(&mut buffers).sinks(&short));
        assert_eq!(err.status(), Status::InvalidArgument);
        assert_eq!(
            err.message(),
            format!("sinks: the tensor spans {} bytes but its buffer holds {}", HQ * 4, HQ * 4 - 1)
        );
        let mut buffers = Buffers::dense();
        let misaligned = RawBuffer::new(0x5000_0002, HQ as usize * 4);
        let err = rejected(standard(&mut buffers).sinks(&misaligned));
        assert!(err.status() == Status::Misaligned && err.message().contains("sinks"), "{err}");
        let mut buffers = Buffers::dense();
        let over_out = RawBuffer::new(buffers.out.device_ptr(), HQ as usize * 4);
        let err = rejected(standard(&mut buffers).sinks(&over_out));
        assert!(err.message().contains("sinks") && err.message().contains("overlaps out"), "{err}");
    }

    #[test]
    fn every_missing_setting_is_named() {
        let err = rejected(ForwardParams::builder());
        assert_eq!(err.status(), Status::InvalidArgument);
        assert_eq!(
            err.message(),
            "not set: batch_size, seqlen_q, seqlen_k, num_heads_q, num_heads_kv, head_dim, q, k, v, out"
        );

        let mut lse = dense_lse();
        let only_lse = ForwardParams::builder().lse(&mut lse).head_dim(64);
        assert!(rejected(only_lse).message().ends_with("num_heads_kv, q, k, v, out"));
    }

    #[test]
    fn strides_follow_the_layout() {
        let mut buffers = Buffers::dense();
        let params = standard(&mut buffers).build().expect("valid params");
        assert_eq!(params.strides(Tensor::Q), Strides { batch: HQ * SQ * D, seq: D, head: SQ * D });
        assert_eq!(params.strides(Tensor::V), Strides { batch: HKV * SK * D, seq: D, head: SK * D });

        let params = standard(&mut buffers).layout(Layout::Bshd).build().expect("valid params");
        assert_eq!(params.strides(Tensor::Out), Strides { batch: SQ * HQ * D, seq: HQ * D, head: D });
        assert_eq!(params.strides(Tensor::K), Strides { batch: SK * HKV * D, seq: HKV * D, head: D });
    }

    #[test]
    fn options_reach_the_c_struct() {
        let mut buffers = Buffers::dense();
        let mut lse = dense_lse();
        let (q_address, out_address, lse_address) =
            (buffers.q.device_ptr(), buffers.out.device_ptr(), lse.device_ptr());
        let params = standard(&mut buffers)
            .dtype(DType::BF16)
            .causal(true)
            .softmax_scale(0.25)
            .num_splits(7)
            .window(32, 0)
            .softcap(30.0)
            .lse(&mut lse)
            .build()
            .expect("valid params");
        let raw = params.as_raw();
        assert_eq!((raw.num_splits, params.num_splits()), (7, 7));
        assert_eq!((raw.use_window, raw.window_left, raw.window_right, raw.softcap), (1, 32, 0, 30.0));
        assert_eq!((params.window(), params.softcap()), (Some((32, 0)), 30.0));
        assert_eq!((raw.dtype, raw.causal, raw.softmax_scale), (sys::FLASHCORE_DTYPE_BF16 as i32, 1, 0.25));
        assert_eq!((raw.batch_size, raw.num_heads_q, raw.num_heads_kv), (B as i32, HQ as i32, HKV as i32));
        assert_eq!((raw.seqlen_q, raw.seqlen_k, raw.head_dim), (SQ as i32, SK as i32, D as i32));
        assert_eq!((raw.q as u64, raw.out as u64, raw.lse as u64), (q_address, out_address, lse_address));
        assert_eq!((raw.head_dim_v, params.head_dim(), params.head_dim_v()), (D as i32, D as i32, D as i32));
    }

    #[test]
    fn head_dim_v_shapes_v_and_out() {
        // DeepSeek-style: q and k 192 wide, v and out 128, in both layouts.
        let (d, dv) = (192, 128);
        // build() asks the library, whose kernels must cover the pair: the
        // default build's do; one for fewer head dims
        // (-DFLASHCORE_HEAD_DIMS) is left out, as the Python tests skip.
        let supported = crate::supported_head_dims().expect("the library's head dims");
        if !supported.iter().any(|&(kd, kdv)| i64::from(kd) >= d && i64::from(kdv) >= dv) {
            eprintln!("skipped: this build has no kernel covering head dims ({d}, {dv}): {supported:?}");
            return;
        }
        let q_bytes = (B * HQ * SQ * d * 2) as usize;
        let k_bytes = (B * HKV * SK * d * 2) as usize;
        let (q, k) = (RawBuffer::new(0x1000_0000, q_bytes), RawBuffer::new(0x2000_0000, k_bytes));
        let v = RawBuffer::new(0x3000_0000, (B * HKV * SK * dv * 2) as usize);
        let mut out = RawBuffer::new(0x4000_0000, (B * HQ * SQ * dv * 2) as usize);
        for layout in [Layout::Bhsd, Layout::Bshd] {
            let params =
                with_head_dims(d, Some(dv), [&q, &k, &v], &mut out).layout(layout).build().expect("valid params");
            assert_eq!((params.head_dim(), params.head_dim_v()), (d as i32, dv as i32));
            assert_eq!((params.as_raw().head_dim, params.as_raw().head_dim_v), (d as i32, dv as i32));
            let (q_strides, v_strides, out_strides) =
                (params.strides(Tensor::Q), params.strides(Tensor::V), params.strides(Tensor::Out));
            match layout {
                Layout::Bhsd => {
                    assert_eq!(q_strides, Strides { batch: HQ * SQ * d, seq: d, head: SQ * d });
                    assert_eq!(v_strides, Strides { batch: HKV * SK * dv, seq: dv, head: SK * dv });
                    assert_eq!(out_strides, Strides { batch: HQ * SQ * dv, seq: dv, head: SQ * dv });
                }
                Layout::Bshd => {
                    assert_eq!(q_strides, Strides { batch: SQ * HQ * d, seq: HQ * d, head: d });
                    assert_eq!(v_strides, Strides { batch: SK * HKV * dv, seq: HKV * dv, head: dv });
                    assert_eq!(out_strides, Strides { batch: SQ * HQ * dv, seq: HQ * dv, head: dv });
                }
            }
        }

        // v and out buffers sized for head_dim_v are exactly big enough, and
        // one element short is refused; a head_dim_v of 0 means head_dim.
        let short_v = RawBuffer::new(v.device_ptr(), v.byte_len() - 2);
        let err = rejected(with_head_dims(d, Some(dv), [&q, &k, &short_v], &mut out));
        assert!(err.message().starts_with("v: "), "{err}");
        let err = rejected(with_head_dims(d, Some(0), [&q, &k, &v], &mut out));
        assert!(err.message().starts_with("v: "), "v and out are too small for head_dim_v = head_dim: {err}");
        let (v_wide, mut out_wide) = (RawBuffer::new(0x3000_0000, k_bytes), RawBuffer::new(0x4000_0000, q_bytes));
        let params = with_head_dims(d, Some(0), [&q, &k, &v_wide], &mut out_wide).build().expect("valid params");
        assert_eq!(params.head_dim_v(), d as i32);
    }

    #[test]
    fn head_dim_v_0_packs_v_and_out_as_head_dim() {
        // head_dim_v 0 is head_dim for the packed and paged strides too, not
        // a width of 0 (which would make every row of v read the same address).
        let (total, page_size, num_pages) = (150, 16, 20);
        let cu = RawBuffer::new(0x6000_0000, (B as usize + 1) * 4);
        let mut buffers = packed(total, total);
        let params = with_head_dims(D, Some(0), [&buffers.q, &buffers.k, &buffers.v], &mut buffers.out)
            .varlen_q(&cu, total as i32)
            .varlen_k(&cu, total as i32)
            .build()
            .expect("valid params");
        assert_eq!(params.strides(Tensor::V), Strides { batch: 0, seq: HKV * D, head: D });
        assert_eq!(params.strides(Tensor::Out), Strides { batch: 0, seq: HQ * D, head: D });
        assert_eq!((params.as_raw().head_dim_v, params.head_dim_v()), (D as i32, D as i32));

        let pool = RawBuffer::new(0x2000_0000, (num_pages * page_size * HKV * D * 2) as usize);
        let table = RawBuffer::new(0x6100_0000, (B * SK / page_size * 4) as usize);
        let mut buffers = Buffers { k: pool, v: RawBuffer::new(0x3000_0000, pool.byte_len()), ..Buffers::dense() };
        let params = with_head_dims(D, Some(0), [&buffers.q, &buffers.k, &buffers.v], &mut buffers.out)
            .paged_kv(&table, SK / page_size, page_size as i32, num_pages as i32)
            .build()
            .expect("valid params");
        assert_eq!(params.strides(Tensor::V), Strides { batch: page_size * HKV * D, seq: HKV * D, head: D });
    }

    #[test]
    fn explicit_strides_replace_derived_ones_and_bound_the_buffer() {
        // q as a BSHD view with rows padded to 512 elements.
        let padded = Strides { batch: SQ * 512, seq: 512, head: D };
        let needed = (((B - 1) * padded.batch + (SQ - 1) * padded.seq + (HQ - 1) * padded.head + D) * 2) as usize;
        let mut buffers = Buffers::dense();
        buffers.q = RawBuffer::new(buffers.q.device_ptr(), needed);
        let params = standard(&mut buffers).strides(Tensor::Q, padded).build().expect("valid params");
        assert_eq!(params.strides(Tensor::Q), padded);
        assert_eq!(params.strides(Tensor::K), Strides { batch: HKV * SK * D, seq: D, head: SK * D });

        buffers.q = RawBuffer::new(buffers.q.device_ptr(), needed - 1);
        let err = rejected(standard(&mut buffers).strides(Tensor::Q, padded));
        assert_eq!(err.status(), Status::InvalidArgument);
        assert!(err.message().starts_with("q: "), "{err}");
    }

    #[test]
    fn buffers_must_hold_their_tensors() {
        let mut buffers = Buffers::dense();
        buffers.out = RawBuffer::new(buffers.out.device_ptr(), buffers.out.byte_len() - 2);
        let err = rejected(standard(&mut buffers));
        assert!(err.message().starts_with("out: "), "{err}");

        let mut buffers = Buffers::dense();
        let mut short_lse = RawBuffer::new(0x5000_0000, dense_lse().byte_len() - 4);
        let err = rejected(standard(&mut buffers).lse(&mut short_lse));
        assert_eq!(err.status(), Status::InvalidArgument);
        assert!(err.message().starts_with("lse: "), "{err}");
    }

    #[test]
    fn library_verdicts_pass_through() {
        type Edit = fn(ForwardParamsBuilder<'_>) -> ForwardParamsBuilder<'_>;
        let cases: [(&str, Edit, Status); 24] = [
            ("head_dim 100, not a multiple of 8", |b| b.head_dim(100), Status::Unsupported),
            ("head_dim 584, wider than every kernel", |b| b.head_dim(584), Status::Unsupported),
            ("head_dim_v 520, wider than every kernel", |b| b.head_dim_v(520), Status::Unsupported),
            ("12 q heads on 5 kv heads", |b| b.num_heads_q(12).num_heads_kv(5), Status::InvalidArgument),
            ("negative batch_size", |b| b.batch_size(-2), Status::InvalidArgument),
            ("negative seqlen_k", |b| b.seqlen_k(-3), Status::InvalidArgument),
            ("negative softmax_scale", |b| b.softmax_scale(-1.0), Status::InvalidArgument),
            ("NaN softmax_scale", |b| b.softmax_scale(f32::NAN), Status::InvalidArgument),
            ("num_splits past the limit", |b| b.num_splits(crate::MAX_NUM_SPLITS + 1), Status::InvalidArgument),
            ("negative num_splits", |b| b.num_splits(-1), Status::InvalidArgument),
            ("f32, a merge-only dtype", |b| b.dtype(DType::F32), Status::Unsupported),
            ("fp8 q over fp16 k and v", |b| b.dtype(DType::F8E4M3).kv_dtype(DType::F16), Status::Unsupported),
            ("fp8 q with an fp16 out", |b| b.dtype(DType::F8E4M3).out_dtype(DType::F16), Status::Unsupported),
            ("fp16 q with a bf16 out", |b| b.out_dtype(DType::BF16), Status::Unsupported),
            ("window left bound below -1", |b| b.window(-2, 0), Status::InvalidArgument),
            ("window right bound below -1", |b| b.window(0, -3), Status::InvalidArgument),
            ("window past the diagonal with causal", |b| b.causal(true).window(16, 1), Status::InvalidArgument),
            ("negative softcap", |b| b.softcap(-1.0), Status::InvalidArgument),
            ("NaN softcap", |b| b.softcap(f32::NAN), Status::InvalidArgument),
            ("infinite softcap", |b| b.softcap(f32::INFINITY), Status::InvalidArgument),
            ("softcap times log2(e) overflows", |b| b.softcap(3e38), Status::InvalidArgument),
            ("softmax_scale / softcap overflows", |b| b.softcap(1e-40), Status::InvalidArgument),
            (
                "negative stride",
                |b| b.strides(Tensor::K, Strides { batch: 0, seq: -64, head: 64 }),
                Status::InvalidArgument,
            ),
            (
                "stride not a multiple of 8",
                |b| b.strides(Tensor::V, Strides { batch: 0, seq: 68, head: 68 * SK }),
                Status::Misaligned,
            ),
        ];
        for (what, edit, expected) in cases {
            let mut buffers = Buffers::dense();
            let err = rejected(edit(standard(&mut buffers)));
            assert_eq!(err.status(), expected, "{what}: {err}");
            assert!(!err.message().is_empty() && !err.message().starts_with("not set"), "{what}: {err}");
        }
    }

    #[test]
    fn every_num_splits_in_range_is_accepted() {
        for n in [0, 1, 2, 3, 7, crate::MAX_NUM_SPLITS] {
            let mut buffers = Buffers::dense();
            let params = standard(&mut buffers).num_splits(n).build().expect("valid num_splits");
            assert_eq!(params.num_splits(), n);
        }
    }

    #[test]
    fn every_window_and_softcap_in_range_is_accepted() {
        let windows = [(0, 0, false), (1, -1, false), (-1, -1, false), (17, 9, false), (63, 0, true), (63, -1, true)];
        for (left, right, causal) in windows.into_iter().chain([(i32::MAX, i32::MAX, false)]) {
            let mut buffers = Buffers::dense();
            let params = standard(&mut buffers).causal(causal).window(left, right).build().expect("valid window");
            assert_eq!(params.window(), Some((left, right)));
            let raw = params.as_raw();
            assert_eq!((raw.use_window, raw.window_left, raw.window_right), (1, left, right));
            assert_eq!(raw.causal, i32::from(causal));
        }
        for softcap in [0.0, 0.5, 30.0, 50.0, 1e30] {
            let mut buffers = Buffers::dense();
            let params = standard(&mut buffers).softcap(softcap).build().expect("valid softcap");
            assert_eq!((params.softcap(), params.as_raw().softcap, params.window()), (softcap, softcap, None));
        }
    }

    #[test]
    fn window_refusals_name_the_bound() {
        let mut buffers = Buffers::dense();
        let err = rejected(standard(&mut buffers).window(-2, 0));
        assert!(err.message().contains("window_left (-2)"), "{err}");
        let mut buffers = Buffers::dense();
        let err = rejected(standard(&mut buffers).causal(true).window(8, 1));
        assert!(err.message().contains("window_right (1)") && err.message().contains("causal"), "{err}");
        let mut buffers = Buffers::dense();
        let err = rejected(standard(&mut buffers).softcap(-1.0));
        assert!(err.message().contains("softcap"), "{err}");
    }

    #[test]
    fn misaligned_pointers_are_reported_by_the_library() {
        let mut buffers = Buffers::dense();
        let shifted = RawBuffer::new(buffers.k.device_ptr() + 8, buffers.k.byte_len());
        let err = rejected(standard(&mut buffers).k(&shifted));
        assert_eq!(err.status(), Status::Misaligned, "{err}");
    }
}
