//! Forward calls over an fp8 (e4m3) KV cache: 16-bit q and out, one-byte k
//! and v with descale factors per (batch, K/V head) or per tensor, checked
//! against the f64 reference of the dequantized keys and values (each
//! element's value times its factor, exact in f32 by construction).
//!
//! The inputs are fresh for each run (seeded from the clock, the seed
//! printed); `FLASHCORE_TEST_SEED=<seed>` repeats a run.

use crate::cuda::Gpu;
use crate::harness::Outcome;
use crate::{builder, check_output, dense_strides, half, has_kernel_for, reference, setup, Case, HostTensor, Random};
use flashcore::{DType, DescaleStrides, Handle, Layout, Tensor};

/// A [`Case`] whose k and v are fp8 e4m3 (its dtype is q's and out's),
/// with k's and v's descale factors where these strides put them.
struct Fp8Case {
    case: Case,
    k_descale: DescaleStrides,
    v_descale: DescaleStrides,
}

/// GQA, causal and not, both layouts, split-KV, a window and a softcap, and
/// (192, 128) head dims; descale arrays in either order, with padding
/// between rows (NaN, which the library must never read), or one factor
/// for the whole tensor.
const FP8_CASES: [Fp8Case; 5] = [
    Fp8Case {
        case: Case::new(
            "bf16 q, fp8 kv B=2 Hq=4 Hkv=2 Sq=130 Sk=173 D=64 causal, BHSD, descales [B, Hkv] and [Hkv, B]",
            DType::BF16,
            [2, 4, 2, 130, 173, 64],
            true,
            0.0,
            Layout::Bhsd,
            false,
        )
        .num_splits(&[0, 1]),
        k_descale: DescaleStrides { batch: 2, head: 1 },
        v_descale: DescaleStrides { batch: 1, head: 2 },
    },
    Fp8Case {
        case: Case::new(
            "bf16 q, fp8 kv decode B=3 Hq=32 Hkv=8 Sq=1 Sk=1000 D=128, BSHD, own stream, descale rows padded to 11",
            DType::BF16,
            [3, 32, 8, 1, 1000, 128],
            false,
            0.0,
            Layout::Bshd,
            true,
        )
        .num_splits(&[1, 0, 3]),
        k_descale: DescaleStrides { batch: 11, head: 1 },
        v_descale: DescaleStrides { batch: 1, head: 5 },
    },
    Fp8Case {
        case: Case::new(
            "bf16 q, fp8 kv B=2 Hq=8 Hkv=2 Sq=150 Sk=200 D=128 causal window (40, 0) scale=2 softcap 30, BSHD",
            DType::BF16,
            [2, 8, 2, 150, 200, 128],
            true,
            2.0,
            Layout::Bshd,
            false,
        )
        .window(40, 0)
        .softcap(30.0)
        .num_splits(&[0, 3]),
        k_descale: DescaleStrides { batch: 2, head: 1 },
        v_descale: DescaleStrides { batch: 2, head: 1 },
    },
    Fp8Case {
        case: Case::new(
            "bf16 q, fp8 kv B=1 H=2 Sq=64 Sk=200 D=192 Dv=128 causal, BHSD",
            DType::BF16,
            [1, 2, 2, 64, 200, 192],
            true,
            0.0,
            Layout::Bhsd,
            false,
        )
        .head_dim_v(128),
        k_descale: DescaleStrides { batch: 2, head: 1 },
        v_descale: DescaleStrides { batch: 2, head: 1 },
    },
    Fp8Case {
        case: Case::new(
            "fp16 q, fp8 kv B=2 H=2 S=100 D=64, BSHD, per-tensor descales",
            DType::F16,
            [2, 2, 2, 100, 100, 64],
            false,
            0.0,
            Layout::Bshd,
            false,
        ),
        k_descale: DescaleStrides::PER_TENSOR,
        v_descale: DescaleStrides::PER_TENSOR,
    },
];

/// The run's seed: `FLASHCORE_TEST_SEED`, else one from the clock.
pub fn fresh_seed() -> u64 {
    if let Ok(seed) = std::env::var("FLASHCORE_TEST_SEED") {
        return seed.parse().unwrap_or_else(|_| panic!("FLASHCORE_TEST_SEED={seed} is not a u64"));
    }
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("the clock is past 1970");
    // Never 0, which xorshift would keep.
    (now.as_nanos() as u64 ^ (u64::from(std::process::id()) << 32)) | 1
}

