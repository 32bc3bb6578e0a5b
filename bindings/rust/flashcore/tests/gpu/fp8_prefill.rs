//! Forward calls with fp8 (e4m3) queries, keys and values and a bf16 output
//! (fp8 prefill, FlashAttention 3's e4m3 forward), on compute capability 9.0
//! GPUs: random inputs quantized per tensor as an inference engine would
//! (one descale factor each for q, k and v), checked against the f64
//! reference of the dequantized inputs (each element's value times its
//! tensor's factor, exact in f32 by construction).
//!
//! The reference sees the inputs the kernel sees, so what remains is the
//! kernel's own rounding, mostly of the probabilities P, which go through
//! the P·V product as e4m3 as in FlashAttention 3 (3 mantissa bits, up to
//! 6% off each), and of out to bf16. The bar is on the relative L2 error
//! of each call's whole output: [`REL_L2_BAR`].
//!
//! Elsewhere the library must refuse these calls ([`Status::Unsupported`]),
//! and the test reports itself ignored, with the library's reason; so it
//! does on a compute capability 9.0 GPU where the library predates fp8
//! queries or was built without the sm_90a kernels. The inputs are fresh
//! for each run (seeded from the clock, the seed printed);
//! `FLASHCORE_TEST_SEED=<seed>` repeats a run.

use crate::cuda::Gpu;
use crate::fp8::fresh_seed;
use crate::harness::{Outcome, Skip};
use crate::{dense_strides, half, reference, setup, Case, HostTensor, Random};
use flashcore::{DType, DescaleStrides, Handle, Layout, Status, Tensor};

/// Largest ‖out − reference‖₂ / ‖reference‖₂ of a call (each call's whole
/// output): e4m3 probabilities (and inputs, whose rounding the reference
/// shares) leave a few percent.
const REL_L2_BAR: f64 = 0.05;

/// Largest |lse − reference| (natural log units): lse comes from the f32
/// scores of the e4m3 inputs, not from the rounded probabilities, so it is
/// far closer than this; the bar is there to catch wrong units or scales.
const LSE_BAR: f64 = 0.05;

/// Head dim 128 (a pair of the fp8 kernels), causal and not, grouped-query
/// heads, both layouts, seqlens that are no multiple of a tile, and
/// split-KV. Each case's dtype is q's, k's and v's: [`DType::F8E4M3`].
const FP8_PREFILL_CASES: [Case; 3] = [
    Case::new(
        "fp8 prefill B=2 Hq=4 Hkv=2 S=257 D=128 causal, BSHD",
        DType::F8E4M3,
        [2, 4, 2, 257, 257, 128],
        true,
        0.0,
        Layout::Bshd,
        false,
    ),
    Case::new(
        "fp8 prefill B=1 H=4 Sq=200 Sk=333 D=128 scale=0.05, BHSD",
        DType::F8E4M3,
        [1, 4, 4, 200, 333, 128],
        false,
        0.05,
        Layout::Bhsd,
        false,
    ),
    Case::new(
        "fp8 prefill B=2 Hq=8 Hkv=1 Sq=130 Sk=300 D=128 causal, BSHD, own stream",
        DType::F8E4M3,
        [2, 8, 1, 130, 300, 128],
        true,
        0.0,
        Layout::Bshd,
        true,
    )
    .num_splits(&[0, 3]),
];

impl Random {
    /// Uniform in [0, 1), 53 random bits.
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Standard normal (Box-Muller).
    fn normal(&mut self) -> f64 {
        let (u, v) = (1.0 - self.unit(), self.unit());
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }
}

/// The per-tensor descale factor for values up to `amax`: at least
/// amax / 448 (448 is e4m3's largest), so no element saturates, with a
/// significand of 8 bits at most, so that each dequantized element (an
/// e4m3 value, 4 bits, times the factor) is exact in f32.
fn descale_for(amax: f64) -> f32 {
    assert!(amax > 0.0 && amax.is_finite(), "amax {amax}");
    let ideal = amax / 448.0;
    let step = 2f64.powi(ideal.log2().floor() as i32 - 7);
    ((ideal / step).ceil() * step) as f32
}

