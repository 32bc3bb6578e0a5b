//! Runs flashcore on the GPU and checks it against a CPU reference in f64
//! (the backward pass's tests, and its reference, are in backward.rs).
//!
//! Device memory comes from the CUDA driver API, loaded at run time, so this
//! binary starts anywhere. Without a GPU (no libcuda.so.1, or no device) the
//! GPU tests report themselves ignored, with the reason (see harness.rs),
//! after checking that flashcore agrees there is no device; the tests of the
//! CPU reference and of handle creation run everywhere. Build it with
//! `cargo test --no-run`; scripts/build-device-test.sh copies it to
//! device/flashcore_gpu_test.

// A test function left out of main's list would never run: make that an error.
#![deny(dead_code)]

mod backward;
mod cuda;
mod fp8;
mod fp8_prefill;
mod half;
#[macro_use]
mod harness;

use backward::{
    backward_matches_cpu_reference, backward_reference_matches_finite_differences,
    backward_without_queries_zeroes_dk_and_dv, varlen_backward_matches_cpu_reference,
};
use cuda::Gpu;
use flashcore::{
    DType, DeviceBuffer, ForwardParams, ForwardParamsBuilder, Handle, Layout, MergeParams, RawBuffer, StateStrides,
    Status, Strides, Tensor,
};
use fp8::{e4m3_values_follow_the_format, fp8_kv_cache_matches_cpu_reference};
use fp8_prefill::{e4m3_quantization_rounds_to_nearest_even, fp8_prefill_matches_cpu_reference};
use harness::{Outcome, Skip};

fn main() -> std::process::ExitCode {
    harness::run(&tests![
        handle_creation_agrees_with_the_driver,
        reference_averages_visible_values_when_scores_tie,
        reference_windows_follow_the_rule,
        forward_matches_cpu_reference,
        head_dims_without_a_kernel_round_up,
        one_handle_serves_several_threads,
        num_splits_matches_cpu_reference,
        window_and_softcap_match_cpu_reference,
        page_table_pools_every_key_once,
        varlen_and_paged_match_cpu_reference,
        e4m3_values_follow_the_format,
        fp8_kv_cache_matches_cpu_reference,
        e4m3_quantization_rounds_to_nearest_even,
        fp8_prefill_matches_cpu_reference,
        merge_states_matches_cpu_reference,
        merge_states_refusals_come_from_the_library,
        two_halves_merged_match_attention_over_all_keys,
        backward_reference_matches_finite_differences,
        backward_matches_cpu_reference,
        backward_without_queries_zeroes_dk_and_dv,
        varlen_backward_matches_cpu_reference,
    ])
}

/// Whether the build has a kernel at least (head_dim, head_dim_v) wide;
/// otherwise says that the case is skipped (the test goes on with its other
/// cases).
fn has_kernel_for(pairs: &[(i32, i32)], case: &str, head_dim: i64, head_dim_v: i64) -> bool {
    let covered = pairs.iter().any(|&(d, dv)| i64::from(d) >= head_dim && i64::from(dv) >= head_dim_v);
    if !covered {
        println!("case {case} skipped: this build has no kernel as wide as {head_dim}: {pairs:?}");
    }
    covered
}

/// A handle and the GPU behind it, or why the machine has none usable.
/// Fails when flashcore and the driver disagree. Without a driver the reason
/// is the C GPU tests' ("no CUDA device: " and flashcore's message), so that
/// ctest's summary counts both under one line.
fn setup() -> Result<(Handle, &'static Gpu), Skip> {
    match (Handle::new(), cuda::gpu()) {
        (Ok(handle), Ok(gpu)) => Ok((handle, gpu)),
        (Ok(_), Err(why)) => panic!("flashcore created a handle, but the test cannot use the CUDA driver: {why}"),
        (Err(err), Ok(_)) if err.status() == Status::Unsupported => {
            Err(Skip(format!("GPU not supported by flashcore: {}", err.message())))
        }
        (Err(err), Ok(gpu)) => {
            panic!("the CUDA driver sees {} device(s) but flashcore_create failed: {err}", gpu.devices)
        }
        (Err(err), Err(_)) => {
            assert_eq!(err.status(), Status::NoDevice, "without a GPU flashcore_create must report no device: {err}");
            Err(Skip(format!("no CUDA device: {}", err.message())))
        }
    }
}

fn handle_creation_agrees_with_the_driver() -> Outcome {
    match cuda::gpu() {
        Err(why) => {
            for (call, result) in [("Handle::new", Handle::new()), ("Handle::for_device(0)", Handle::for_device(0))] {
                let err = result.expect_err("a handle was created on a machine without a GPU");
                assert_eq!(err.status(), Status::NoDevice, "{call}: {err}");
                assert!(!err.message().is_empty(), "{call}: the no-device error explains itself");
            }
            println!("no GPU ({why}): Handle::new reports {}", Handle::new().unwrap_err());
        }
        Ok(gpu) => {
            let (handle, _) = setup()?;
            assert_eq!(handle.device(), Ok(0));
            let last = Handle::for_device(gpu.devices - 1).expect("a handle for the last device");
            assert_eq!(last.device(), Ok(gpu.devices - 1));
            assert!(Handle::for_device(gpu.devices).is_err(), "device ordinal out of range");
            assert!(Handle::for_device(-1).is_err(), "negative device ordinal");
            println!("{} device(s); handles bound as asked", gpu.devices);
        }
    }
    Ok(())
}

struct Case {
    name: &'static str,
    dtype: DType,
    batch: i64,
    heads_q: i64,
    heads_kv: i64,
    seqlen_q: i64,
    seqlen_k: i64,
    /// Of q and k.
    head_dim: i64,
    /// Of v and out.
    head_dim_v: i64,
    causal: bool,
    /// Sliding window bounds (left, right), each -1 or >= 0; `None`: no window.
    window: Option<(i32, i32)>,
    /// 0: no softcap.
    softcap: f32,
    /// 0: the default, 1/sqrt(head_dim).
    softmax_scale: f32,
    layout: Layout,
    /// Queue on a stream of our own instead of the legacy default stream.
    own_stream: bool,
    /// The num_splits settings to run the case with (0: the library's choice),
    /// each against the same reference.
    num_splits: &'static [i32],
}

impl Case {
    /// `shape`: batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim
    /// (head_dim_v the same unless [`Case::head_dim_v`] says otherwise).
    const fn new(
        name: &'static str,
        dtype: DType,
        shape: [i64; 6],
        causal: bool,
        softmax_scale: f32,
        layout: Layout,
        own_stream: bool,
    ) -> Case {
        let [batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim] = shape;
        Case {
            name,
            dtype,
            batch,
            heads_q,
            heads_kv,
            seqlen_q,
            seqlen_k,
            head_dim,
            head_dim_v: head_dim,
            causal,
            window: None,
            softcap: 0.0,
            softmax_scale,
            layout,
            own_stream,
            num_splits: &[0],
        }
    }

    const fn head_dim_v(mut self, head_dim_v: i64) -> Case {
        self.head_dim_v = head_dim_v;
        self
    }

    const fn num_splits(mut self, num_splits: &'static [i32]) -> Case {
        self.num_splits = num_splits;
        self
    }

    const fn window(mut self, left: i32, right: i32) -> Case {
        self.window = Some((left, right));
        self
    }

    const fn softcap(mut self, softcap: f32) -> Case {
        self.softcap = softcap;
        self
    }

    /// The keys query `i` sees, `first..=last` (empty when first > last), by
    /// flashcore.h's rule: `i + d - left <= j <= i + d + right` with
    /// d = seqlen_k - seqlen_q, a bound of -1 dropping its side; causal is a
    /// right bound of 0.
    fn visible_keys(&self, i: i64) -> std::ops::RangeInclusive<i64> {
        let diagonal = i + self.seqlen_k - self.seqlen_q;
        let (left, right) = self.window.map_or((-1, -1), |(l, r)| (i64::from(l), i64::from(r)));
        let right = if self.causal { 0 } else { right };
        let first = if left >= 0 { (diagonal - left).max(0) } else { 0 };
        let last = if right >= 0 { (diagonal + right).min(self.seqlen_k - 1) } else { self.seqlen_k - 1 };
        first..=last
    }
}