impl Random {
    /// Random e4m3 bits: 0 one time in 16, else a random sign, exponent
    /// field 4 to 8 and mantissa, i.e. ±(0.125 to 3.75).
    fn e4m3(&mut self) -> u8 {
        let r = self.next() >> 40;
        if r % 16 == 0 {
            return 0;
        }
        let (sign, exponent, mantissa) = ((r >> 4) & 1, 4 + (r >> 5) % 5, (r >> 8) & 7);
        ((sign << 7) | (exponent << 3) | mantissa) as u8
    }

    /// A descale factor in [0.25, 0.75] with an 8-bit significand, so that
    /// its product with an e4m3 value (4 bits) is exact in f32.
    fn descale(&mut self) -> f32 {
        (64 + (self.next() >> 40) % 129) as f32 / 256.0
    }
}

/// An fp8 tensor `[batch, heads_kv, seqlen_k, width]` in the case's layout,
/// its descale factors and its dequantized values.
struct Quantized {
    bits: Vec<u8>,
    /// As the library reads them: factor (b, h) at b * batch + h * head;
    /// every other entry NaN.
    factors: Vec<f32>,
    dequantized: HostTensor,
}

fn quantized(random: &mut Random, case: &Case, width: i64, descale: DescaleStrides) -> Quantized {
    let strides = dense_strides(case.layout, case.heads_kv, case.seqlen_k, width);
    let bits: Vec<u8> = (0..case.batch * case.heads_kv * case.seqlen_k * width).map(|_| random.e4m3()).collect();
    let factor_at = |b: i64, h: i64| (b * descale.batch + h * descale.head) as usize;
    let mut factors = vec![f32::NAN; factor_at(case.batch - 1, case.heads_kv - 1) + 1];
    for b in 0..case.batch {
        for h in 0..case.heads_kv {
            factors[factor_at(b, h)] = random.descale();
        }
    }
    let mut values = vec![f32::NAN; bits.len()];
    for b in 0..case.batch {
        for h in 0..case.heads_kv {
            for j in 0..case.seqlen_k {
                for d in 0..width {
                    let at = (b * strides.batch + h * strides.head + j * strides.seq + d) as usize;
                    let value = half::e4m3_value(bits[at]);
                    let dequantized = value * factors[factor_at(b, h)];
                    assert_eq!(f64::from(dequantized), f64::from(value) * f64::from(factors[factor_at(b, h)]));
                    values[at] = dequantized;
                }
            }
        }
    }
    Quantized { bits, factors, dequantized: HostTensor { values, strides } }
}

