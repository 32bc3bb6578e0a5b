//! Merging attention results computed over parts of the keys
//! (`flashcore_merge_states`): parameters and their builder.

use crate::buffer::{DeviceBuffer, RawBuffer};
use crate::error::{check, Error, Result, Status};
use crate::params::{device_address, ensure_fits, tensor_extent, DType, Layout, Missing, Strides};
use crate::sys;
use std::marker::PhantomData;

/// Element strides (not bytes) of a tensor with a leading state axis:
/// `partial_out` (`[num_states, batch, heads, seqlen, head_dim]`, head_dim
/// contiguous) or `partial_lse` (`[num_states, batch, heads, seqlen]`).
///
/// For `partial_out` the library requires them to be >= 0 and multiples of
/// [`ALIGNMENT`](crate::ALIGNMENT) / element size (8 for fp16 and bf16, 4
/// for f32); `partial_lse`'s may be any element strides.
///
/// ```
/// use flashcore::StateStrides;
/// // partial_lse as [K, B, H, S] view of [B, H, S, K] storage (K = 4, H = 8, S = 100).
/// let interleaved = StateStrides { state: 1, batch: 8 * 100 * 4, seq: 4, head: 100 * 4 };
/// assert_eq!(interleaved.state, 1);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct StateStrides {
    /// Elements from one partial result to the next.
    pub state: i64,
    /// Elements from one batch entry to the next.
    pub batch: i64,
    /// Elements from one sequence position to the next.
    pub seq: i64,
    /// Elements from one head to the next.
    pub head: i64,
}

/// A merge params struct holding the library's defaults (`flashcore_merge_params_init`).
fn init_raw() -> Result<sys::flashcore_merge_params> {
    // SAFETY: the struct holds only integers and raw pointers, for which
    // all-zero bytes are valid values; init writes exactly its size.
    let mut raw: sys::flashcore_merge_params = unsafe { std::mem::zeroed() };
    check(unsafe { sys::flashcore_merge_params_init(&mut raw, std::mem::size_of_val(&raw)) })?;
    Ok(raw)
}

/// A description of one merge of partial attention results, ready for
/// [`Handle::merge_states`](crate::Handle::merge_states):
///
/// ```text
/// lse = ln Σₛ exp(partial_lse[s]),   out = Σₛ exp(partial_lse[s] − lse) · partial_out[s]
/// ```
///
/// Attention over keys split into parts (a KV cache spread over devices, a
/// shared prefix cached apart from each request's own keys, ...) is computed
/// part by part with [`Handle::forward`](crate::Handle::forward), each part's
/// out and lse stored as one state, and merged exactly. A part in which a
/// row sees no key has lse −∞ and contributes nothing; a row that no part
/// sees gets out = 0 and lse = −∞, as a forward call gives it. With
/// learnable sinks ([`MergeParamsBuilder::sinks`]) each head's sink is one
/// more part, of lse `sinks[h]` and output 0.
///
/// Logical shapes (with [`Layout::Bshd`], seqlen and heads swap places in
/// partial_out and out; partial_lse and lse keep forward's lse order):
///
/// | tensor | shape | type |
/// |---|---|---|
/// | partial_out | `[num_states, batch_size, num_heads, seqlen, head_dim]` | partial dtype |
/// | partial_lse | `[num_states, batch_size, num_heads, seqlen]` | f32 |
/// | out | `[batch_size, num_heads, seqlen, head_dim]` | out dtype |
/// | lse (optional) | `[batch_size, num_heads, seqlen]`, contiguous | f32 |
///
/// Made by [`MergeParams::builder`]. The params borrow their buffers for
/// `'a` (the partials shared, out and lse exclusively).
///
/// ```
/// use flashcore::{DType, Layout, MergeParams, RawBuffer, StateStrides};
///
/// // Two partial results of [1, 128, 8, 64] (BSHD) bf16 attention, merged
/// // into f32. Made-up aligned addresses: building touches no GPU.
/// let states = 2 * 128 * 8 * 64;
/// let partial_out = RawBuffer::new(0x10_0000, states * 2);
/// let partial_lse = RawBuffer::new(0x20_0000, 2 * 8 * 128 * 4);
/// let mut out = RawBuffer::new(0x30_0000, 128 * 8 * 64 * 4);
/// let params = MergeParams::builder()
///     .num_states(2)
///     .batch_size(1)
///     .num_heads(8)
///     .seqlen(128)
///     .head_dim(64)
///     .partial_dtype(DType::BF16)
///     .out_dtype(DType::F32)
///     .layout(Layout::Bshd)
///     .partial_out(&partial_out)
///     .partial_lse(&partial_lse)
///     .out(&mut out)
///     .build()?;
/// assert_eq!(params.partial_out_strides(), StateStrides { state: 128 * 8 * 64, batch: 128 * 8 * 64, seq: 8 * 64, head: 64 });
/// # Ok::<(), flashcore::Error>(())
/// ```
#[derive(Debug)]
pub struct MergeParams<'a> {
    raw: sys::flashcore_merge_params,
    buffers: PhantomData<&'a mut ()>,
}