const CASES: [Case; 9] = [
    Case::new(
        "fp16 B=1 H=2 S=128 D=64, BHSD, default stream",
        DType::F16,
        [1, 2, 2, 128, 128, 64],
        false,
        0.0,
        Layout::Bhsd,
        false,
    ),
    Case::new(
        "fp16 B=1 H=2 S=173 D=64 causal, BSHD, own stream",
        DType::F16,
        [1, 2, 2, 173, 173, 64],
        true,
        0.0,
        Layout::Bshd,
        true,
    ),
    Case::new(
        "fp16 B=2 Hq=2 Hkv=1 Sq=173 Sk=128 D=64 causal (rows that see no key), BSHD, own stream",
        DType::F16,
        [2, 2, 1, 173, 128, 64],
        true,
        0.0,
        Layout::Bshd,
        true,
    ),
    Case::new(
        "bf16 B=1 Hq=4 Hkv=2 Sq=128 Sk=173 D=128 causal scale=0.2, BHSD",
        DType::BF16,
        [1, 4, 2, 128, 173, 128],
        true,
        0.2,
        Layout::Bhsd,
        false,
    ),
    // The other kernels of the default build: 96, (192, 128), 256, 32.
    Case::new(
        "bf16 B=1 Hq=4 Hkv=2 S=150 D=96 causal, BSHD",
        DType::BF16,
        [1, 4, 2, 150, 150, 96],
        true,
        0.0,
        Layout::Bshd,
        false,
    ),
    Case::new(
        "fp16 B=1 H=2 Sq=130 Sk=200 D=192 Dv=128 causal, BHSD, own stream",
        DType::F16,
        [1, 2, 2, 130, 200, 192],
        true,
        0.0,
        Layout::Bhsd,
        true,
    )
    .head_dim_v(128),
    Case::new(
        "bf16 B=1 H=2 Sq=128 Sk=97 D=192 Dv=128, BSHD",
        DType::BF16,
        [1, 2, 2, 128, 97, 192],
        false,
        0.0,
        Layout::Bshd,
        false,
    )
    .head_dim_v(128),
    Case::new(
        "bf16 B=1 Hq=2 Hkv=1 S=128 D=256 causal, BHSD",
        DType::BF16,
        [1, 2, 1, 128, 128, 256],
        true,
        0.0,
        Layout::Bhsd,
        false,
    ),
    Case::new(
        "fp16 B=2 H=2 S=100 D=32 causal, BSHD, own stream",
        DType::F16,
        [2, 2, 2, 100, 100, 32],
        true,
        0.0,
        Layout::Bshd,
        true,
    ),
];

/// Runs on a wider kernel (96 in the default build), reading and writing
/// only 80 columns; kept apart from CASES to name the rule it tests.
const ROUNDED_UP: Case = Case::new(
    "fp16 B=1 Hq=4 Hkv=1 Sq=77 Sk=140 D=80 causal, BHSD (runs on a wider kernel)",
    DType::F16,
    [1, 4, 1, 77, 140, 80],
    true,
    0.0,
    Layout::Bhsd,
    false,
);

/// Strides of a densely packed tensor, worked out here rather than taken from
/// the library, so a wrong derivation there cannot cancel out.
fn dense_strides(layout: Layout, heads: i64, seqlen: i64, head_dim: i64) -> Strides {
    match layout {
        Layout::Bhsd => Strides { batch: heads * seqlen * head_dim, seq: head_dim, head: seqlen * head_dim },
        Layout::Bshd => Strides { batch: seqlen * heads * head_dim, seq: heads * head_dim, head: head_dim },
    }
}

/// A host tensor `[batch, heads, seqlen, head_dim]` stored with `strides`.
struct HostTensor {
    values: Vec<f32>,
    strides: Strides,
}

impl HostTensor {
    fn at(&self, batch: i64, head: i64, position: i64, d: i64) -> f64 {
        let s = self.strides;
        f64::from(self.values[(batch * s.batch + head * s.head + position * s.seq + d) as usize])
    }
}

/// xorshift64*: reproducible test data without a crate.
struct Random(u64);

impl Random {
    /// The next 64 random bits.
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [-2, 2) on a grid both fp16 and bf16 hold exactly
    /// (multiples of 1/64 for bf16's 8-bit significand, 1/256 for fp16).
    fn value(&mut self, dtype: DType) -> f32 {
        let r = (self.next() >> 40) as i64;
        let steps = if dtype == DType::BF16 { 64 } else { 256 };
        (r % (4 * steps) - 2 * steps) as f32 / steps as f32
    }

    fn tensor(&mut self, case: &Case, heads: i64, seqlen: i64, width: i64) -> HostTensor {
        let count = case.batch * heads * seqlen * width;
        HostTensor {
            values: (0..count).map(|_| self.value(case.dtype)).collect(),
            strides: dense_strides(case.layout, heads, seqlen, width),
        }
    }
}

/// softmax(cap(scale · q·kᵀ) + mask) · v and the log-sum-exp, in f64, one
/// query row at a time, cap(s) = softcap · tanh(s / softcap) where softcap > 0;
/// out in [batch, head, position, d] order.
fn reference(case: &Case, q: &HostTensor, k: &HostTensor, v: &HostTensor) -> (Vec<f64>, Vec<f64>) {
    let scale =
        if case.softmax_scale == 0.0 { 1.0 / (case.head_dim as f64).sqrt() } else { f64::from(case.softmax_scale) };
    let softcap = f64::from(case.softcap);
    let group = case.heads_q / case.heads_kv;
    let mut out = Vec::new();
    let mut lse = Vec::new();
    for b in 0..case.batch {
        for h in 0..case.heads_q {
            let kv_head = h / group;
            for i in 0..case.seqlen_q {
                let keys = case.visible_keys(i);
                let cap = |s: f64| if case.softcap > 0.0 { softcap * (s / softcap).tanh() } else { s };
                let scores: Vec<f64> = keys
                    .clone()
                    .map(|j| {
                        cap(scale * (0..case.head_dim).map(|d| q.at(b, h, i, d) * k.at(b, kv_head, j, d)).sum::<f64>())
                    })
                    .collect();
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let row_lse = if scores.is_empty() {
                    f64::NEG_INFINITY
                } else {
                    max + scores.iter().map(|s| (s - max).exp()).sum::<f64>().ln()
                };
                lse.push(row_lse);
                for d in 0..case.head_dim_v {
                    let weighted =
                        scores.iter().zip(keys.clone()).map(|(s, j)| (s - row_lse).exp() * v.at(b, kv_head, j, d));
                    out.push(weighted.sum::<f64>());
                }
            }
        }
    }
    (out, lse)
}

/// With q = 0 every visible key weighs the same: out is the mean of the
/// visible values and lse = ln(visible keys). Checks the reference itself,
/// its causal alignment included (query i sees keys 0..=i + Sk - Sq).
fn reference_averages_visible_values_when_scores_tie() -> Outcome {
    let case = Case::new("uniform", DType::F16, [1, 2, 1, 5, 3, 8], true, 0.0, Layout::Bhsd, false);
    let mut random = Random(7);
    let q = HostTensor { values: vec![0.0; 2 * 5 * 8], strides: dense_strides(Layout::Bhsd, 2, 5, 8) };
    let k = random.tensor(&case, 1, 3, 8);
    let v = random.tensor(&case, 1, 3, 8);
    let (out, lse) = reference(&case, &q, &k, &v);
    for (row, &lse) in lse.iter().enumerate() {
        let i = row as i64 % 5;
        let visible = (i - 1).max(0); // i + 3 - 5 + 1 keys
        let mean = |d| (0..visible).map(|j| v.at(0, 0, j, d)).sum::<f64>() / visible as f64;
        if visible == 0 {
            assert_eq!(lse, f64::NEG_INFINITY, "row {row}");
        } else {
            assert!((lse - (visible as f64).ln()).abs() < 1e-12, "row {row}: lse {lse}");
        }
        for d in 0..8 {
            let want = if visible == 0 { 0.0 } else { mean(d) };
            assert!((out[row * 8 + d as usize] - want).abs() < 1e-12, "row {row}, d {d}");
        }
    }
    Ok(())
}