/// A tensor quantized per tensor: its e4m3 elements, its descale factor and
/// its dequantized values (the elements times the factor).
struct Quantized {
    bits: Vec<u8>,
    descale: f32,
    dequantized: HostTensor,
}

/// `values` quantized as FlashAttention 3's users do: divided by the
/// tensor's factor, rounded to the nearest e4m3.
fn quantize(values: &[f64], strides: flashcore::Strides) -> Quantized {
    let amax = values.iter().fold(0.0f64, |amax, x| amax.max(x.abs()));
    let descale = descale_for(amax);
    let bits: Vec<u8> = values.iter().map(|&x| half::e4m3_bits((x / f64::from(descale)) as f32)).collect();
    let dequantized = bits
        .iter()
        .map(|&b| {
            let (value, product) = (half::e4m3_value(b), half::e4m3_value(b) * descale);
            assert_eq!(f64::from(product), f64::from(value) * f64::from(descale), "inexact dequantized value");
            product
        })
        .collect();
    Quantized { bits, descale, dequantized: HostTensor { values: dequantized, strides } }
}

/// Random normal values of a `[batch, heads, seqlen, width]` tensor of the
/// case's layout, quantized.
fn random_quantized(random: &mut Random, case: &Case, heads: i64, seqlen: i64, width: i64) -> Quantized {
    let values: Vec<f64> = (0..case.batch * heads * seqlen * width).map(|_| random.normal()).collect();
    quantize(&values, dense_strides(case.layout, heads, seqlen, width))
}

/// ‖got − want‖₂ / ‖want‖₂; NaN (and so never under a bar) if got holds one.
fn relative_l2(got: &[f64], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    let error: f64 = got.iter().zip(want).map(|(g, w)| (g - w) * (g - w)).sum();
    let norm: f64 = want.iter().map(|w| w * w).sum();
    (error / norm).sqrt()
}