impl<'a> MergeParams<'a> {
    /// Starts a builder with the defaults: f16 partials, out of the
    /// partials' dtype, densely packed [`Layout::Bhsd`], no lse.
    pub fn builder() -> MergeParamsBuilder<'a> {
        MergeParamsBuilder::default()
    }

    /// The C struct, for calling `flashcore-sys` directly.
    pub fn as_raw(&self) -> &sys::flashcore_merge_params {
        &self.raw
    }

    /// Strides of partial_out, as given or as derived from the layout.
    pub fn partial_out_strides(&self) -> StateStrides {
        let r = &self.raw;
        StateStrides {
            state: r.partial_state_stride,
            batch: r.partial_batch_stride,
            seq: r.partial_seq_stride,
            head: r.partial_head_stride,
        }
    }

    /// Strides of partial_lse, as given or dense `[num_states, batch, heads, seqlen]`.
    pub fn partial_lse_strides(&self) -> StateStrides {
        let r = &self.raw;
        StateStrides {
            state: r.lse_state_stride,
            batch: r.lse_batch_stride,
            seq: r.lse_seq_stride,
            head: r.lse_head_stride,
        }
    }

    /// Strides of out, as given or as derived from the layout.
    pub fn out_strides(&self) -> Strides {
        let r = &self.raw;
        Strides { batch: r.out_batch_stride, seq: r.out_seq_stride, head: r.out_head_stride }
    }
}

/// Builds [`MergeParams`].
///
/// [`build`](MergeParamsBuilder::build) reports every required setting that
/// was never given, derives the strides not given from the layout and
/// checks that each tensor fits in its buffer. The C API has no separate
/// check for merges: the library validates the rest (sizes, dtypes,
/// alignment, strides, overlaps) when
/// [`Handle::merge_states`](crate::Handle::merge_states) is called, and a
/// call it refuses queues nothing and returns its status and message.
///
/// Required: the five sizes and partial_out, partial_lse, out. Optional:
/// [`partial_dtype`], [`out_dtype`], [`layout`] or the explicit strides,
/// [`lse`], [`sinks`].
///
/// [`sinks`]: MergeParamsBuilder::sinks
/// [`partial_dtype`]: MergeParamsBuilder::partial_dtype
/// [`out_dtype`]: MergeParamsBuilder::out_dtype
/// [`layout`]: MergeParamsBuilder::layout
/// [`lse`]: MergeParamsBuilder::lse
///
/// ```
/// use flashcore::{MergeParams, Status};
///
/// let err = MergeParams::builder().num_states(2).build().unwrap_err();
/// assert_eq!(err.status(), Status::InvalidArgument);
/// assert_eq!(err.message(), "not set: batch_size, num_heads, seqlen, head_dim, partial_out, partial_lse, out");
/// ```
#[derive(Debug, Default)]
#[must_use = "a builder does nothing until build() is called"]
pub struct MergeParamsBuilder<'a> {
    partial_dtype: DType,
    out_dtype: Option<DType>,
    num_states: Option<i32>,
    batch_size: Option<i32>,
    num_heads: Option<i32>,
    seqlen: Option<i32>,
    head_dim: Option<i32>,
    layout: Layout,
    partial_out_strides: Option<StateStrides>,
    partial_lse_strides: Option<StateStrides>,
    out_strides: Option<Strides>,
    partial_out: Option<RawBuffer>,
    partial_lse: Option<RawBuffer>,
    out: Option<RawBuffer>,
    lse: Option<RawBuffer>,
    sinks: Option<RawBuffer>,
    buffers: PhantomData<&'a mut ()>,
}