/// The window's rule in the reference, against keys worked out by hand, and
/// the window and softcap in the tie case: with q = 0 every score is 0
/// (capped too), so out is the mean of the keys in the window and lse the
/// log of their count.
fn reference_windows_follow_the_rule() -> Outcome {
    // The keys each query sees, for seqlen_q x seqlen_k, causal and a window.
    let keys = |seqlen_q, seqlen_k, causal, (left, right)| {
        let case = Case::new("window", DType::F16, [1, 1, 1, seqlen_q, seqlen_k, 8], causal, 0.0, Layout::Bhsd, false)
            .window(left, right);
        (0..seqlen_q).map(|i| case.visible_keys(i).collect()).collect::<Vec<Vec<i64>>>()
    };
    // d = 2: query i's diagonal is key i + 2.
    assert_eq!(keys(3, 5, false, (1, 0)), [vec![1, 2], vec![2, 3], vec![3, 4]]);
    assert_eq!(keys(3, 5, false, (0, 1)), [vec![2, 3], vec![3, 4], vec![4]]);
    assert_eq!(keys(3, 5, false, (-1, 0)), [vec![0, 1, 2], vec![0, 1, 2, 3], vec![0, 1, 2, 3, 4]]);
    assert_eq!(keys(3, 5, true, (0, -1)), [vec![2], vec![3], vec![4]]);
    // d = -2: the first two queries' windows hold no key.
    assert_eq!(keys(4, 2, false, (0, 0)), [vec![], vec![], vec![0], vec![1]]);
    assert_eq!(keys(4, 2, false, (1, 1)), [vec![], vec![0], vec![0, 1], vec![0, 1]]);
    assert_eq!(keys(2, 3, false, (-1, -1)), [vec![0, 1, 2], vec![0, 1, 2]]);

    let case =
        Case::new("tie", DType::F16, [1, 2, 1, 6, 9, 8], false, 0.0, Layout::Bhsd, false).window(2, 1).softcap(30.0);
    let mut random = Random(11);
    let q = HostTensor { values: vec![0.0; 2 * 6 * 8], strides: dense_strides(Layout::Bhsd, 2, 6, 8) };
    let k = random.tensor(&case, 1, 9, 8);
    let v = random.tensor(&case, 1, 9, 8);
    let (out, lse) = reference(&case, &q, &k, &v);
    for (row, &lse) in lse.iter().enumerate() {
        let seen = case.visible_keys(row as i64 % 6);
        let count = seen.clone().count() as f64;
        assert!((lse - count.ln()).abs() < 1e-12, "row {row}: lse {lse}");
        for d in 0..8 {
            let mean = seen.clone().map(|j| v.at(0, 0, j, d)).sum::<f64>() / count;
            assert!((out[row * 8 + d as usize] - mean).abs() < 1e-12, "row {row}, d {d}");
        }
    }
    Ok(())
}

/// Largest |got - want| / (atol + rtol·|want|) over the pairs, with its index;
/// infinities must match exactly and NaN never passes.
fn worst(got: impl Iterator<Item = f64>, want: &[f64], atol: f64, rtol: f64) -> (f64, usize, f64, f64) {
    let mut worst = (0.0, 0, 0.0, 0.0);
    for (index, (got, &want)) in got.zip(want).enumerate() {
        let ratio =
            if want.is_infinite() && got == want { 0.0 } else { (got - want).abs() / (atol + rtol * want.abs()) };
        if ratio.is_nan() || ratio > worst.0 {
            worst = (if ratio.is_nan() { f64::INFINITY } else { ratio }, index, got, want);
        }
    }
    worst
}

/// The case's params with device buffers q, k, v and `out`.
fn builder<'a>(
    case: &Case,
    [q, k, v]: [&'a cuda::DeviceMemory<'_>; 3],
    out: &'a mut cuda::DeviceMemory<'_>,
) -> ForwardParamsBuilder<'a> {
    let builder = ForwardParams::builder()
        .dtype(case.dtype)
        .batch_size(case.batch as i32)
        .num_heads_q(case.heads_q as i32)
        .num_heads_kv(case.heads_kv as i32)
        .seqlen_q(case.seqlen_q as i32)
        .seqlen_k(case.seqlen_k as i32)
        .head_dim(case.head_dim as i32)
        .head_dim_v(case.head_dim_v as i32)
        .causal(case.causal)
        .softcap(case.softcap)
        .softmax_scale(case.softmax_scale)
        .layout(case.layout)
        .q(q)
        .k(k)
        .v(v)
        .out(out);
    match case.window {
        Some((left, right)) => builder.window(left, right),
        None => builder,
    }
}

fn run_case(handle: &Handle, gpu: &Gpu, case: &Case, random: &mut Random) {
    let q = random.tensor(case, case.heads_q, case.seqlen_q, case.head_dim);
    let k = random.tensor(case, case.heads_kv, case.seqlen_k, case.head_dim);
    let v = random.tensor(case, case.heads_kv, case.seqlen_k, case.head_dim_v);
    let out_strides = dense_strides(case.layout, case.heads_q, case.seqlen_q, case.head_dim_v);
    let encode = |t: &HostTensor| t.values.iter().map(|&x| half::encode(case.dtype, x)).collect::<Vec<u16>>();
    let (q_dev, k_dev, v_dev) = (gpu.upload(&encode(&q)), gpu.upload(&encode(&k)), gpu.upload(&encode(&v)));
    let rows = (case.batch * case.heads_q * case.seqlen_q) as usize;
    let out_bytes = (rows as i64 * case.head_dim_v * 2) as usize;
    let stream = case.own_stream.then(|| gpu.stream());
    let stream_raw = stream.as_ref().map_or(std::ptr::null_mut(), |s| s.raw);
    let synchronize = || match &stream {
        Some(stream) => stream.synchronize(),
        None => gpu.synchronize(),
    };
    let (want_out, want_lse) = reference(case, &q, &k, &v);

    for &num_splits in case.num_splits {
        let name = format!("{} num_splits={num_splits}", case.name);
        let (mut out_dev, mut again_dev, mut lse_dev) =
            (gpu.alloc_poisoned(out_bytes), gpu.alloc_poisoned(out_bytes), gpu.alloc_poisoned(rows * 4));
        let params = builder(case, [&q_dev, &k_dev, &v_dev], &mut out_dev)
            .num_splits(num_splits)
            .lse(&mut lse_dev)
            .build()
            .expect("valid params");
        for (tensor, strides) in
            [(Tensor::Q, q.strides), (Tensor::K, k.strides), (Tensor::V, v.strides), (Tensor::Out, out_strides)]
        {
            assert_eq!(params.strides(tensor), strides, "{name}: library strides for {tensor:?}");
        }
        assert_eq!((params.window(), params.softcap()), (case.window, case.softcap), "{name}");
        let workspace_bytes = handle.workspace_size(&params).expect("workspace size");
        match num_splits {
            1 => assert_eq!(workspace_bytes, 0, "{name}: a call that never splits needs no workspace"),
            2.. => assert!(workspace_bytes > 0, "{name}: a split call needs a workspace"),
            _ => {}
        }
        let mut workspace = gpu.alloc_poisoned(workspace_bytes);
        if workspace_bytes > 0 {
            // Each call below is rejected before any work is queued.
            let mut short = RawBuffer::new(workspace.device_ptr(), workspace_bytes - flashcore::ALIGNMENT);
            let err =
                unsafe { handle.forward(&params, Some(&mut short), stream_raw) }.expect_err("short workspace accepted");
            assert_eq!(err.status(), Status::WorkspaceTooSmall, "{name}: {err}");
            let err = unsafe { handle.forward(&params, None, stream_raw) }.expect_err("missing workspace accepted");
            assert_eq!(err.status(), Status::WorkspaceTooSmall, "{name}: {err}");
            let mut null = RawBuffer::new(0, workspace_bytes);
            let err =
                unsafe { handle.forward(&params, Some(&mut null), stream_raw) }.expect_err("NULL workspace accepted");
            assert_eq!(err.status(), Status::InvalidArgument, "{name}: {err}");
            let mut shifted = RawBuffer::new(workspace.device_ptr() + 8, workspace_bytes);
            let err = unsafe { handle.forward(&params, Some(&mut shifted), stream_raw) }
                .expect_err("misaligned workspace accepted");
            assert_eq!(err.status(), Status::Misaligned, "{name}: {err}");
        }
        // SAFETY: live allocations of the stated sizes, synchronized before they are read or freed.
        unsafe { handle.forward(&params, Some(&mut workspace), stream_raw) }.expect("forward");
        let params = builder(case, [&q_dev, &k_dev, &v_dev], &mut again_dev)
            .num_splits(num_splits)
            .build()
            .expect("valid params");
        // SAFETY: as above.
        unsafe { handle.forward(&params, Some(&mut workspace), stream_raw) }.expect("second forward");
        synchronize();

        let out_bits: Vec<u16> = gpu.download(&out_dev);
        assert!(out_bits == gpu.download::<u16>(&again_dev), "{name}: two identical calls gave different bits");
        let lse: Vec<f32> = gpu.download(&lse_dev);
        check_output(&name, case, &out_bits, out_strides, &lse, &want_out, &want_lse);
    }
}