/// Runs `case` with each of its num_splits against one reference. Returns
/// the library's refusal, if it refuses; panics where results are wrong.
fn run_fp8_prefill_case(handle: &Handle, gpu: &Gpu, case: &Case, random: &mut Random) -> flashcore::Result<()> {
    let (hq, hkv, d, dv) = (case.heads_q, case.heads_kv, case.head_dim, case.head_dim_v);
    let q = random_quantized(random, case, hq, case.seqlen_q, d);
    let k = random_quantized(random, case, hkv, case.seqlen_k, d);
    let v = random_quantized(random, case, hkv, case.seqlen_k, dv);
    let (want_out, want_lse) = reference(case, &q.dequantized, &k.dequantized, &v.dequantized);

    let (q_dev, k_dev, v_dev) = (gpu.upload(&q.bits), gpu.upload(&k.bits), gpu.upload(&v.bits));
    let descales = [gpu.upload(&[q.descale]), gpu.upload(&[k.descale]), gpu.upload(&[v.descale])];
    let out_strides = dense_strides(case.layout, hq, case.seqlen_q, dv);
    let rows = (case.batch * hq * case.seqlen_q) as usize;
    let stream = case.own_stream.then(|| gpu.stream());
    let stream_raw = stream.as_ref().map_or(std::ptr::null_mut(), |s| s.raw);

    for &num_splits in case.num_splits {
        let name = format!("{} num_splits={num_splits}", case.name);
        // bf16 out, two bytes an element where q has one; NaN everywhere
        // (0xFF bytes) until the call writes it.
        let (mut out_dev, mut lse_dev) = (gpu.alloc_poisoned(rows * dv as usize * 2), gpu.alloc_poisoned(rows * 4));
        let params = crate::builder(case, [&q_dev, &k_dev, &v_dev], &mut out_dev)
            .q_descale(&descales[0], DescaleStrides::PER_TENSOR)
            .k_descale(&descales[1], DescaleStrides::PER_TENSOR)
            .v_descale(&descales[2], DescaleStrides::PER_TENSOR)
            .num_splits(num_splits)
            .lse(&mut lse_dev)
            .build()?;
        assert_eq!((params.kv_dtype(), params.out_dtype()), (DType::F8E4M3, DType::BF16), "{name}");
        for (tensor, strides) in [
            (Tensor::Q, q.dequantized.strides),
            (Tensor::K, k.dequantized.strides),
            (Tensor::V, v.dequantized.strides),
            (Tensor::Out, out_strides),
        ] {
            assert_eq!(params.strides(tensor), strides, "{name}: library strides for {tensor:?}");
        }
        let mut workspace = gpu.alloc_poisoned(handle.workspace_size(&params)?);
        // SAFETY: live allocations of the stated sizes, synchronized before they are read or freed.
        unsafe { handle.forward(&params, Some(&mut workspace), stream_raw) }?;
        match &stream {
            Some(stream) => stream.synchronize(),
            None => gpu.synchronize(),
        }

        let out = HostTensor {
            values: gpu.download::<u16>(&out_dev).iter().map(|&b| half::decode(DType::BF16, b)).collect(),
            strides: out_strides,
        };
        let got: Vec<f64> = (0..case.batch)
            .flat_map(|b| {
                let out = &out;
                (0..hq)
                    .flat_map(move |h| (0..case.seqlen_q).flat_map(move |i| (0..dv).map(move |c| out.at(b, h, i, c))))
            })
            .collect();
        let unwritten = got.iter().filter(|x| !x.is_finite()).count();
        assert_eq!(unwritten, 0, "{name}: {unwritten} of {} output elements not finite (still poisoned?)", got.len());
        let error = relative_l2(&got, &want_out);
        println!("{name}: relative L2 error of out {error:.5} (bar {REL_L2_BAR})");
        assert!(error <= REL_L2_BAR, "{name}: relative L2 error of out {error} over {REL_L2_BAR}");

        let lse: Vec<f32> = gpu.download(&lse_dev);
        let (mut worst, mut worst_at) = (0.0f64, 0);
        for (at, (&got, &want)) in lse.iter().zip(&want_lse).enumerate() {
            let got = f64::from(got);
            let off = if want.is_infinite() && got == want { 0.0 } else { (got - want).abs() };
            if off.is_nan() || off > worst {
                (worst, worst_at) = (if off.is_nan() { f64::INFINITY } else { off }, at);
            }
        }
        println!("{name}: worst lse error {worst:.2e} (bar {LSE_BAR})");
        assert!(worst <= LSE_BAR, "{name}: lse[{worst_at}] = {}, reference {}", lse[worst_at], want_lse[worst_at]);
    }
    Ok(())
}

pub fn fp8_prefill_matches_cpu_reference() -> Outcome {
    let (handle, gpu) = setup()?;
    let (major, minor) = gpu.compute_capability;
    let pairs = flashcore::supported_head_dims().expect("supported head dims");
    if !pairs.contains(&(128, 128)) {
        return Err(Skip(format!("this build has no (128, 128) kernel, which fp8 queries need: {pairs:?}")));
    }
    let seed = fresh_seed();
    println!("fp8 prefill inputs from seed {seed} (FLASHCORE_TEST_SEED={seed} repeats them)");
    let mut random = Random(seed);
    for (index, case) in FP8_PREFILL_CASES.iter().enumerate() {
        let refused = match run_fp8_prefill_case(&handle, gpu, case, &mut random) {
            Ok(()) => {
                assert_eq!(
                    (major, minor),
                    (9, 0),
                    "{}: fp8 queries ran on compute capability {major}.{minor}, which the library must refuse",
                    case.name
                );
                continue;
            }
            Err(err) => err,
        };
        assert_eq!(refused.status(), Status::Unsupported, "{}: {refused}", case.name);
        assert_eq!(index, 0, "{}: refused after an earlier case ran: {refused}", case.name);
        if (major, minor) != (9, 0) {
            return Err(Skip(format!(
                "fp8 queries run on compute capability 9.0 only; this GPU is {major}.{minor} (flashcore: {})",
                refused.message()
            )));
        }
        // On sm_90 only a library that has no fp8 queries may refuse: one
        // from before them, or one built without the sm_90a kernels.
        let message = refused.message();
        assert!(
            message.contains("not supported yet") || message.contains("built without"),
            "{}: fp8 queries refused on compute capability 9.0: {refused}",
            case.name
        );
        return Err(Skip(format!("this library has no fp8 queries on this GPU: {message}")));
    }
    Ok(())
}