fn raw_buffer<B: DeviceBuffer + ?Sized>(buffer: &B) -> Option<RawBuffer> {
    Some(RawBuffer::new(buffer.device_ptr(), buffer.byte_len()))
}

/// `value`, or an error naming `what` when it does not fit an i64 stride.
fn stride(what: &str, value: i128) -> Result<i64> {
    i64::try_from(value).map_err(|_| Error::new(Status::InvalidArgument, format!("{what}: {value} elements overflow")))
}

impl<'a> MergeParamsBuilder<'a> {
    /// Partial results to merge (required), >= 1.
    pub fn num_states(mut self, num_states: i32) -> Self {
        self.num_states = Some(num_states);
        self
    }

    /// Batch size (required).
    pub fn batch_size(mut self, batch_size: i32) -> Self {
        self.batch_size = Some(batch_size);
        self
    }

    /// Heads (required): the query heads of the forward calls.
    pub fn num_heads(mut self, num_heads: i32) -> Self {
        self.num_heads = Some(num_heads);
        self
    }

    /// Sequence length (required): seqlen_q of the forward calls.
    pub fn seqlen(mut self, seqlen: i32) -> Self {
        self.seqlen = Some(seqlen);
        self
    }

    /// Width of each output row (required): head_dim_v of the forward
    /// calls, a multiple of 8.
    pub fn head_dim(mut self, head_dim: i32) -> Self {
        self.head_dim = Some(head_dim);
        self
    }

    /// Element type of partial_out (default [`DType::F16`]); F16, BF16 or F32.
    pub fn partial_dtype(mut self, dtype: DType) -> Self {
        self.partial_dtype = dtype;
        self
    }

    /// Element type of out (default: the partials' dtype); F16, BF16 or F32.
    /// The merge computes in f32 whatever the dtypes.
    pub fn out_dtype(mut self, dtype: DType) -> Self {
        self.out_dtype = Some(dtype);
        self
    }

    /// Derives the strides of densely packed partial_out
    /// (`[num_states, batch, ...]`) and out in `layout` (default
    /// [`Layout::Bhsd`]); partial_lse is dense `[num_states, batch, heads,
    /// seqlen]` in both. The explicit stride setters override single tensors.
    pub fn layout(mut self, layout: Layout) -> Self {
        self.layout = layout;
        self
    }

    /// Explicit element strides of partial_out, e.g. for partial results
    /// that are slices of a larger buffer.
    pub fn partial_out_strides(mut self, strides: StateStrides) -> Self {
        self.partial_out_strides = Some(strides);
        self
    }

    /// Explicit element strides of partial_lse (any; 4-byte elements need
    /// no alignment beyond their own).
    pub fn partial_lse_strides(mut self, strides: StateStrides) -> Self {
        self.partial_lse_strides = Some(strides);
        self
    }

    /// Explicit element strides of out.
    pub fn out_strides(mut self, strides: Strides) -> Self {
        self.out_strides = Some(strides);
        self
    }

    /// Device memory holding the partial outputs (required).
    pub fn partial_out<B: DeviceBuffer + ?Sized>(mut self, buffer: &'a B) -> Self {
        self.partial_out = raw_buffer(buffer);
        self
    }

    /// Device memory holding the partial log-sum-exps, f32 (required).
    pub fn partial_lse<B: DeviceBuffer + ?Sized>(mut self, buffer: &'a B) -> Self {
        self.partial_lse = raw_buffer(buffer);
        self
    }