/// Asserts that a forward call's out (16-bit bits laid out by `out_strides`)
/// and lse match the float64 reference within the dtype's bounds, printing
/// the worst errors.
fn check_output(
    name: &str,
    case: &Case,
    out_bits: &[u16],
    out_strides: Strides,
    lse: &[f32],
    want_out: &[f64],
    want_lse: &[f64],
) {
    let out =
        HostTensor { values: out_bits.iter().map(|&b| half::decode(case.dtype, b)).collect(), strides: out_strides };
    let got_out = (0..case.batch).flat_map(|b| {
        let out = &out;
        (0..case.heads_q).flat_map(move |h| {
            (0..case.seqlen_q).flat_map(move |i| (0..case.head_dim_v).map(move |d| out.at(b, h, i, d)))
        })
    });
    let (atol, rtol) = if case.dtype == DType::BF16 { (3e-2, 1e-2) } else { (4e-3, 4e-3) };
    let (out_ratio, out_at, got, want) = worst(got_out, want_out, atol, rtol);
    println!("{name}: worst out error {out_ratio:.3} of tolerance (got {got}, want {want} at {out_at})");
    assert!(out_ratio <= 1.0, "{name}: out[{out_at}] = {got}, reference {want}");
    let (lse_ratio, lse_at, got, want) = worst(lse.iter().map(|&x| f64::from(x)), want_lse, 2e-3, 1e-4);
    println!("{name}: worst lse error {lse_ratio:.3} of tolerance");
    assert!(lse_ratio <= 1.0, "{name}: lse[{lse_at}] = {got}, reference {want}");
}

fn forward_matches_cpu_reference() -> Outcome {
    let (handle, gpu) = setup()?;
    println!("libflashcore {} on device {}", flashcore::version(), handle.device().expect("device"));
    let pairs = flashcore::supported_head_dims().expect("supported head dims");
    let mut random = Random(0x9E37_79B9_7F4A_7C15);
    for case in &CASES {
        if has_kernel_for(&pairs, case.name, case.head_dim, case.head_dim_v) {
            run_case(&handle, gpu, case, &mut random);
        }
    }
    Ok(())
}

fn head_dims_without_a_kernel_round_up() -> Outcome {
    let (handle, gpu) = setup()?;
    let pairs = flashcore::supported_head_dims().expect("supported head dims");
    let (d, dv) = match pairs.iter().find(|&&(d, dv)| d >= 80 && dv >= 80) {
        Some(&pair) => pair,
        None => return Err(Skip(format!("this build has no kernel as wide as 80: {pairs:?}"))),
    };
    println!("head_dim 80 runs on the ({d}, {dv}) kernel of {pairs:?}");
    run_case(&handle, gpu, &ROUNDED_UP, &mut Random(0x5851_F42D_4C95_7F2D));
    Ok(())
}

fn one_handle_serves_several_threads() -> Outcome {
    let (handle, _) = setup()?;
    // The widest head dim this build has a kernel for (128 in the default build).
    let head_dim = flashcore::supported_head_dims()
        .expect("supported head dims")
        .iter()
        .map(|&(d, _)| d)
        .filter(|&d| d <= 128)
        .max()
        .ok_or_else(|| Skip("this build has no kernel up to head_dim 128".to_string()))?;
    // workspace_size reads only shapes, so made-up aligned addresses will do.
    let sizes: Vec<usize> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..4)
            .map(|_| {
                scope.spawn(|| {
                    let q = RawBuffer::new(1 << 30, 1 << 24);
                    let mut out = RawBuffer::new(1 << 31, 1 << 24);
                    let params = ForwardParams::builder()
                        .batch_size(2)
                        .num_heads_q(8)
                        .num_heads_kv(8)
                        .seqlen_q(1024)
                        .seqlen_k(1024)
                        .head_dim(head_dim.into())
                        .q(&q)
                        .k(&q)
                        .v(&q)
                        .out(&mut out)
                        .build()
                        .expect("valid params");
                    handle.workspace_size(&params).expect("workspace size")
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().expect("thread")).collect()
    });
    assert!(sizes.windows(2).all(|w| w[0] == w[1]), "{sizes:?}");
    Ok(())
}

/// Decode-like calls (few query rows, grouped-query 32/8, about 1000 keys),
/// each run without splitting, with the library's choice and with forced
/// split-KV, all against one reference.
const SPLIT_CASES: [Case; 3] = [
    Case::new(
        "fp16 decode B=1 Hq=32 Hkv=8 Sq=1 Sk=1000 D=128, BHSD",
        DType::F16,
        [1, 32, 8, 1, 1000, 128],
        false,
        0.0,
        Layout::Bhsd,
        false,
    )
    .num_splits(&[1, 0, 2, 3, 7]),
    Case::new(
        "bf16 decode B=2 Hq=32 Hkv=8 Sq=5 Sk=1037 D=128 causal, BSHD, own stream",
        DType::BF16,
        [2, 32, 8, 5, 1037, 128],
        true,
        0.0,
        Layout::Bshd,
        true,
    )
    .num_splits(&[1, 0, 2, 3, 7]),
    Case::new(
        "fp16 chunk B=1 Hq=32 Hkv=8 Sq=16 Sk=999 D=64 causal, BHSD",
        DType::F16,
        [1, 32, 8, 16, 999, 64],
        true,
        0.0,
        Layout::Bhsd,
        false,
    )
    .num_splits(&[1, 0, 2, 3, 7, flashcore::MAX_NUM_SPLITS]),
];

fn num_splits_matches_cpu_reference() -> Outcome {
    let (handle, gpu) = setup()?;
    let pairs = flashcore::supported_head_dims().expect("supported head dims");
    let mut random = Random(0x2545_F491_4F6C_DD1D);
    for case in &SPLIT_CASES {
        if !has_kernel_for(&pairs, case.name, case.head_dim, case.head_dim_v) {
            continue;
        }
        run_case(&handle, gpu, case, &mut random);
    }
    Ok(())
}

/// Sliding windows and softcapping, against the reference's own mask and cap:
/// the diagonal alone, one side unbounded, both sides bounded (key tiles
/// skipped), a window wider than the sequences, rows that see no key, large
/// logits capped, with causal, grouped-query heads, both layouts and split-KV.
const WINDOW_CASES: [Case; 9] = [
    Case::new(
        "fp16 B=1 Hq=4 Hkv=2 Sq=200 Sk=260 D=64 window (0, 0), BHSD",
        DType::F16,
        [1, 4, 2, 200, 260, 64],
        false,
        0.0,
        Layout::Bhsd,
        false,
    )
    .window(0, 0),
    Case::new(
        "bf16 B=2 H=2 S=150 D=64 window (1, -1), BSHD",
        DType::BF16,
        [2, 2, 2, 150, 150, 64],
        false,
        0.0,
        Layout::Bshd,
        false,
    )
    .window(1, -1),
    Case::new(
        "fp16 B=2 Hq=4 Hkv=1 S=300 D=128 causal window (40, 0), BSHD, own stream",
        DType::F16,
        [2, 4, 1, 300, 300, 128],
        true,
        0.0,
        Layout::Bshd,
        true,
    )
    .window(40, 0)
    .num_splits(&[0, 1, 3]),
    Case::new(
        "bf16 B=1 H=2 Sq=150 Sk=170 D=64 window (30, 20), BHSD",
        DType::BF16,
        [1, 2, 2, 150, 170, 64],
        false,
        0.0,
        Layout::Bhsd,
        false,
    )
    .window(30, 20),
    Case::new(
        "fp16 B=1 H=2 S=130 D=64 window (1000, 1000), wider than the sequences, BHSD",
        DType::F16,
        [1, 2, 2, 130, 130, 64],
        false,
        0.0,
        Layout::Bhsd,
        false,
    )
    .window(1000, 1000),
    Case::new(
        "bf16 B=2 Hq=4 Hkv=2 Sq=190 Sk=130 D=64 window (5, 5) (rows that see no key), BSHD",
        DType::BF16,
        [2, 4, 2, 190, 130, 64],
        false,
        0.0,
        Layout::Bshd,
        false,
    )
    .window(5, 5),
    // Scaled scores of standard deviation about 14: many beyond the cap.
    Case::new(
        "fp16 B=1 Hq=4 Hkv=2 Sq=150 Sk=170 D=64 causal scale=4 softcap 30, BSHD",
        DType::F16,
        [1, 4, 2, 150, 170, 64],
        true,
        4.0,
        Layout::Bshd,
        false,
    )
    .softcap(30.0),
    Case::new(
        "bf16 B=2 Hq=8 Hkv=2 Sq=200 Sk=260 D=128 causal window (32, 0) scale=2 softcap 30, BHSD, own stream",
        DType::BF16,
        [2, 8, 2, 200, 260, 128],
        true,
        2.0,
        Layout::Bhsd,
        true,
    )
    .window(32, 0)
    .softcap(30.0)
    .num_splits(&[0, 1, 3]),
    Case::new(
        "fp16 decode B=1 Hq=32 Hkv=8 Sq=4 Sk=1000 D=128 causal window (200, 0) softcap 50, BHSD",
        DType::F16,
        [1, 32, 8, 4, 1000, 128],
        true,
        0.0,
        Layout::Bhsd,
        false,
    )
    .window(200, 0)
    .softcap(50.0)
    .num_splits(&[1, 0, 2, 7]),
];