/// The test's quantization, against the format (runs without a GPU): every
/// finite code is its own nearest, ties between neighbours go to the even
/// code, what lies beyond ±448 saturates, each value's code is the nearest
/// of all, and the per-tensor factors make exact dequantized values.
pub fn e4m3_quantization_rounds_to_nearest_even() -> Outcome {
    for bits in (0..=255u8).filter(|&bits| !half::e4m3_value(bits).is_nan()) {
        let value = half::e4m3_value(bits);
        assert_eq!(half::e4m3_bits(value), bits, "{value}");
    }
    for (x, bits) in [
        (1.0 + 1.0 / 16.0, 0x38),        // halfway between 1 (0x38) and 1.125 (0x39): even
        (1.125 + 1.0 / 16.0, 0x3A),      // halfway between 1.125 (0x39) and 1.25 (0x3A): even
        (1.0 + 1.0 / 16.0 + 1e-6, 0x39), // just past halfway
        (1.0 / 1024.0, 0x00),            // halfway between 0 and 2^-9: 0
        (3.0 / 1024.0, 0x02),            // halfway between 2^-9 (0x01) and 2^-8 (0x02): even
        (464.0, 0x7E),                   // beyond 448: saturates
        (1e30, 0x7E),
        (-1e30, 0xFE),
        (-0.6, 0xB2), // -0.625 (exponent 6, mantissa 2) is nearer than -0.5625
    ] {
        assert_eq!(half::e4m3_bits(x as f32), bits, "{x}");
    }

    let mut random = Random(fresh_seed());
    let finite: Vec<u8> = (0..=0x7Eu8).collect();
    for _ in 0..10_000 {
        let x = (random.normal() * 100.0) as f32;
        let chosen = half::e4m3_value(half::e4m3_bits(x));
        let nearest = finite.iter().map(|&c| (half::e4m3_value(c) - x.abs()).abs()).fold(f32::INFINITY, f32::min);
        assert_eq!((chosen.abs() - x.abs()).abs(), nearest, "{x}: {chosen}");
        assert_eq!(chosen.is_sign_negative(), x.is_sign_negative(), "{x}: {chosen}");
    }

    let case = Case::new("quantize", DType::F8E4M3, [2, 3, 3, 50, 50, 16], false, 0.0, Layout::Bshd, false);
    for amax in [1e-3, 0.7, 3.999, 448.0, 1e5] {
        let factor = descale_for(amax);
        assert!(f64::from(factor) >= amax / 448.0 && f64::from(factor) < amax / 448.0 * (1.0 + 1.0 / 64.0), "{amax}");
        assert_eq!(factor.to_bits() & 0xFFFF, 0, "{amax}: {factor} has more than 8 significant bits");
    }
    // The largest element lands on 448 (amax / factor is over 441, nearer
    // 448 than 416), so the factor wastes none of e4m3's range.
    let quantized = random_quantized(&mut random, &case, 3, 50, 16);
    assert!(quantized.bits.iter().any(|&b| b & 0x7F == 0x7E), "no element at ±448");
    Ok(())
}