    /// Device memory the merged output is written to (required).
    pub fn out<B: DeviceBuffer + ?Sized>(mut self, buffer: &'a mut B) -> Self {
        self.out = raw_buffer(buffer);
        self
    }

    /// Device memory for the merged log-sum-exp, `[batch_size, num_heads,
    /// seqlen]` f32, contiguous (optional; not written when absent).
    pub fn lse<B: DeviceBuffer + ?Sized>(mut self, buffer: &'a mut B) -> Self {
        self.lse = raw_buffer(buffer);
        self
    }

    /// Learnable sinks (optional), as
    /// [`ForwardParamsBuilder::sinks`](crate::ForwardParamsBuilder::sinks):
    /// device memory holding `[num_heads]` f32 logits, 4-byte aligned. Head
    /// h's sink joins each of its rows as one more part, of lse `sinks[h]`
    /// and output 0: `lse = ln(exp(sinks[h]) + Σₛ exp(partial_lse[s]))`,
    /// `out = Σₛ exp(partial_lse[s] − lse) · partial_out[s]`; a row that no
    /// part sees gets out = 0 and lse = `sinks[h]`. Give them only to the
    /// merge of all of a row's parts, each computed without sinks: a merge
    /// whose result is merged again would count the sink twice.
    /// [`build`](Self::build) checks that the buffer holds num_heads floats.
    pub fn sinks<B: DeviceBuffer + ?Sized>(mut self, buffer: &'a B) -> Self {
        self.sinks = raw_buffer(buffer);
        self
    }

    /// Checks what only the Rust side can see and returns the params; see
    /// the type's documentation. Touches no GPU.
    pub fn build(self) -> Result<MergeParams<'a>> {
        let mut missing = Missing::default();
        let num_states = missing.size("num_states", self.num_states);
        let batch_size = missing.size("batch_size", self.batch_size);
        let num_heads = missing.size("num_heads", self.num_heads);
        let seqlen = missing.size("seqlen", self.seqlen);
        let head_dim = missing.size("head_dim", self.head_dim);
        for (name, buffer) in
            [("partial_out", &self.partial_out), ("partial_lse", &self.partial_lse), ("out", &self.out)]
        {
            missing.buffer(name, buffer);
        }
        missing.check()?;

        let (batch, heads, seq, width) =
            (i128::from(batch_size), i128::from(num_heads), i128::from(seqlen), i128::from(head_dim));
        let dense = |what: &str, layout: Layout| -> Result<Strides> {
            let (batch_stride, seq_stride, head_stride) = match layout {
                Layout::Bhsd => (heads * seq * width, width, seq * width),
                Layout::Bshd => (seq * heads * width, heads * width, width),
            };
            Ok(Strides {
                batch: stride(what, batch_stride)?,
                seq: stride(what, seq_stride)?,
                head: stride(what, head_stride)?,
            })
        };
        let out_strides = match self.out_strides {
            Some(strides) => strides,
            None => dense("out", self.layout)?,
        };
        let partial_out_strides = match self.partial_out_strides {
            Some(strides) => strides,
            None => {
                let s = dense("partial_out", self.layout)?;
                let state = stride("partial_out", batch * i128::from(s.batch))?;
                StateStrides { state, batch: s.batch, seq: s.seq, head: s.head }
            }
        };
        let partial_lse_strides = match self.partial_lse_strides {
            Some(strides) => strides,
            None => StateStrides {
                state: stride("partial_lse", batch * heads * seq)?,
                batch: stride("partial_lse", heads * seq)?,
                seq: 1,
                head: stride("partial_lse", seq)?,
            },
        };

