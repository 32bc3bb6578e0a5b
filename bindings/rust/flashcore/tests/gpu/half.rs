//! fp16 and bf16 encoding for the test data, without a half-precision crate,
//! and the values of fp8 e4m3 elements (an fp8 KV cache's). The test only
//! encodes values that both 16-bit formats hold exactly, so encoding needs no
//! rounding and refuses anything else; its fp8 data is made as bits.

use flashcore::DType;

/// The bits of `x` in `dtype`; panics unless `x` is exactly representable.
pub fn encode(dtype: DType, x: f32) -> u16 {
    exact(dtype, x).unwrap_or_else(|| panic!("{x} is not exact in {dtype:?}"))
}

fn exact(dtype: DType, x: f32) -> Option<u16> {
    let bits = match dtype {
        DType::BF16 => bf16_bits(x),
        _ => f16_bits(x),
    };
    (decode(dtype, bits).to_bits() == x.to_bits()).then_some(bits)
}

/// The value of `bits` in `dtype`.
pub fn decode(dtype: DType, bits: u16) -> f32 {
    match dtype {
        DType::BF16 => f32::from_bits(u32::from(bits) << 16),
        _ => f16_value(bits),
    }
}

/// The value of fp8 e4m3 `bits` (CUDA `__nv_fp8_e4m3`, PyTorch
/// `float8_e4m3fn`): sign, 4 exponent bits of bias 7, 3 mantissa bits;
/// subnormals below 2^-6, no infinities, NaN for S.1111.111 only, largest 448.
pub fn e4m3_value(bits: u8) -> f32 {
    let sign = if bits & 0x80 != 0 { -1.0 } else { 1.0 };
    let exponent = i32::from((bits >> 3) & 0xF);
    let mantissa = f32::from(bits & 0x7);
    match exponent {
        0 => sign * mantissa * 2f32.powi(-9),
        15 if mantissa == 7.0 => f32::NAN,
        _ => sign * (8.0 + mantissa) * 2f32.powi(exponent - 10),
    }
}

/// The e4m3 bits nearest to `x` (ties to the even code, i.e. mantissa's
/// last bit 0, as CUDA's `__nv_cvt_float_to_fp8(x, __NV_SATFINITE,
/// __NV_E4M3)`); beyond ±448 saturates to ±448, as that conversion does.
/// `x` must not be NaN.
pub fn e4m3_bits(x: f32) -> u8 {
    assert!(!x.is_nan(), "NaN has no e4m3 code here");
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    let magnitude = x.abs();
    // Codes 0 to 0x7E are the non-negative finite values, in increasing
    // order: find the first at least `magnitude` (0x7F: none).
    let (mut above, mut end) = (0u8, 0x7Fu8);
    while above < end {
        let middle = (above + end) / 2;
        if e4m3_value(middle) < magnitude {
            above = middle + 1;
        } else {
            end = middle;
        }
    }
    let code = match above {
        0 => 0,
        0x7F => 0x7E,
        _ => {
            let (low, high) = (above - 1, above);
            // In f64 the differences are exact, so ties are seen as ties.
            let distance = |code: u8| (f64::from(magnitude) - f64::from(e4m3_value(code))).abs();
            let (to_low, to_high) = (distance(low), distance(high));
            if to_low < to_high || (to_low == to_high && low % 2 == 0) {
                low
            } else {
                high
            }
        }
    };
    sign | code
}

fn bf16_bits(x: f32) -> u16 {
    (x.to_bits() >> 16) as u16
}

fn f16_bits(x: f32) -> u16 {
    let bits = x.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    if x == 0.0 {
        return sign;
    }
    let exponent = ((bits >> 23) & 0xFF) as i32 - 127 + 15;
    let mantissa = bits & 0x7F_FFFF;
    if !(1..31).contains(&exponent) {
        return 0x7E00; // not a normal fp16 number: NaN, which `encode` rejects
    }
    sign | ((exponent as u16) << 10) | (mantissa >> 13) as u16
}

fn f16_value(bits: u16) -> f32 {
    let sign = if bits & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exponent = i32::from((bits >> 10) & 0x1F);
    let mantissa = f32::from(bits & 0x3FF);
    match exponent {
        0 => sign * mantissa * 2f32.powi(-24),
        31 if mantissa == 0.0 => sign * f32::INFINITY,
        31 => f32::NAN,
        _ => sign * (1024.0 + mantissa) * 2f32.powi(exponent - 25),
    }
}

#[test]
fn fp16_and_bf16_encodings() {
    for (x, fp16, bf16) in [(1.0, 0x3C00, 0x3F80), (-2.0, 0xC000, 0xC000), (0.5, 0x3800, 0x3F00), (0.0, 0, 0)] {
        assert_eq!(encode(DType::F16, x), fp16, "{x}");
        assert_eq!(encode(DType::BF16, x), bf16, "{x}");
    }
    assert_eq!(encode(DType::F16, 65504.0), 0x7BFF);
    assert_eq!(decode(DType::F16, 0x0001), 2f32.powi(-24));
    assert_eq!(decode(DType::F16, 0xFC00), f32::NEG_INFINITY);
    assert!(decode(DType::F16, 0xFFFF).is_nan() && decode(DType::BF16, 0xFFFF).is_nan());
    assert_eq!(exact(DType::F16, 1.0 + 2f32.powi(-12)), None);
    assert_eq!(exact(DType::F16, 2f32.powi(-20)), None); // subnormal: not needed, refused
    assert_eq!(exact(DType::BF16, 1.0 + 2f32.powi(-9)), None);
}