fn window_and_softcap_match_cpu_reference() -> Outcome {
    let (handle, gpu) = setup()?;
    let pairs = flashcore::supported_head_dims().expect("supported head dims");
    let mut random = Random(0x6A09_E667_F3BC_C908);
    for case in &WINDOW_CASES {
        if !has_kernel_for(&pairs, case.name, case.head_dim, case.head_dim_v) {
            continue;
        }
        run_case(&handle, gpu, case, &mut random);
    }
    Ok(())
}

/// Where the keys and values of a [`RaggedCase`] live.
#[derive(Clone, Copy)]
enum KeyStorage {
    /// Packed `[total_seqlen_k, heads, dim]` rows with prefix sums (`varlen_k`).
    Packed,
    /// `[num_pages, page_size, heads, dim]` pools through a block table, each
    /// sequence's key count in seqused_k (`paged_kv`).
    Paged { page_size: i64 },
}

/// A batch of sequences of their own lengths, each checked against the
/// reference of a batch of one with those lengths (causal and the window
/// align to each sequence's own).
struct RaggedCase {
    name: &'static str,
    dtype: DType,
    heads_q: i64,
    heads_kv: i64,
    head_dim: i64,
    head_dim_v: i64,
    causal: bool,
    window: Option<(i32, i32)>,
    /// (queries, keys) of each sequence.
    lengths: &'static [(i64, i64)],
    /// Queries packed (`varlen_q`), with rows after the last sequence that
    /// must stay unwritten; otherwise dense BSHD, every sequence having as
    /// many queries.
    packed_q: bool,
    keys: KeyStorage,
    num_splits: &'static [i32],
}

const RAGGED_CASES: [RaggedCase; 5] = [
    RaggedCase {
        name: "fp16 varlen q and k, Hq=4 Hkv=2 D=64 causal",
        dtype: DType::F16,
        heads_q: 4,
        heads_kv: 2,
        head_dim: 64,
        head_dim_v: 64,
        causal: true,
        window: None,
        lengths: &[(37, 50), (128, 160), (1, 77), (200, 200), (90, 13)],
        packed_q: true,
        keys: KeyStorage::Packed,
        num_splits: &[0, 1, 3],
    },
    RaggedCase {
        name: "bf16 varlen q and k, Hq=4 Hkv=1 D=128 window (20, 5) (rows that see no key)",
        dtype: DType::BF16,
        heads_q: 4,
        heads_kv: 1,
        head_dim: 128,
        head_dim_v: 128,
        causal: false,
        window: Some((20, 5)),
        lengths: &[(65, 65), (3, 130), (100, 40)],
        packed_q: true,
        keys: KeyStorage::Packed,
        num_splits: &[0],
    },
    RaggedCase {
        name: "fp16 paged decode, pages of 16, Hq=32 Hkv=8 D=128, a sequence with no key",
        dtype: DType::F16,
        heads_q: 32,
        heads_kv: 8,
        head_dim: 128,
        head_dim_v: 128,
        causal: false,
        window: None,
        lengths: &[(1, 1000), (1, 0), (1, 17), (1, 513)],
        packed_q: false,
        keys: KeyStorage::Paged { page_size: 16 },
        num_splits: &[1, 0, 2, 7],
    },
    RaggedCase {
        name: "bf16 chunked prefill (varlen q) on a paged cache, pages of 32, Hq=4 Hkv=2 D=64 causal",
        dtype: DType::BF16,
        heads_q: 4,
        heads_kv: 2,
        head_dim: 64,
        head_dim_v: 64,
        causal: true,
        window: None,
        lengths: &[(16, 300), (40, 40), (7, 100)],
        packed_q: true,
        keys: KeyStorage::Paged { page_size: 32 },
        num_splits: &[0, 1, 3],
    },
    RaggedCase {
        name: "fp16 paged, pages of 64, Hq=2 Hkv=2 D=192 Dv=128 causal",
        dtype: DType::F16,
        heads_q: 2,
        heads_kv: 2,
        head_dim: 192,
        head_dim_v: 128,
        causal: true,
        window: None,
        lengths: &[(5, 200), (5, 64), (5, 5)],
        packed_q: false,
        keys: KeyStorage::Paged { page_size: 64 },
        num_splits: &[0, 1],
    },
];

/// `rows` random rows of `heads` x `width` values, as a batch-of-one
/// `[1, heads, rows, width]` tensor stored row after row (BSHD).
fn random_rows(random: &mut Random, dtype: DType, rows: i64, heads: i64, width: i64) -> HostTensor {
    HostTensor {
        values: (0..rows * heads * width).map(|_| random.value(dtype)).collect(),
        strides: Strides { batch: 0, seq: heads * width, head: width },
    }
}

/// A block table and the size of the pool of pages it indexes.
struct PageTable {
    entries: Vec<i32>,
    /// Entries from one sequence's row to the next.
    stride: i64,
    page_size: i64,
    num_pages: i64,
}

impl PageTable {
    /// Pages for sequences of `key_counts` keys, handed out last first (so
    /// that key order is not pool order), 3 spare pages listed nowhere. Rows
    /// are 2 entries further apart than ceil(max key count / page_size), and
    /// their unused entries -1: the library reads only a sequence's own pages.
    fn new(key_counts: &[i64], page_size: i64) -> PageTable {
        let pages_for = |keys: i64| (keys + page_size - 1) / page_size;
        let stride = pages_for(key_counts.iter().copied().max().unwrap_or(0)) + 2;
        let num_pages = key_counts.iter().map(|&keys| pages_for(keys)).sum::<i64>() + 3;
        let mut entries = vec![-1; key_counts.len() * stride as usize];
        let mut next_page = num_pages;
        for (row, &keys) in entries.chunks_mut(stride as usize).zip(key_counts) {
            for entry in &mut row[..pages_for(keys) as usize] {
                next_page -= 1;
                *entry = next_page as i32;
            }
        }
        PageTable { entries, stride, page_size, num_pages }
    }

    /// The rows of `sequences` (one `[keys, heads, width]` tensor each, `row_len`
    /// = heads * width) in a `[num_pages, page_size, heads, width]` pool: row j of sequence b is row
    /// j % page_size of page entries[b * stride + j / page_size]. Rows that
    /// hold no key (spare pages, a last page's rows past its sequence's
    /// length) are NaN, which the library must never read.
    fn pool<'t>(&self, dtype: DType, row_len: i64, sequences: impl Iterator<Item = &'t HostTensor>) -> Vec<u16> {
        let row_len = row_len as usize;
        let mut pool = vec![0xFFFF; (self.num_pages * self.page_size) as usize * row_len];
        for (row_of_table, sequence) in self.entries.chunks(self.stride as usize).zip(sequences) {
            for (j, row) in sequence.values.chunks(row_len).enumerate() {
                let page = row_of_table[j / self.page_size as usize] as usize;
                let start = (page * self.page_size as usize + j % self.page_size as usize) * row_len;
                for (slot, &x) in pool[start..start + row_len].iter_mut().zip(row) {
                    *slot = half::encode(dtype, x);
                }
            }
        }
        pool
    }
}

/// The pages of a [`PageTable`] and where its pool puts each key, checked
/// without a GPU, so that a failure on one is the library's.
fn page_table_pools_every_key_once() -> Outcome {
    let key_counts = [33, 0, 16];
    let pages = PageTable::new(&key_counts, 16);
    // 3 + 0 + 1 pages and 3 spare; rows ceil(33 / 16) + 2 entries apart.
    assert_eq!((pages.stride, pages.num_pages), (5, 7));
    assert_eq!(pages.entries, [6, 5, 4, -1, -1, -1, -1, -1, -1, -1, 3, -1, -1, -1, -1]);
    let mut random = Random(3);
    let sequences: Vec<HostTensor> =
        key_counts.iter().map(|&keys| random_rows(&mut random, DType::F16, keys, 2, 8)).collect();
    let pool = pages.pool(DType::F16, 16, sequences.iter());
    assert_eq!(pool.len(), 7 * 16 * 16);
    let pool_row = |page: usize, row: usize| &pool[(page * 16 + row) * 16..][..16];
    let key = |sequence: &HostTensor, j: usize| -> Vec<u16> {
        sequence.values[j * 16..][..16].iter().map(|&x| half::encode(DType::F16, x)).collect()
    };
    assert_eq!(pool_row(6, 0), key(&sequences[0], 0));
    assert_eq!(pool_row(5, 1), key(&sequences[0], 17));
    assert_eq!(pool_row(4, 0), key(&sequences[0], 32));
    assert_eq!(pool_row(3, 15), key(&sequences[2], 15));
    // Every other row (spare pages, the rest of page 4) is NaN.
    let holding_keys = pool.chunks(16).filter(|row| row.iter().any(|&bits| bits != 0xFFFF)).count();
    assert_eq!(holding_keys, 33 + 16);
    Ok(())
}