        let out_dtype = self.out_dtype.unwrap_or(self.partial_dtype);
        let mut raw = init_raw()?;
        raw.partial_dtype = self.partial_dtype.to_raw();
        raw.out_dtype = out_dtype.to_raw();
        (raw.num_states, raw.batch_size, raw.num_heads, raw.seqlen, raw.head_dim) =
            (num_states, batch_size, num_heads, seqlen, head_dim);
        let p = partial_out_strides;
        (raw.partial_state_stride, raw.partial_batch_stride, raw.partial_seq_stride, raw.partial_head_stride) =
            (p.state, p.batch, p.seq, p.head);
        let l = partial_lse_strides;
        (raw.lse_state_stride, raw.lse_batch_stride, raw.lse_seq_stride, raw.lse_head_stride) =
            (l.state, l.batch, l.seq, l.head);
        (raw.out_batch_stride, raw.out_seq_stride, raw.out_head_stride) =
            (out_strides.batch, out_strides.seq, out_strides.head);
        raw.partial_out = device_address(self.partial_out);
        raw.partial_lse = device_address(self.partial_lse).cast();
        raw.out = device_address(self.out);
        raw.lse = device_address(self.lse).cast();
        raw.sinks = device_address(self.sinks).cast();

        let f32_size = std::mem::size_of::<f32>();
        let partial = [(num_states, p.state), (batch_size, p.batch), (seqlen, p.seq), (num_heads, p.head)];
        let partial_lse = [(num_states, l.state), (batch_size, l.batch), (seqlen, l.seq), (num_heads, l.head)];
        let out = [(batch_size, out_strides.batch), (seqlen, out_strides.seq), (num_heads, out_strides.head)];
        let [partial_out_buffer, partial_lse_buffer, out_buffer] =
            [self.partial_out, self.partial_lse, self.out].map(|b| b.expect("checked above"));
        let partial_bytes = tensor_extent(&partial, head_dim, self.partial_dtype.size_of());
        ensure_fits("partial_out", partial_bytes, &partial_out_buffer)?;
        ensure_fits("partial_lse", tensor_extent(&partial_lse, 1, f32_size), &partial_lse_buffer)?;
        ensure_fits("out", tensor_extent(&out, head_dim, out_dtype.size_of()), &out_buffer)?;
        if let Some(lse) = &self.lse {
            ensure_fits("lse", batch * heads * seq * f32_size as i128, lse)?;
        }
        if let Some(sinks) = &self.sinks {
            ensure_fits("sinks", heads * f32_size as i128, sinks)?;
        }
        Ok(MergeParams { raw, buffers: PhantomData })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Standard test shape.
    const K: i64 = 3;
    const B: i64 = 2;
    const H: i64 = 4;
    const S: i64 = 50;
    const D: i64 = 64;

    /// Made-up, aligned, disjoint device addresses, each exactly the size of
    /// its dense tensor (f16 partials and out).
    struct Buffers {
        partial_out: RawBuffer,
        partial_lse: RawBuffer,
        out: RawBuffer,
        lse: RawBuffer,
    }

    impl Buffers {
        fn dense() -> Buffers {
            Buffers {
                partial_out: RawBuffer::new(0x1000_0000, (K * B * H * S * D * 2) as usize),
                partial_lse: RawBuffer::new(0x2000_0000, (K * B * H * S * 4) as usize),
                out: RawBuffer::new(0x3000_0000, (B * H * S * D * 2) as usize),
                lse: RawBuffer::new(0x4000_0000, (B * H * S * 4) as usize),
            }
        }
    }