fn run_fp8_case(handle: &Handle, gpu: &Gpu, fp8: &Fp8Case, random: &mut Random) {
    let case = &fp8.case;
    let q = random.tensor(case, case.heads_q, case.seqlen_q, case.head_dim);
    let k = quantized(random, case, case.head_dim, fp8.k_descale);
    let v = quantized(random, case, case.head_dim_v, fp8.v_descale);
    let (want_out, want_lse) = reference(case, &q, &k.dequantized, &v.dequantized);

    let q_bits: Vec<u16> = q.values.iter().map(|&x| half::encode(case.dtype, x)).collect();
    let (q_dev, k_dev, v_dev) = (gpu.upload(&q_bits), gpu.upload(&k.bits), gpu.upload(&v.bits));
    let (k_descale_dev, v_descale_dev) = (gpu.upload(&k.factors), gpu.upload(&v.factors));
    let out_strides = dense_strides(case.layout, case.heads_q, case.seqlen_q, case.head_dim_v);
    let rows = (case.batch * case.heads_q * case.seqlen_q) as usize;
    let out_bytes = rows * case.head_dim_v as usize * 2;
    let stream = case.own_stream.then(|| gpu.stream());
    let stream_raw = stream.as_ref().map_or(std::ptr::null_mut(), |s| s.raw);

    for &num_splits in case.num_splits {
        let name = format!("{} num_splits={num_splits}", case.name);
        // NaN everywhere until the call writes it.
        let (mut out_dev, mut lse_dev) = (gpu.alloc_poisoned(out_bytes), gpu.alloc_poisoned(rows * 4));
        let params = builder(case, [&q_dev, &k_dev, &v_dev], &mut out_dev)
            .kv_dtype(DType::F8E4M3)
            .k_descale(&k_descale_dev, fp8.k_descale)
            .v_descale(&v_descale_dev, fp8.v_descale)
            .num_splits(num_splits)
            .lse(&mut lse_dev)
            .build()
            .expect("valid params");
        assert_eq!(params.kv_dtype(), DType::F8E4M3, "{name}");
        for (tensor, strides) in [
            (Tensor::Q, q.strides),
            (Tensor::K, k.dequantized.strides),
            (Tensor::V, v.dequantized.strides),
            (Tensor::Out, out_strides),
        ] {
            assert_eq!(params.strides(tensor), strides, "{name}: library strides for {tensor:?}");
        }
        let mut workspace = gpu.alloc_poisoned(handle.workspace_size(&params).expect("workspace size"));
        // SAFETY: live allocations of the stated sizes, synchronized before they are read or freed.
        unsafe { handle.forward(&params, Some(&mut workspace), stream_raw) }.expect("forward");
        match &stream {
            Some(stream) => stream.synchronize(),
            None => gpu.synchronize(),
        }

        let out_bits: Vec<u16> = gpu.download(&out_dev);
        let lse: Vec<f32> = gpu.download(&lse_dev);
        // As for 16-bit k and v: the dequantized values are exact in dtype
        // before their factor, so only the kernels' own rounding remains.
        check_output(&name, case, &out_bits, out_strides, &lse, &want_out, &want_lse);
    }
}

pub fn fp8_kv_cache_matches_cpu_reference() -> Outcome {
    let (handle, gpu) = setup()?;
    let pairs = flashcore::supported_head_dims().expect("supported head dims");
    let seed = fresh_seed();
    println!("fp8 KV cache inputs from seed {seed} (FLASHCORE_TEST_SEED={seed} repeats them)");
    let mut random = Random(seed);
    for fp8 in &FP8_CASES {
        if has_kernel_for(&pairs, fp8.case.name, fp8.case.head_dim, fp8.case.head_dim_v) {
            run_fp8_case(&handle, gpu, fp8, &mut random);
        }
    }
    Ok(())
}

/// The e4m3 decoding the reference relies on, against values worked out
/// from the format, and the test's random bits and factors: in range, never
/// NaN, and exact products. Runs without a GPU.
pub fn e4m3_values_follow_the_format() -> Outcome {
    for (bits, value) in [
        (0x00, 0.0),
        (0x38, 1.0),   // exponent 7 (bias 7), mantissa 0
        (0xB8, -1.0),  // the sign bit
        (0x3C, 1.5),   // mantissa 4: 1 + 4/8
        (0x40, 2.0),   // exponent 8
        (0x7E, 448.0), // the largest: exponent 15, mantissa 6
        (0xFE, -448.0),
        (0x08, 1.0 / 64.0),  // the smallest normal, 2^-6
        (0x07, 7.0 / 512.0), // the largest subnormal, 7 * 2^-9
        (0x01, 1.0 / 512.0), // the smallest, 2^-9
        (0x20, 0.125),       // exponent 4
        (0x47, 3.75),        // exponent 8, mantissa 7
    ] {
        assert_eq!(half::e4m3_value(bits), value, "bits {bits:#04x}");
    }
    assert_eq!(half::e4m3_value(0x80).to_bits(), (-0.0f32).to_bits());
    assert!(half::e4m3_value(0x7F).is_nan() && half::e4m3_value(0xFF).is_nan());
    let finite = (0..=255u8).filter(|&bits| !half::e4m3_value(bits).is_nan()).count();
    assert_eq!(finite, 254, "NaN is S.1111.111 only");

    let mut random = Random(fresh_seed());
    for _ in 0..10_000 {
        let value = half::e4m3_value(random.e4m3());
        assert!(value == 0.0 || (0.125..=3.75).contains(&value.abs()), "{value}");
        let factor = random.descale();
        assert!((0.25..=0.75).contains(&factor), "{factor}");
        assert_eq!(f64::from(value * factor), f64::from(value) * f64::from(factor));
    }
    Ok(())
}