fn run_ragged_case(handle: &Handle, gpu: &Gpu, case: &RaggedCase, random: &mut Random) {
    let (hq, hkv, d, dv) = (case.heads_q, case.heads_kv, case.head_dim, case.head_dim_v);
    let batch = case.lengths.len() as i64;
    let max_q = case.lengths.iter().map(|&(queries, _)| queries).max().expect("a sequence");
    let key_counts: Vec<i64> = case.lengths.iter().map(|&(_, keys)| keys).collect();
    let max_k = *key_counts.iter().max().expect("a sequence");
    assert!(case.packed_q || case.lengths.iter().all(|&(queries, _)| queries == max_q), "{}: dense q", case.name);
    // Each sequence's q, k and v, and its reference as a batch of one.
    let sequences: Vec<[HostTensor; 3]> = case
        .lengths
        .iter()
        .map(|&(queries, keys)| {
            [
                random_rows(random, case.dtype, queries, hq, d),
                random_rows(random, case.dtype, keys, hkv, d),
                random_rows(random, case.dtype, keys, hkv, dv),
            ]
        })
        .collect();
    let (mut want_out, mut want_lse) = (Vec::new(), Vec::new());
    for (&(queries, keys), [q, k, v]) in case.lengths.iter().zip(&sequences) {
        let one =
            Case::new(case.name, case.dtype, [1, hq, hkv, queries, keys, d], case.causal, 0.0, Layout::Bshd, false)
                .head_dim_v(dv);
        let (out, lse) = reference(&Case { window: case.window, ..one }, q, k, v);
        want_out.extend(out);
        want_lse.extend(lse);
    }

    // Dense BSHD q is the sequences' rows one after another, as packed q is;
    // packed q gets 3 rows more, after the last sequence.
    let padding_rows = if case.packed_q { 3 } else { 0 };
    let total_q = case.lengths.iter().map(|&(queries, _)| queries).sum::<i64>() + padding_rows;
    let mut q_values: Vec<f32> = sequences.iter().flat_map(|[q, _, _]| q.values.iter().copied()).collect();
    q_values.extend((0..padding_rows * hq * d).map(|_| random.value(case.dtype)));
    let encode = |values: &[f32]| values.iter().map(|&x| half::encode(case.dtype, x)).collect::<Vec<u16>>();
    let prefix_sums = |count: fn(&(i64, i64)) -> i64| -> Vec<i32> {
        let sums = case.lengths.iter().scan(0, |sum, lengths| {
            *sum += count(lengths) as i32;
            Some(*sum)
        });
        std::iter::once(0).chain(sums).collect()
    };
    let (cu_seqlens_q, cu_seqlens_k) = (prefix_sums(|&(queries, _)| queries), prefix_sums(|&(_, keys)| keys));
    let pages = match case.keys {
        KeyStorage::Packed => None,
        KeyStorage::Paged { page_size } => Some(PageTable::new(&key_counts, page_size)),
    };
    // k and v, and the i32 array that indexes them: cu_seqlens_k or the block table.
    let (k_bits, v_bits, key_index) = match &pages {
        None => {
            let packed =
                |index: usize| sequences.iter().flat_map(|s| s[index].values.iter().copied()).collect::<Vec<_>>();
            (encode(&packed(1)), encode(&packed(2)), cu_seqlens_k.clone())
        }
        Some(pages) => (
            pages.pool(case.dtype, hkv * d, sequences.iter().map(|[_, k, _]| k)),
            pages.pool(case.dtype, hkv * dv, sequences.iter().map(|[_, _, v]| v)),
            pages.entries.clone(),
        ),
    };
    let (q_dev, k_dev, v_dev) = (gpu.upload(&encode(&q_values)), gpu.upload(&k_bits), gpu.upload(&v_bits));
    let seqused_k: Vec<i32> = key_counts.iter().map(|&keys| keys as i32).collect();
    let (cu_seqlens_q_dev, key_index_dev, seqused_k_dev) =
        (gpu.upload(&cu_seqlens_q), gpu.upload(&key_index), gpu.upload(&seqused_k));
    let out_bytes = (total_q * hq * dv * 2) as usize;
    let lse_count = (if case.packed_q { hq * total_q } else { batch * hq * max_q }) as usize;

    for &num_splits in case.num_splits {
        let name = format!("{} num_splits={num_splits}", case.name);
        let (mut out_dev, mut lse_dev) = (gpu.alloc_poisoned(out_bytes), gpu.alloc_poisoned(lse_count * 4));
        let mut builder = ForwardParams::builder()
            .dtype(case.dtype)
            .batch_size(batch as i32)
            .num_heads_q(hq as i32)
            .num_heads_kv(hkv as i32)
            .seqlen_q(max_q as i32)
            .seqlen_k(max_k as i32)
            .head_dim(d as i32)
            .head_dim_v(dv as i32)
            .causal(case.causal)
            .layout(Layout::Bshd)
            .num_splits(num_splits)
            .q(&q_dev)
            .k(&k_dev)
            .v(&v_dev)
            .out(&mut out_dev)
            .lse(&mut lse_dev);
        if let Some((left, right)) = case.window {
            builder = builder.window(left, right);
        }
        if case.packed_q {
            builder = builder.varlen_q(&cu_seqlens_q_dev, total_q as i32);
        }
        builder = match &pages {
            None => builder.varlen_k(&key_index_dev, *cu_seqlens_k.last().expect("batch_size + 1 sums")),
            Some(pages) => builder
                .paged_kv(&key_index_dev, pages.stride, pages.page_size as i32, pages.num_pages as i32)
                .seqused_k(&seqused_k_dev),
        };
        let params = builder.build().expect("valid params");
        // The strides worked out here, not by the builder.
        let packed_strides = |heads: i64, width: i64, rows_per_batch: i64| Strides {
            batch: rows_per_batch * heads * width,
            seq: heads * width,
            head: width,
        };
        let q_rows_per_batch = if case.packed_q { 0 } else { max_q };
        let kv_rows_per_batch = pages.as_ref().map_or(0, |pages| pages.page_size);
        assert_eq!(params.strides(Tensor::Q), packed_strides(hq, d, q_rows_per_batch), "{name}");
        assert_eq!(params.strides(Tensor::Out), packed_strides(hq, dv, q_rows_per_batch), "{name}");
        assert_eq!(params.strides(Tensor::K), packed_strides(hkv, d, kv_rows_per_batch), "{name}");
        assert_eq!(params.strides(Tensor::V), packed_strides(hkv, dv, kv_rows_per_batch), "{name}");
        let mut workspace = gpu.alloc_poisoned(handle.workspace_size(&params).expect("workspace size"));
        // SAFETY: live allocations of the stated sizes, synchronized before they are read or freed.
        unsafe { handle.forward(&params, Some(&mut workspace), std::ptr::null_mut()) }.expect("forward");
        gpu.synchronize();

        let out_bits: Vec<u16> = gpu.download(&out_dev);
        let lse: Vec<f32> = gpu.download(&lse_dev);
        let (mut got_out, mut got_lse) = (Vec::new(), Vec::new());
        for (b, (&(queries, _), &first_row)) in case.lengths.iter().zip(&cu_seqlens_q).enumerate() {
            let (b, first_row) = (b as i64, i64::from(first_row));
            for h in 0..hq {
                for i in 0..queries {
                    let row = ((first_row + i) * hq + h) * dv;
                    got_out
                        .extend((row..row + dv).map(|at| f64::from(half::decode(case.dtype, out_bits[at as usize]))));
                    let lse_at = if case.packed_q { h * total_q + first_row + i } else { (b * hq + h) * max_q + i };
                    got_lse.push(f64::from(lse[lse_at as usize]));
                }
            }
        }
        let (atol, rtol) = if case.dtype == DType::BF16 { (3e-2, 1e-2) } else { (4e-3, 4e-3) };
        let (out_ratio, out_at, got, want) = worst(got_out.into_iter(), &want_out, atol, rtol);
        println!("{name}: worst out error {out_ratio:.3} of tolerance (got {got}, want {want} at {out_at})");
        assert!(out_ratio <= 1.0, "{name}: out[{out_at}] = {got}, reference {want}");
        let (lse_ratio, lse_at, got, want) = worst(got_lse.into_iter(), &want_lse, 2e-3, 1e-4);
        println!("{name}: worst lse error {lse_ratio:.3} of tolerance");
        assert!(lse_ratio <= 1.0, "{name}: lse[{lse_at}] = {got}, reference {want}");
        let padding = &out_bits[((total_q - padding_rows) * hq * dv) as usize..];
        assert!(padding.iter().all(|&bits| bits == 0xFFFF), "{name}: rows of out after the last sequence were written");
    }
}