    fn standard(buffers: &mut Buffers) -> MergeParamsBuilder<'_> {
        MergeParams::builder()
            .num_states(K as i32)
            .batch_size(B as i32)
            .num_heads(H as i32)
            .seqlen(S as i32)
            .head_dim(D as i32)
            .partial_out(&buffers.partial_out)
            .partial_lse(&buffers.partial_lse)
            .out(&mut buffers.out)
    }

    fn rejected(builder: MergeParamsBuilder<'_>) -> Error {
        builder.build().expect_err("the builder accepted invalid params")
    }

    #[test]
    fn defaults_and_sizes_reach_the_c_struct() {
        let mut buffers = Buffers::dense();
        let addresses = [buffers.partial_out, buffers.partial_lse, buffers.out].map(|b| b.device_ptr());
        let params = standard(&mut buffers).build().expect("valid params");
        let raw = params.as_raw();
        assert_eq!(raw.struct_size, std::mem::size_of::<sys::flashcore_merge_params>());
        let fp16 = sys::FLASHCORE_DTYPE_FP16 as i32;
        assert_eq!((raw.partial_dtype, raw.out_dtype), (fp16, fp16));
        assert_eq!([raw.num_states, raw.batch_size, raw.num_heads, raw.seqlen, raw.head_dim], [3, 2, 4, 50, 64]);
        assert_eq!([raw.partial_out as u64, raw.partial_lse as u64, raw.out as u64], addresses);
        assert!(raw.lse.is_null());
    }

    #[test]
    fn dtypes_and_lse_reach_the_c_struct() {
        let mut buffers = Buffers::dense();
        let mut lse = buffers.lse;
        let partial_out = RawBuffer::new(0x1000_0000, buffers.partial_out.byte_len() * 2); // f32
        let params = standard(&mut buffers)
            .partial_out(&partial_out)
            .partial_dtype(DType::F32)
            .out_dtype(DType::BF16)
            .lse(&mut lse)
            .build()
            .expect("valid params");
        let raw = params.as_raw();
        assert_eq!(
            (raw.partial_dtype, raw.out_dtype),
            (sys::FLASHCORE_DTYPE_FP32 as i32, sys::FLASHCORE_DTYPE_BF16 as i32)
        );
        assert_eq!(raw.lse as u64, 0x4000_0000);
        // out_dtype defaults to the partials' dtype.
        let mut buffers = Buffers::dense();
        let params = standard(&mut buffers).partial_dtype(DType::BF16).build().expect("valid params");
        assert_eq!(params.as_raw().out_dtype, sys::FLASHCORE_DTYPE_BF16 as i32);
    }

    #[test]
    fn strides_follow_the_layout() {
        let mut buffers = Buffers::dense();
        let params = standard(&mut buffers).build().expect("valid params");
        let state = B * H * S * D;
        assert_eq!(params.partial_out_strides(), StateStrides { state, batch: H * S * D, seq: D, head: S * D });
        assert_eq!(params.out_strides(), Strides { batch: H * S * D, seq: D, head: S * D });
        let lse = StateStrides { state: B * H * S, batch: H * S, seq: 1, head: S };
        assert_eq!(params.partial_lse_strides(), lse);

        let params = standard(&mut buffers).layout(Layout::Bshd).build().expect("valid params");
        assert_eq!(params.partial_out_strides(), StateStrides { state, batch: S * H * D, seq: H * D, head: D });
        assert_eq!(params.out_strides(), Strides { batch: S * H * D, seq: H * D, head: D });
        assert_eq!(params.partial_lse_strides(), lse, "partial_lse is [K, B, H, S] in every layout");
        let raw = params.as_raw();
        assert_eq!(
            [raw.partial_state_stride, raw.partial_seq_stride, raw.lse_head_stride, raw.out_seq_stride],
            [state, H * D, S, H * D]
        );
    }

    #[test]
    fn explicit_strides_replace_derived_ones_and_bound_the_buffers() {
        // partial_lse as a [K, B, H, S] view of [B, H, S, K] storage: same bytes, other strides.
        let interleaved = StateStrides { state: 1, batch: H * S * K, seq: K, head: S * K };
        // out as [B, H, S, D] rows padded to 128 elements.
        let padded = Strides { batch: H * S * 128, seq: 128, head: S * 128 };
        let mut buffers = Buffers::dense();
        buffers.out = RawBuffer::new(
            0x3000_0000,
            (((B - 1) * padded.batch + (H - 1) * padded.head + (S - 1) * 128 + D) * 2) as usize,
        );
        let params =
            standard(&mut buffers).partial_lse_strides(interleaved).out_strides(padded).build().expect("valid params");
        assert_eq!((params.partial_lse_strides(), params.out_strides()), (interleaved, padded));

        buffers.out = RawBuffer::new(0x3000_0000, buffers.out.byte_len() - 2);
        let err = rejected(standard(&mut buffers).partial_lse_strides(interleaved).out_strides(padded));
        assert_eq!(err.status(), Status::InvalidArgument);
        assert!(err.message().starts_with("out: "), "{err}");

        // Partial results that are every other slot of a larger buffer.
        let mut buffers = Buffers::dense();
        let spaced = StateStrides { state: 2 * B * H * S * D, batch: H * S * D, seq: D, head: S * D };
        let err = rejected(standard(&mut buffers).partial_out_strides(spaced));
        assert!(err.message().starts_with("partial_out: "), "{err}");
        buffers.partial_out = RawBuffer::new(0x1000_0000, ((2 * (K - 1) + 1) * B * H * S * D * 2) as usize);
        let params = standard(&mut buffers).partial_out_strides(spaced).build().expect("valid params");
        assert_eq!(params.partial_out_strides(), spaced);
    }

    #[test]
    fn buffers_must_hold_their_tensors() {
        for (name, shrink) in [
            ("partial_out", (|b: &mut Buffers| &mut b.partial_out) as fn(&mut Buffers) -> &mut RawBuffer),
            ("partial_lse", |b| &mut b.partial_lse),
            ("out", |b| &mut b.out),
        ] {
            let mut buffers = Buffers::dense();
            let buffer = shrink(&mut buffers);
            *buffer = RawBuffer::new(buffer.device_ptr(), buffer.byte_len() - 1);
            let err = rejected(standard(&mut buffers));
            assert_eq!(err.status(), Status::InvalidArgument);
            assert!(err.message().starts_with(&format!("{name}: ")), "{err}");
        }
        let mut buffers = Buffers::dense();
        let mut short_lse = RawBuffer::new(0x4000_0000, buffers.lse.byte_len() - 4);
        let err = rejected(standard(&mut buffers).lse(&mut short_lse));
        assert!(err.message().starts_with("lse: "), "{err}");
        // f32 out needs twice the bytes of the f16 partials' out.
        let mut buffers = Buffers::dense();
        let err = rejected(standard(&mut buffers).out_dtype(DType::F32));
        assert!(err.message().starts_with("out: "), "{err}");
    }

    #[test]
    fn sinks_reach_the_c_struct_and_must_hold_a_float_per_head() {
        let mut buffers = Buffers::dense();
        let params = standard(&mut buffers).build().expect("valid params");
        assert!(params.as_raw().sinks.is_null());
        let sinks = RawBuffer::new(0x5000_0000, H as usize * 4);
        let mut buffers = Buffers::dense();
        let params = standard(&mut buffers).sinks(&sinks).build().expect("valid params");
        assert_eq!(params.as_raw().sinks as usize, 0x5000_0000);
        // The library's own check takes them (the merge's checks run before any GPU is looked at).
        assert_eq!(unsafe { sys::flashcore_merge_check(params.as_raw()) }, sys::FLASHCORE_STATUS_SUCCESS);
        let short = RawBuffer::new(0x5000_0000, H as usize * 4 - 1);
        let mut buffers = Buffers::dense();
        let err = rejected(standard(&mut buffers).sinks(&short));
        assert_eq!(
            err.message(),
            format!("sinks: the tensor spans {} bytes but its buffer holds {}", H * 4, H * 4 - 1)
        );
        let misaligned = RawBuffer::new(0x5000_0002, H as usize * 4);
        let mut buffers = Buffers::dense();
        let params = standard(&mut buffers).sinks(&misaligned).build().expect("the crate checks sizes only");
        assert_eq!(unsafe { sys::flashcore_merge_check(params.as_raw()) }, sys::FLASHCORE_STATUS_MISALIGNED);
    }

    #[test]
    fn every_missing_setting_is_named() {
        let err = rejected(MergeParams::builder());
        assert_eq!(err.status(), Status::InvalidArgument);
        assert_eq!(
            err.message(),
            "not set: num_states, batch_size, num_heads, seqlen, head_dim, partial_out, partial_lse, out"
        );
    }

    #[test]
    fn strides_that_overflow_are_refused() {
        let mut buffers = Buffers::dense();
        let huge = standard(&mut buffers).batch_size(i32::MAX).num_heads(i32::MAX).seqlen(i32::MAX);
        let err = rejected(huge);
        assert_eq!(err.status(), Status::InvalidArgument);
        assert!(err.message().contains("overflow"), "{err}");
    }
}