fn varlen_and_paged_match_cpu_reference() -> Outcome {
    let (handle, gpu) = setup()?;
    let pairs = flashcore::supported_head_dims().expect("supported head dims");
    let mut random = Random(0xBB67_AE85_84CA_A73B);
    for case in &RAGGED_CASES {
        if !has_kernel_for(&pairs, case.name, case.head_dim, case.head_dim_v) {
            continue;
        }
        run_ragged_case(&handle, gpu, case, &mut random);
    }
    Ok(())
}

/// Device memory holding `values` in `dtype` (which must hold them exactly).
fn upload_as<'g>(gpu: &'g Gpu, dtype: DType, values: &[f32]) -> cuda::DeviceMemory<'g> {
    if dtype == DType::F32 {
        gpu.upload(values)
    } else {
        gpu.upload(&values.iter().map(|&x| half::encode(dtype, x)).collect::<Vec<u16>>())
    }
}

/// The contents of `memory`, elements of `dtype`, as f32.
fn download_as(gpu: &Gpu, dtype: DType, memory: &cuda::DeviceMemory<'_>) -> Vec<f32> {
    if dtype == DType::F32 {
        gpu.download(memory)
    } else {
        gpu.download::<u16>(memory).iter().map(|&b| half::decode(dtype, b)).collect()
    }
}

struct MergeCase {
    partial: DType,
    out: DType,
    states: i64,
    layout: Layout,
    /// One state sees no key at all (its lse is -inf everywhere).
    empty_state: bool,
    /// partial_lse stored as [B, H, S, K] (given through explicit strides).
    interleaved_lse: bool,
}

/// Merges random partial results (a wide spread of lse, some rows -inf in
/// every state) on the GPU and checks out and lse against an f64 merge.
fn run_merge(handle: &Handle, gpu: &Gpu, case: &MergeCase, random: &mut Random) {
    // 136 columns take a lane two passes of 128 (and leave most lanes idle in the second).
    let width = if case.states == 2 { 136 } else { 64 };
    let (k, batch, heads, seqlen) = (case.states, 2i64, 3i64, 37i64);
    let name = format!(
        "merge {:?} -> {:?}, {k} states, head_dim {width}, {:?}{}{}",
        case.partial,
        case.out,
        case.layout,
        if case.empty_state { ", one state sees no key" } else { "" },
        if case.interleaved_lse { ", lse as [B, H, S, K]" } else { "" }
    );
    let rows = dense_strides(case.layout, heads, seqlen, width);
    let state_stride = batch * rows.batch;
    let partial: Vec<f32> = (0..k * state_stride).map(|_| random.value(case.partial)).collect();
    let partial_at = |s: i64, b: i64, h: i64, i: i64, d: i64| {
        f64::from(partial[(s * state_stride + b * rows.batch + h * rows.head + i * rows.seq + d) as usize])
    };
    let lse_strides = if case.interleaved_lse {
        StateStrides { state: 1, batch: heads * seqlen * k, seq: k, head: seqlen * k }
    } else {
        StateStrides { state: batch * heads * seqlen, batch: heads * seqlen, seq: 1, head: seqlen }
    };
    let lse_index = |s: i64, b: i64, h: i64, i: i64| {
        (s * lse_strides.state + b * lse_strides.batch + h * lse_strides.head + i * lse_strides.seq) as usize
    };
    let mut partial_lse = vec![0.0f32; (k * batch * heads * seqlen) as usize];
    for s in 0..k {
        for b in 0..batch {
            for h in 0..heads {
                for i in 0..seqlen {
                    let no_key = (b == 0 && h == 0 && i < 3) || (case.empty_state && s == k / 2);
                    partial_lse[lse_index(s, b, h, i)] =
                        if no_key { f32::NEG_INFINITY } else { 3.0 * random.value(DType::F32) + 1.0 };
                }
            }
        }
    }

    // The f64 merge, in [batch, head, position, d] order.
    let (mut want_out, mut want_lse) = (Vec::new(), Vec::new());
    for b in 0..batch {
        for h in 0..heads {
            for i in 0..seqlen {
                let lses: Vec<f64> = (0..k).map(|s| f64::from(partial_lse[lse_index(s, b, h, i)])).collect();
                let max = lses.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let lse = if max == f64::NEG_INFINITY {
                    max
                } else {
                    max + lses.iter().map(|l| (l - max).exp()).sum::<f64>().ln()
                };
                want_lse.push(lse);
                for d in 0..width {
                    let merged = (0..k)
                        .filter(|&s| lses[s as usize] > f64::NEG_INFINITY)
                        .map(|s| (lses[s as usize] - lse).exp() * partial_at(s, b, h, i, d))
                        .sum::<f64>();
                    want_out.push(merged);
                }
            }
        }
    }

    let partial_dev = upload_as(gpu, case.partial, &partial);
    let partial_lse_dev = gpu.upload(&partial_lse);
    let rows_count = (batch * heads * seqlen) as usize;
    let mut out_dev = gpu.alloc_poisoned(rows_count * width as usize * case.out.size_of());
    let mut lse_dev = gpu.alloc_poisoned(rows_count * 4);
    let mut builder = MergeParams::builder()
        .num_states(k as i32)
        .batch_size(batch as i32)
        .num_heads(heads as i32)
        .seqlen(seqlen as i32)
        .head_dim(width as i32)
        .partial_dtype(case.partial)
        .out_dtype(case.out)
        .layout(case.layout)
        .partial_out(&partial_dev)
        .partial_lse(&partial_lse_dev)
        .out(&mut out_dev)
        .lse(&mut lse_dev);
    if case.interleaved_lse {
        builder = builder.partial_lse_strides(lse_strides);
    }
    let params = builder.build().expect("valid merge params");
    assert_eq!(params.partial_lse_strides(), lse_strides, "{name}");
    // SAFETY: live allocations of the stated sizes, synchronized before they are read or freed.
    unsafe { handle.merge_states(&params, std::ptr::null_mut()) }.expect("merge_states");
    gpu.synchronize();

    let out = download_as(gpu, case.out, &out_dev);
    let got_out = (0..batch).flat_map(|b| {
        let out = &out;
        (0..heads).flat_map(move |h| {
            (0..seqlen).flat_map(move |i| {
                (0..width).map(move |d| f64::from(out[(b * rows.batch + h * rows.head + i * rows.seq + d) as usize]))
            })
        })
    });
    // Only the final rounding to out's dtype and f32 arithmetic: half an ulp, and a little.
    let (atol, rtol) = match case.out {
        DType::BF16 => (1e-3, 4e-3),
        DType::F16 => (1e-4, 5e-4),
        _ => (1e-5, 1e-5),
    };
    let (out_ratio, out_at, got, want) = worst(got_out, &want_out, atol, rtol);
    println!("{name}: worst out error {out_ratio:.3} of tolerance (got {got}, want {want} at {out_at})");
    assert!(out_ratio <= 1.0, "{name}: out[{out_at}] = {got}, reference {want}");
    let lse: Vec<f32> = gpu.download(&lse_dev);
    let (lse_ratio, lse_at, got, want) = worst(lse.iter().map(|&x| f64::from(x)), &want_lse, 1e-4, 1e-5);
    println!("{name}: worst lse error {lse_ratio:.3} of tolerance");
    assert!(lse_ratio <= 1.0, "{name}: lse[{lse_at}] = {got}, reference {want}");
    for (row, &want) in want_lse.iter().enumerate() {
        if want == f64::NEG_INFINITY {
            let zeros = out_zero_row(&out, row, rows, heads, seqlen, width);
            assert!(zeros, "{name}: row {row} that no state sees must be 0");
        }
    }
}

/// Whether merged row `row` (in [batch, head, position] order) is all zeros.
fn out_zero_row(out: &[f32], row: usize, rows: Strides, heads: i64, seqlen: i64, width: i64) -> bool {
    let row = row as i64;
    let (b, h, i) = (row / (heads * seqlen), row / seqlen % heads, row % seqlen);
    (0..width).all(|d| out[(b * rows.batch + h * rows.head + i * rows.seq + d) as usize] == 0.0)
}

fn merge_states_matches_cpu_reference() -> Outcome {
    let (handle, gpu) = setup()?;
    let mut random = Random(0x1234_5678_9ABC_DEF1);
    for (partial, out) in [
        (DType::F16, DType::F16),
        (DType::BF16, DType::BF16),
        (DType::F32, DType::F32),
        (DType::F16, DType::F32),
        (DType::F32, DType::BF16),
    ] {
        for (index, states) in [1, 2, 3, 5].into_iter().enumerate() {
            for empty_state in [false, true] {
                let case = MergeCase {
                    partial,
                    out,
                    states,
                    layout: if index % 2 == 0 { Layout::Bhsd } else { Layout::Bshd },
                    empty_state,
                    interleaved_lse: states == 3,
                };
                run_merge(&handle, gpu, &case, &mut random);
            }
        }
    }
    Ok(())
}

fn merge_states_refusals_come_from_the_library() -> Outcome {
    let (handle, gpu) = setup()?;
    let partial = gpu.alloc_poisoned(2 * 4 * 16 * 64 * 2);
    let partial_lse = gpu.alloc_poisoned(2 * 4 * 16 * 4);
    let mut out = gpu.alloc_poisoned(4 * 16 * 64 * 2);
    let shifted = RawBuffer::new(partial.device_ptr() + 8, partial.byte_len() - 8);
    type Edit = for<'a> fn(flashcore::MergeParamsBuilder<'a>, &'a RawBuffer) -> flashcore::MergeParamsBuilder<'a>;
    let cases: [(&str, Edit, Status); 5] = [
        ("0 states", |b, _| b.num_states(0), Status::InvalidArgument),
        ("head_dim 60", |b, _| b.head_dim(60), Status::Unsupported),
        ("misaligned partial_out", |b, shifted| b.partial_out(shifted).num_states(1), Status::Misaligned),
        (
            "partial stride not a multiple of 8",
            |b, _| b.partial_out_strides(StateStrides { state: 16 * 64, batch: 0, seq: 68, head: 0 }).num_states(1),
            Status::Misaligned,
        ),
        ("negative seqlen", |b, _| b.seqlen(-1), Status::InvalidArgument),
    ];
    for (what, edit, expected) in cases {
        let builder = MergeParams::builder()
            .num_states(2)
            .batch_size(1)
            .num_heads(4)
            .seqlen(16)
            .head_dim(64)
            .partial_out(&partial)
            .partial_lse(&partial_lse)
            .out(&mut out);
        let params = edit(builder, &shifted).build().expect("the builder leaves these to the library");
        // SAFETY: rejected before any work is queued (and the buffers are live anyway).
        let err = unsafe { handle.merge_states(&params, std::ptr::null_mut()) }.expect_err(what);
        if what == "head_dim 60" {
            // Not a multiple of 8: the header names no one status for it.
            assert!(matches!(err.status(), Status::Unsupported | Status::InvalidArgument | Status::Misaligned));
        } else {
            assert_eq!(err.status(), expected, "{what}: {err}");
        }
        assert!(!err.message().is_empty(), "{what}: the library explains");
    }
    gpu.synchronize();
    assert!(gpu.download::<u16>(&out).iter().all(|&bits| bits == 0xFFFF), "a refused merge wrote to out");
    Ok(())
}

/// Attention over keys [0, split) and [split, Sk), each forward call writing
/// its out and lse into one state of the partial buffers, merged, is
/// attention over all keys: checked against the same f64 reference as a
/// single call.
fn two_halves_merged_match_attention_over_all_keys() -> Outcome {
    let (handle, gpu) = setup()?;
    for (dtype, split) in [(DType::F16, 123), (DType::BF16, 1)] {
        let case = Case::new("halves", dtype, [2, 8, 2, 37, 300, 64], false, 0.0, Layout::Bhsd, false);
        let name = format!("{dtype:?} keys split at {split} of {}", case.seqlen_k);
        let mut random = Random(0x0DDB_1A5E_5BAD_5EED ^ split as u64);
        let q = random.tensor(&case, case.heads_q, case.seqlen_q, case.head_dim);
        let k = random.tensor(&case, case.heads_kv, case.seqlen_k, case.head_dim);
        let v = random.tensor(&case, case.heads_kv, case.seqlen_k, case.head_dim_v);
        let encode = |t: &HostTensor| t.values.iter().map(|&x| half::encode(dtype, x)).collect::<Vec<u16>>();
        let (q_dev, k_dev, v_dev) = (gpu.upload(&encode(&q)), gpu.upload(&encode(&k)), gpu.upload(&encode(&v)));
        let rows = (case.batch * case.heads_q * case.seqlen_q) as usize;
        let state_bytes = rows * case.head_dim_v as usize * 2;
        let partial_dev = gpu.alloc_poisoned(2 * state_bytes);
        let partial_lse_dev = gpu.alloc_poisoned(2 * rows * 4);

        for (state, (start, len)) in [(0, split), (split, case.seqlen_k - split)].into_iter().enumerate() {
            // The keys and values [start, start + len) of every head: views of k and v.
            let skip_bytes = (start * case.head_dim * 2) as u64;
            let view = |m: &cuda::DeviceMemory<'_>| {
                RawBuffer::new(m.device_ptr() + skip_bytes, m.byte_len() - skip_bytes as usize)
            };
            let (k_part, v_part) = (view(&k_dev), view(&v_dev));
            let mut out_part = RawBuffer::new(partial_dev.device_ptr() + (state * state_bytes) as u64, state_bytes);
            let mut lse_part = RawBuffer::new(partial_lse_dev.device_ptr() + (state * rows * 4) as u64, rows * 4);
            let params = ForwardParams::builder()
                .dtype(dtype)
                .batch_size(case.batch as i32)
                .num_heads_q(case.heads_q as i32)
                .num_heads_kv(case.heads_kv as i32)
                .seqlen_q(case.seqlen_q as i32)
                .seqlen_k(len as i32)
                .head_dim(case.head_dim as i32)
                .strides(Tensor::K, k.strides)
                .strides(Tensor::V, v.strides)
                .q(&q_dev)
                .k(&k_part)
                .v(&v_part)
                .out(&mut out_part)
                .lse(&mut lse_part)
                .build()
                .expect("valid params");
            let mut workspace = gpu.alloc_poisoned(handle.workspace_size(&params).expect("workspace size"));
            // SAFETY: views of live allocations, synchronized before they are read or freed.
            unsafe { handle.forward(&params, Some(&mut workspace), std::ptr::null_mut()) }.expect("forward");
            gpu.synchronize();
        }

        let (mut out_dev, mut lse_dev) = (gpu.alloc_poisoned(state_bytes), gpu.alloc_poisoned(rows * 4));
        let params = MergeParams::builder()
            .num_states(2)
            .batch_size(case.batch as i32)
            .num_heads(case.heads_q as i32)
            .seqlen(case.seqlen_q as i32)
            .head_dim(case.head_dim_v as i32)
            .partial_dtype(dtype)
            .partial_out(&partial_dev)
            .partial_lse(&partial_lse_dev)
            .out(&mut out_dev)
            .lse(&mut lse_dev)
            .build()
            .expect("valid merge params");
        // SAFETY: live allocations, synchronized before they are read or freed.
        unsafe { handle.merge_states(&params, std::ptr::null_mut()) }.expect("merge_states");
        gpu.synchronize();

        let (want_out, want_lse) = reference(&case, &q, &k, &v);
        let out = download_as(gpu, dtype, &out_dev);
        let (atol, rtol) = if dtype == DType::BF16 { (3e-2, 1e-2) } else { (4e-3, 4e-3) };
        let (out_ratio, out_at, got, want) = worst(out.iter().map(|&x| f64::from(x)), &want_out, atol, rtol);
        println!("{name}: worst out error {out_ratio:.3} of tolerance");
        assert!(out_ratio <= 1.0, "{name}: out[{out_at}] = {got}, reference {want}");
        let lse: Vec<f32> = gpu.download(&lse_dev);
        let (lse_ratio, lse_at, got, want) = worst(lse.iter().map(|&x| f64::from(x)), &want_lse, 2e-3, 1e-4);
        println!("{name}: worst lse error {lse_ratio:.3} of tolerance");
        assert!(lse_ratio <= 1.0, "{name}: lse[{lse_at}] = {got}, reference {want}");
    }
    Ok(())
}
